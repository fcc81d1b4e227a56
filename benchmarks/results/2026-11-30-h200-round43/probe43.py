"""Round 43: why the d256 causal 8k backward's time swings ~10% by round and process (bimodal.py, call 1:
ours 510 TFLOP/s in a process's first do_bench round, ~455 after; cuDNN 420, then ~378). One process
holds both backends (the sweep's shape and call). It prints wall-clock marks to match the SM clock,
power and clock-event reasons that d2.sh samples with nvidia-smi, and:
  1. each backend alone after 3 s idle: six do_bench rounds (warmup 10 ms, rep 50 ms, the sweep's);
  2. twelve alternations A B A B ... with no idle;
  3. each backend after a 1 s heat of its own calls: three rounds;
  4. each backend's host time per call (20 calls queued, no sync) and the CUDA runtime calls one
     call makes (torch.profiler), to rule a host-bound call in or out."""
import collections
import json
import os
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

sys.path.insert(0, ".")
from flashattn import flash_attn_func  # noqa: E402

b, h, s, d = 2, 8, 8192, 256
flops = 4 * b * h * s * s * d * 2.5 / 2
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
dout = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    out_c = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True).transpose(1, 2)
out_f = flash_attn_func(q, k, v, causal=True)


def ours():
    torch.autograd.grad(out_f, (q, k, v), dout, retain_graph=True)


def cudnn():
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        torch.autograd.grad(out_c, (qt, kt, vt), dout, retain_graph=True)


calls = {"ours": ours, "cudnn": cudnn}
t0 = time.time()


def mark(text):
    print(f"{time.time():.3f} (+{time.time() - t0:6.2f}s) {text}", flush=True)


def bench(name):
    ms = do_bench(calls[name], warmup=10, rep=50, return_mode="median")
    mark(f"{name:5s} {ms:.3f} ms {flops / ms / 1e9:6.1f} TFLOP/s")
    return ms


for fn in calls.values():
    fn()
torch.cuda.synchronize()
mark("phase 1: each alone after 3 s idle")
for name in calls:
    time.sleep(3)
    mark(f"{name} start")
    for _ in range(6):
        bench(name)
time.sleep(3)
mark("phase 2: alternations, no idle")
res = collections.defaultdict(list)
for _ in range(12):
    for name in calls:
        res[name].append(bench(name))
r = {n: sorted(v)[len(v) // 2] for n, v in res.items()}
mark(f"phase 2 medians: ours {r['ours']:.3f} cudnn {r['cudnn']:.3f} ratio {r['cudnn'] / r['ours']:.3f}; "
     f"bests ratio {min(res['cudnn']) / min(res['ours']):.3f}")
mark("phase 3: each after a 1 s heat of its own calls")
for name in calls:
    time.sleep(3)
    end = time.time() + 1.0
    while time.time() < end:
        calls[name]()
        torch.cuda.synchronize()
    for _ in range(3):
        bench(name)
mark("phase 4: host time per call")
for name, fn in calls.items():
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        fn()
    host = (time.perf_counter() - t) / 20 * 1e3
    torch.cuda.synchronize()
    gpu = (time.perf_counter() - t) / 20 * 1e3
    mark(f"{name}: host {host:.3f} ms a call (queued), with the GPU {gpu:.3f} ms a call")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    path = os.path.join(tempfile.mkdtemp(), "t.json")
    prof.export_chrome_trace(path)
    runtime = collections.Counter()
    took = collections.Counter()
    for e in json.load(open(path))["traceEvents"]:
        if e.get("cat") == "cuda_runtime" or e.get("cat") == "cuda_driver":
            runtime[e["name"]] += 1
            took[e["name"]] += e.get("dur", 0)
    mark(f"{name} runtime calls: " + ", ".join(f"{n} x{c} {took[n]:.0f}us" for n, c in runtime.most_common()))
mark("done")
