"""Round 42, prepared for the next session: is the d256 causal 8k backward's call time bimodal by
process (the sweep read ~509 or ~478 TFLOP/s, the kernels' own times the same in both), and where
does the slow mode's time go? One process: the sweep's shape (B 2, H 8, S 8192, D 256, bf16, causal),
the sweep's call (torch.autograd.grad with retain_graph), timed as triton's do_bench times it (an L2
flush before each call, the median) in `--rounds` rounds; then three calls under torch.profiler, an
L2 flush before each, and for each call the kernels' start and end from the trace: the preprocess,
the dK/dV kernel, the dQ kernel, how long the dQ kernel overlaps the dK/dV kernel (its start before
the other's end), the gaps, and the span from the call's first kernel to its last.

    python bimodal.py [--rounds=5] [--backend=flashattn|cudnn]
"""
import json
import os
import sys
import tempfile

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

sys.path.insert(0, ".")
from flashattn import flash_attn_func  # noqa: E402

rounds = int(next((a.split("=")[1] for a in sys.argv if a.startswith("--rounds=")), 5))
backend = next((a.split("=")[1] for a in sys.argv if a.startswith("--backend=")), "flashattn")
b, h, s, d = 2, 8, 8192, 256
flops = 4 * b * h * s * s * d * 2.5 / 2
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
dout = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
print(f"pid {os.getpid()}: q at {q.data_ptr():#x}, k {k.data_ptr():#x}, v {v.data_ptr():#x}, dout {dout.data_ptr():#x}")
if backend == "cudnn":
    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True).transpose(1, 2)
    leaves = (qt, kt, vt)
else:
    out = flash_attn_func(q, k, v, causal=True)
    leaves = (q, k, v)


def call():
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        torch.autograd.grad(out, leaves, dout, retain_graph=True)


for r in range(rounds):
    ms = do_bench(call, warmup=10, rep=50, return_mode="median")
    print(f"round {r}: {ms:.3f} ms, {flops / ms / 1e9:.1f} TFLOP/s")

flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
    for _ in range(3):
        flush.zero_()
        call()
    torch.cuda.synchronize()
path = os.path.join(tempfile.mkdtemp(), "trace.json")
prof.export_chrome_trace(path)
kernels = sorted((e for e in json.load(open(path))["traceEvents"] if e.get("cat") == "kernel"),
                 key=lambda e: e["ts"])
calls, current = [], None
for e in kernels:
    if "zero" in e["name"] or "fill" in e["name"].lower():  # the flush starts a call
        current = []
        calls.append(current)
    elif current is not None:
        current.append(e)
for i, ks in enumerate(calls):
    if not ks:
        continue
    t0 = ks[0]["ts"]
    parts = [f"{k['name'][:38]} {k['ts'] - t0:8.1f}..{k['ts'] + k['dur'] - t0:8.1f}" for k in ks]
    span = max(k["ts"] + k["dur"] for k in ks) - t0
    print(f"call {i}: span {span:.1f} us; " + "; ".join(parts))
    main = [k for k in ks if "bwd_kernel" in k["name"]]
    dq = [k for k in ks if "bwd_dq_kernel" in k["name"]]
    if main and dq:
        overlap = main[0]["ts"] + main[0]["dur"] - dq[0]["ts"]
        print(f"  dQ kernel starts {dq[0]['ts'] - main[0]['ts']:.1f} us after the dK/dV kernel, "
              f"overlapping its end by {overlap:.1f} us")
