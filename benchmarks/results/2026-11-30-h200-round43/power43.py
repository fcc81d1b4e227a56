"""Round 43: the clock and power each backend's backward runs at under the H200's power cap. For each
shape (bf16, B*S = 16k, H*D = 2048: d256 8k causal and not) and backend (ours, SDPA's cuDNN, FA4 when
FLASHATTN_FA4_DIR names it): 0.6 s of the sweep's call back to back (untimed), then a 1 s window timed by
CUDA events over back-to-back calls (an L2 flush before each, as do_bench). Prints each window's wall
clock span, for d3.sh's nvidia-smi samples (read with power43_read.py), and its ms a call."""
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, ".")
from benchmarks.backends import fa4_fn, flash_attention_4  # noqa: E402
from flashattn import flash_attn_func  # noqa: E402

fa4, why = flash_attention_4()
print(f"fa4: {'imported' if fa4 else why}", flush=True)
flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")


def backends(q, k, v, causal):
    scale = q.shape[-1] ** -0.5
    made = {}
    out = flash_attn_func(q, k, v, causal=causal)
    made["ours"] = (out, (q, k, v), None)
    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        made["cudnn"] = (F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2),
                         (qt, kt, vt), SDPBackend.CUDNN_ATTENTION)
    if fa4 is not None:
        q4, k4, v4 = (t.detach().requires_grad_() for t in (q, k, v))
        made["fa4"] = (fa4_fn(fa4, q4, k4, v4, causal, scale)(), (q4, k4, v4), None)
    return made


def caller(out, leaves, sdpa, dout):
    def call():
        if sdpa is None:
            torch.autograd.grad(out, leaves, dout, retain_graph=True)
        else:
            with sdpa_kernel(sdpa):
                torch.autograd.grad(out, leaves, dout, retain_graph=True)
    return call


for d, s, causal in ((256, 8192, True), (256, 8192, False)):
    b, h = 16384 // s, 2048 // d
    flops = 4 * b * h * s * s * d * 2.5 / (2 if causal else 1)
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)
    for name, (out, leaves, sdpa) in backends(q, k, v, causal).items():
        call = caller(out, leaves, sdpa, dout)
        call()
        torch.cuda.synchronize()
        time.sleep(1.0)
        end = time.time() + 0.6
        while time.time() < end:
            call()
            torch.cuda.synchronize()
        events = []
        t0 = time.time()
        while time.time() < t0 + 1.0:
            flush.zero_()
            e = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            e[0].record()
            call()
            e[1].record()
            events.append(e)
            if len(events) % 8 == 0:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        t1 = time.time()
        ms = sorted(a.elapsed_time(z) for a, z in events)[len(events) // 2]
        print(f"WINDOW d{d} s{s} causal{int(causal)} {name} {t0:.3f} {t1:.3f} calls {len(events)} "
              f"median {ms:.3f} ms {flops / ms / 1e9:.1f} TFLOP/s", flush=True)
