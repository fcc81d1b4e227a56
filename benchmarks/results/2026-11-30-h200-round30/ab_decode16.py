"""A/B of the 16-bit decoding kernel between source trees (round 30, call 7: decode_kernel.cuh now
also serves FP8 caches): run from / with PYTHONPATH=<tree>; one line per row: label, row, median ms
(triton do_bench), GB/s of the bf16 cache."""
import sys

import torch
from triton.testing import do_bench

from flashattn import flash_attn_with_kvcache

label = sys.argv[1]
D, H = 128, 32
for heads_k, batch, seqlen, page in [(8, 8, 65536, 16), (8, 8, 65536, 256), (8, 8, 65536, None), (32, 1, 65536, 16),
                                     (32, 8, 16384, 16), (32, 8, 16384, None)]:
    gen = torch.Generator(device="cuda").manual_seed(1)
    shape = (batch * seqlen // page, page) if page else (batch, seqlen)
    k, v = (torch.randn(*shape, heads_k, D, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    table = (torch.randperm(batch * seqlen // page, device="cuda").to(torch.int32).reshape(batch, -1)
             if page else None)
    q = torch.randn(batch, 1, H, D, device="cuda", dtype=torch.bfloat16)
    seqlens = torch.full((batch,), seqlen, device="cuda", dtype=torch.int32)
    ms = do_bench(lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, block_table=table), warmup=25,
                  rep=100)
    print(f"{label} Hk={heads_k} B={batch} S={seqlen} page={page}: {ms:.4f} ms {2 * k.numel() * 2 / ms / 1e6:.0f} GB/s",
          flush=True)
