"""Round 36: whether the d256 dQ kernel overlaps the dK/dV kernel's last wave (programmatic dependent
launch): one bf16 d256 backward (B 2, S 8192, H 8), torch.profiler; each kernel's start and end in
microseconds from the first kernel's start."""
import torch
from torch.profiler import ProfilerActivity, profile

from flashattn import flash_attn_func

for causal in (False, True):
    q, k, v = (torch.randn(2, 8192, 8, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    out = flash_attn_func(q, k, v, causal=causal)
    dout = torch.randn_like(out)
    for _ in range(2):
        torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        torch.cuda.synchronize()
    kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                     if e.device_type == torch.autograd.DeviceType.CUDA)
    t0 = kernels[0][0]
    print(f"causal={causal}")
    for start, end, name in kernels:
        print(f"  {start - t0:8.1f} {end - t0:8.1f}  {name[:80]}")
