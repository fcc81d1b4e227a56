"""Round 37 (round 36's time36.py): the bf16 backward at head dims `--hdims` (default 256), default and deterministic mode, and
cuDNN (SDPA) in the same process, on the sweep's shapes (B * S = 16k tokens, H * D = 2048) and one GQA
shape (KV heads a quarter of the query heads): wall-clock time of torch.autograd.grad (CUDA events,
median of 30 after 5 warm-up calls), in rounds (A, B, C, A, B, C, ...), best median of the rounds.
Prints one line per row: causal, D, S, heads, then TFLOP/s of each."""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashattn import flash_attn_func

hdims = [int(x) for a in sys.argv if a.startswith("--hdims=") for x in a.split("=")[1].split(",")] or [256]
rounds = int(next((a.split("=")[1] for a in sys.argv if a.startswith("--rounds=")), 2))


def median_ms(fn, iters=30):
    for _ in range(5):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


rows = [(d, s, c, 1) for d in hdims for s in (2048, 8192) for c in (False, True)] + [(d, 8192, False, 4) for d in hdims]
for d, s, causal, group in rows:
    b, h = 16384 // s, 2048 // d
    hk = h // group
    q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(b, s, hk, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    dout = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
    out = flash_attn_func(q, k, v, causal=causal)
    out_det = flash_attn_func(q, k, v, causal=causal, deterministic=True)
    runs = {"default": lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True),
            "det": lambda: torch.autograd.grad(out_det, (q, k, v), dout, retain_graph=True)}
    if group == 1:
        qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        runs["cudnn"] = lambda: torch.autograd.grad(ref, (qt, kt, vt), dout.transpose(1, 2), retain_graph=True)
    best = {}
    for _ in range(rounds):
        for name, fn in runs.items():
            best[name] = min(best.get(name, 1e9), median_ms(fn))
    flops = 4 * b * h * s * s * d * 2.5 / (2 if causal else 1)
    cells = " ".join(f"{name} {flops / ms / 1e9:.1f}" for name, ms in best.items())
    print(f"row causal={int(causal)} D={d} S={s} H={h}/{hk}: {cells}", flush=True)
