"""Where the FP8 benchmark's time goes (issue 20): one d128 S 8192 non-causal call (B 2, H 16) of
flash_attn_func on e4m3 inputs, of ours bf16 and of cuDNN bf16, timed four ways in one process:
triton's do_bench median (L2 flushed before each call: the `python -m benchmarks fp8` method), ten
calls back to back (best of three), the kernels' own times (torch.profiler), and the host's time
to issue one call. Run from the repository root with the built tree on PYTHONPATH."""
import math
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from flashattn import flash_attn_func

B, S, H, D = 2, 8192, 16, 128
FLOPS = 4 * B * H * S * S * D
gen = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(B, S, H, D, generator=gen, device="cuda") for _ in range(3))
q8, k8, v8 = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
ones = torch.ones(B, H, device="cuda")
qb, kb, vb = (t.to(torch.float8_e4m3fn).to(torch.bfloat16) for t in (q, k, v))

fns = {
    "fp8": lambda: flash_attn_func(q8, k8, v8, q_descale=ones, k_descale=ones, v_descale=ones),
    "ours_bf16": lambda: flash_attn_func(qb, kb, vb),
}


def cudnn():
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (qb, kb, vb))).transpose(1, 2)


fns["cudnn_bf16"] = cudnn
ref = cudnn().float()
for name, fn in fns.items():
    out = fn()
    out = out[0] if isinstance(out, tuple) else out
    err = (out.float() - ref).abs().max().item()
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    bench = do_bench(fn, warmup=25, rep=200, return_mode="median")
    loop = 1e9
    for _ in range(3):
        st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        st.record()
        for _ in range(10):
            fn()
        en.record()
        torch.cuda.synchronize()
        loop = min(loop, st.elapsed_time(en) / 10)
    host = []
    for _ in range(20):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    kernels = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels.setdefault(e.name[:60], []).append(e.device_time_total / 1e3)
    ktotal = sum(sum(t) for t in kernels.values()) / 5
    print(f"{name}: do_bench {FLOPS / bench / 1e9:.0f} TFLOP/s ({bench * 1e3:.0f} us), loop {FLOPS / loop / 1e9:.0f} "
          f"({loop * 1e3:.0f} us), kernels {FLOPS / ktotal / 1e9:.0f} ({ktotal * 1e3:.0f} us), host issue "
          f"{sorted(host)[10] * 1e3:.0f} us median, max err vs cuDNN {err:.3g}", flush=True)
    for kname, t in kernels.items():
        print(f"    {sum(t) / 5 * 1e3:8.1f} us  {kname}", flush=True)
