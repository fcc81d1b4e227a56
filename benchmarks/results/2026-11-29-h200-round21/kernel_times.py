# Round 21: where a backward call's time goes, kernel by kernel (torch.profiler, CUDA activity):
# flashattn's backward (preprocess, dq_accum zeroing, main kernel, dQ conversion) and SDPA cuDNN's,
# bf16, B * S = 16k, H * D = 2048, for the (head dim, S, causal) given, 5 calls each after warm-up.
#   python kernel_times.py 64:2048:1 128:2048:1 ...
import sys
from collections import defaultdict
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile
import flashattn

REPS = 5
for spec in sys.argv[1:]:
    d, s, causal = (int(x) for x in spec.split(":"))
    b, h = 16384 // s, 2048 // d
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
    out = flashattn.flash_attn_func(q, k, v, causal=bool(causal))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
        out_c = F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal))
    for name, fn in (("flashattn", lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)),
                     ("cudnn", lambda: torch.autograd.grad(out_c, (qt, kt, vt), dout.transpose(1, 2), retain_graph=True))):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(REPS):
                fn()
            torch.cuda.synchronize()
        times = defaultdict(float)
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                times[e.name[:90]] += e.device_time / REPS
        total = sum(times.values())
        print(f"d{d} S{s} causal={causal} {name}: {total:.1f} us of kernels a call")
        for n, t in sorted(times.items(), key=lambda x: -x[1]):
            print(f"    {t:8.1f} us {100 * t / total:5.1f}%  {n}")
