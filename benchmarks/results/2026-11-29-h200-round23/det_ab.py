"""deterministic=True against the default mode on the sm90 backward, for an A/B of two trees (each in its
own process, the tree on PYTHONPATH): one JSON row per shape with both modes' times (bf16, B * S =
16k, H * D = 2048, MLA H 16), and first a digest of the deterministic gradients of a fixed awkward
case per head dim (two trees whose order of dQ adds is the same give the same digest, bit for bit).
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

for d, dv in SHAPES:
    for causal in (False, True):
        gen = torch.Generator("cuda").manual_seed(d * 1000 + dv + causal)
        q = torch.randn(3, 1111, 4, d, generator=gen, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(3, 999, 2, d, generator=gen, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(3, 999, 2, dv, generator=gen, device="cuda", dtype=torch.bfloat16)
        dout = torch.randn(3, 1111, 4, dv, generator=gen, device="cuda", dtype=torch.bfloat16)
        leaves = [x.requires_grad_() for x in (q, k, v)]
        digest = hashlib.sha256()
        for _ in range(2):
            out = flash_attn_func(*leaves, causal=causal, deterministic=True)
            grads = torch.autograd.grad(out, leaves, dout)
            for g in grads:
                digest.update(g.float().cpu().numpy().tobytes())
        print(json.dumps({"label": label, "digest": f"d{d}/{dv} causal={int(causal)}",
                          "sha": digest.hexdigest()[:16]}), flush=True)

gen = torch.Generator("cuda").manual_seed(0)
for d, dv in SHAPES:
    for seqlen in (2048, 8192):
        for causal in (False, True):
            heads = WIDTH // d if dv == d else 16
            q = torch.randn(TOKENS // seqlen, seqlen, heads, d, generator=gen, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(q.shape, generator=gen, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(*q.shape[:3], dv, generator=gen, device="cuda", dtype=torch.bfloat16)
            dout = torch.randn(*q.shape[:3], dv, generator=gen, device="cuda", dtype=torch.bfloat16)
            leaves = [x.requires_grad_() for x in (q, k, v)]
            ms = {}
            for det in (False, True):
                out = flash_attn_func(*leaves, causal=causal, deterministic=det)
                fn = lambda out=out: torch.autograd.grad(out, leaves, dout, retain_graph=True)
                ms[det] = min(do_bench(fn, warmup=10, rep=60, return_mode="median") for _ in range(2))
            flops = 2.5 * 4 * q.shape[0] * heads * seqlen**2 * (d + dv) / 2 / (2 if causal else 1)
            print(json.dumps({"label": label, "d": d, "dv": dv, "seqlen": seqlen, "causal": causal,
                              "default_ms": round(ms[False], 4), "det_ms": round(ms[True], 4),
                              "default_tflops": round(flops / ms[False] / 1e9, 1),
                              "det_over_default": round(ms[True] / ms[False], 3)}), flush=True)
