"""Round 37 (round 36's kernels.py): where a bf16 backward's time goes, kernel by kernel, for flashattn, FlashAttention-3
(FLASHATTN_FA3_LIB) and cuDNN (SDPA), in one process, at head dims `--hdims` (default 256), the backends `--only` names (default all): torch.profiler over 10 backward calls after warm-up,
each kernel's mean device time per call. Shapes as the sweep's (B * S = 16k tokens, H * D = 2048)."""
import sys
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, ".")
from benchmarks.backends import fa3_fn, flash_attention_3  # noqa: E402
from flashattn import flash_attn_func  # noqa: E402

fa3, why = flash_attention_3()
print("fa3:", "loaded" if fa3 is not None else why)
hdims = [int(x) for a in sys.argv if a.startswith("--hdims=") for x in a.split("=")[1].split(",")] or [256]
for d, s, causal in [(d, s, c) for d in hdims for s, c in ((2048, False), (8192, False), (8192, True))]:
    b, h = 16384 // s, 2048 // d
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
    flops = 4 * b * h * s * s * d * 2.5 / (2 if causal else 1)
    runs = {"flashattn": lambda: flash_attn_func(q, k, v, causal=causal),
            "flashattn_det": lambda: flash_attn_func(q, k, v, causal=causal, deterministic=True)}
    if fa3 is not None:
        runs["fa3"] = fa3_fn(fa3, q, k, v, causal, d ** -0.5)
    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    runs["cudnn"] = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)
    only = [x for a in sys.argv if a.startswith("--only=") for x in a.split("=")[1].split(",")]
    for name, fn in runs.items():
        if only and name not in only:
            continue
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = fn()
            leaves = (qt, kt, vt) if name == "cudnn" else (q, k, v)
            for _ in range(3):
                torch.autograd.grad(out, leaves, dout, retain_graph=True)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    torch.autograd.grad(out, leaves, dout, retain_graph=True)
                torch.cuda.synchronize()
        per = defaultdict(float)
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                per[e.name[:70]] += e.device_time / 10
        total = sum(per.values())
        print(f"D={d} S={s} causal={int(causal)} {name}: {total:.0f} us a call, {flops / total / 1e6:.1f} TFLOP/s of kernel time")
        for kname, us in sorted(per.items(), key=lambda x: -x[1]):
            print(f"    {us:9.1f} us  {kname}")
