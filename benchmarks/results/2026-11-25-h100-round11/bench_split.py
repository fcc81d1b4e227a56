"""Backward-only timing of the sm90 backward by head dim against SDPA's cuDNN and flash backends
(round 11; run from the repository root on the GPU machine: python benchmarks/results/2026-11-25-h100-round11/bench_split.py 8192)."""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn

def timeit(fn, warm=5, iters=20):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / iters

B, H, S = 1, 16, int(sys.argv[1]) if len(sys.argv) > 1 else 8192
print(f"family {flashattn.kernel_family()}  B={B} H={H} S={S} bf16, backward only (ms, TFLOP/s)")
for d, dv in [(128, 128), (192, 128), (192, 192), (256, 256)]:
    for causal in (False, True):
        q, k = (torch.randn(B, S, H, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
        v = torch.randn(B, S, H, dv, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dout = torch.randn(B, S, H, dv, device="cuda", dtype=torch.bfloat16)
        flops = 2 * B * H * S * S * (3 * d + 2 * dv) / (2 if causal else 1)
        out = flashattn.flash_attn_func(q, k, v, causal=causal)
        t = timeit(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
        row = f"d{d}/{dv} {'causal' if causal else 'full  '}  ours {t:7.3f} ms {flops / t / 1e9:6.0f}"
        if dv == d:
            qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
            for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
                try:
                    with sdpa_kernel(be):
                        o2 = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                        t2 = timeit(lambda: torch.autograd.grad(o2, (qt, kt, vt), dout.transpose(1, 2), retain_graph=True))
                    row += f" | {name} {t2:7.3f} ms {flops / t2 / 1e9:6.0f} ({t2 / t:4.2f}x)"
                except RuntimeError:  # a backend that refuses the shape
                    row += f" | {name} n/a"
        print(row, flush=True)
        del q, k, v, out
