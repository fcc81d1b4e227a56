"""deterministic=True against the default mode on the sm90 backward, for an A/B of several trees (each
in its own process, the tree on PYTHONPATH). Round 23's det_ab.py with more sequence lengths: one JSON
row per (head dims, S, causal) with both modes' median times (bf16, B * S = 16k, H * D = 2048, MLA H 16),
and first a digest of the deterministic gradients of a fixed awkward case per head dim (trees whose
order of dQ adds is the same give the same digest, bit for bit).
    python det_ab.py LABEL"""
import hashlib
import json
import sys

import torch
from triton.testing import do_bench

from flashattn import flash_attn_func

label = sys.argv[1]
TOKENS, WIDTH = 16384, 2048
SHAPES = ((64, 64), (128, 128), (192, 192), (192, 128), (256, 256))
ROWS = ((1024, False), (2048, False), (2048, True), (8192, False), (8192, True), (16384, False))


def bf16(gen, *shape):
    return torch.randn(*shape, generator=gen, device="cuda", dtype=torch.bfloat16)


for d, dv in SHAPES:
    for causal in (False, True):
        gen = torch.Generator("cuda").manual_seed(d * 1000 + dv + causal)
        leaves = [bf16(gen, 3, 1111, 4, d).requires_grad_(), bf16(gen, 3, 999, 2, d).requires_grad_(),
                  bf16(gen, 3, 999, 2, dv).requires_grad_()]
        dout = bf16(gen, 3, 1111, 4, dv)
        digest = hashlib.sha256()
        for _ in range(2):
            out = flash_attn_func(*leaves, causal=causal, deterministic=True)
            for g in torch.autograd.grad(out, leaves, dout):
                digest.update(g.float().cpu().numpy().tobytes())
        print(json.dumps({"label": label, "digest": f"d{d}/{dv} causal={int(causal)}",
                          "sha": digest.hexdigest()[:16]}), flush=True)

gen = torch.Generator("cuda").manual_seed(0)
for d, dv in SHAPES:
    heads = WIDTH // d if dv == d else 16
    for seqlen, causal in ROWS:
        batch = TOKENS // seqlen
        leaves = [bf16(gen, batch, seqlen, heads, x).requires_grad_() for x in (d, d, dv)]
        dout = bf16(gen, batch, seqlen, heads, dv)
        ms = {}
        for det in (False, True):
            out = flash_attn_func(*leaves, causal=causal, deterministic=det)
            fn = lambda out=out: torch.autograd.grad(out, leaves, dout, retain_graph=True)
            ms[det] = min(do_bench(fn, warmup=10, rep=60, return_mode="median") for _ in range(2))
        flops = 2.5 * 4 * batch * heads * seqlen**2 * (d + dv) / 2 / (2 if causal else 1)
        print(json.dumps({"label": label, "d": d, "dv": dv, "seqlen": seqlen, "causal": causal,
                          "default_ms": round(ms[False], 4), "det_ms": round(ms[True], 4),
                          "default_tflops": round(flops / ms[False] / 1e9, 1),
                          "det_over_default": round(ms[True] / ms[False], 3)}), flush=True)
