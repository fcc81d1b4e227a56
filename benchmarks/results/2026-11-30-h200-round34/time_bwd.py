"""Round 34: one variant's bf16 backward at head dims `--hdims` (default 256), timed (CUDA events, median of
20 after 3 warm-up calls) on the sweep's shapes (B * S = 16k tokens, H * D = 2048), with cuDNN (SDPA) timed in the same process; and, unless
`--no-check`, its gradients against an fp32 reference on an awkward shape (bound: 3x SDPA's own bf16 error
+ 1e-3). Prints one line per row: variant, causal, D, S, TFLOP/s, cuDNN TFLOP/s."""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashattn import flash_attn_func

name = sys.argv[1]
check = "--no-check" not in sys.argv
hdims = [int(x) for a in sys.argv if a.startswith("--hdims=") for x in a.split("=")[1].split(",")] or [256]


def median_ms(fn, iters=20):
    for _ in range(3):
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


def reference(q, k, v, dout, causal, dtype):
    qt, kt, vt = (t.detach().to(dtype).transpose(1, 2).requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    grads = torch.autograd.grad(out, (qt, kt, vt), dout.to(dtype).transpose(1, 2))
    return [g.transpose(1, 2).float() for g in grads]


for d in hdims if check else []:
    torch.manual_seed(0)
    for causal in (False, True):
        q, k, v = (torch.randn(2, 701, 4, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        dout = torch.randn(2, 701, 4, d, device="cuda", dtype=torch.bfloat16)
        out = flash_attn_func(q, k, v, causal=causal)
        ours = torch.autograd.grad(out, (q, k, v), dout)
        exact = reference(q, k, v, dout, causal, torch.float32)
        low = reference(q, k, v, dout, causal, torch.bfloat16)
        for label, o, e, l in zip("qkv", ours, exact, low):
            err, bound = (o.float() - e).abs().max().item(), 3 * (l - e).abs().max().item() + 1e-3
            print(f"check {name} D={d} causal={causal} d{label}: err {err:.2e} bound {bound:.2e} {'ok' if err <= bound else 'FAIL'}")

for d, s, causal in [(d, s, c) for d in hdims for s in (2048, 8192) for c in (False, True)]:
    b, h = 16384 // s, 2048 // d
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
    out = flash_attn_func(q, k, v, causal=causal)
    ms = median_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    ms_cudnn = median_ms(lambda: torch.autograd.grad(ref, (qt, kt, vt), dout.transpose(1, 2), retain_graph=True))
    flops = 4 * b * h * s * s * d * 2.5 / (2 if causal else 1)
    print(f"row {name} causal={int(causal)} D={d} S={s} ours {flops / ms / 1e9:.1f} cudnn {flops / ms_cudnn / 1e9:.1f}")
