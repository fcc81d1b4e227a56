"""A/B of the FP8 KV-cache decoding kernel between source trees (round 30, call 3): run from / with
PYTHONPATH=<tree>; prints one line per row: label, row, median ms (triton do_bench), GB/s of the FP8
cache. `profile` instead runs the first row's call a few times (for ncu)."""
import sys

import torch
from triton.testing import do_bench

import flashattn
from flashattn import flash_attn_with_kvcache

label = sys.argv[1]
ROWS = [(32, 8, 65536, None), (32, 8, 65536, 16), (8, 8, 65536, None), (32, 1, 65536, None), (8, 64, 16384, None)]
D, H = 128, 32
for heads_k, batch, seqlen, page in ROWS:
    gen = torch.Generator(device="cuda").manual_seed(1)
    shape = (batch * seqlen // page, page) if page else (batch, seqlen)
    k, v = ((torch.randn(*shape, heads_k, D, generator=gen, device="cuda") * 2).to(torch.float8_e4m3fn)
            for _ in range(2))
    table = (torch.randperm(batch * seqlen // page, device="cuda").to(torch.int32).reshape(batch, -1)
             if page else None)
    q = torch.randn(batch, 1, H, D, device="cuda", dtype=torch.bfloat16)
    seqlens = torch.full((batch,), seqlen, device="cuda", dtype=torch.int32)
    kd = torch.rand(batch, heads_k, device="cuda") + 0.5

    def call():
        return flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, block_table=table, k_descale=kd, v_descale=kd)

    if label == "profile":
        for _ in range(8):
            call()
        torch.cuda.synchronize()
        break
    ms = do_bench(call, warmup=25, rep=100)
    print(f"{label} Hk={heads_k} B={batch} S={seqlen} page={page}: {ms:.4f} ms {2 * k.numel() / ms / 1e6:.0f} GB/s",
          flush=True)
