"""Round 38: SM clock and board power while one backward runs back to back for ~4 s (nvidia-smi sampled
every 100 ms in a child process), for flashattn and FlashAttention-3 (FLASHATTN_FA3_LIB) and cuDNN, bf16
d128 and d256, S = 8192 (B = 2, H * D = 2048), non-causal. Prints the median clock, power and the call
time for each."""
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, ".")
from benchmarks.backends import fa3_fn, flash_attention_3  # noqa: E402
from flashattn import flash_attn_func  # noqa: E402

fa3, why = flash_attention_3()
for d in (128, 256):
    b, s, h = 2, 8192, 2048 // d
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
    outs = {"flashattn": flash_attn_func(q, k, v)}
    if fa3 is not None:
        outs["fa3"] = fa3_fn(fa3, q, k, v, False, d ** -0.5)()
    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        outs["cudnn"] = F.scaled_dot_product_attention(qt, kt, vt).transpose(1, 2)
    for name, out in outs.items():
        leaves = (qt, kt, vt) if name == "cudnn" else (q, k, v)
        fn = lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True)  # noqa: E731
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                                "--format=csv,noheader,nounits", "-lms", "100"], stdout=subprocess.PIPE, text=True)
        t0, n = time.time(), 0
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        while time.time() - t0 < 4.0:
            for _ in range(10):
                fn()
            n += 10
            torch.cuda.synchronize()
        end.record()
        end.synchronize()
        smi.terminate()
        rows = [line.split(",") for line in smi.communicate()[0].strip().splitlines()[5:]]
        clock = statistics.median(float(r[0]) for r in rows)
        power = statistics.median(float(r[1]) for r in rows)
        temp = statistics.median(float(r[2]) for r in rows)
        print(f"D={d} {name}: {start.elapsed_time(end) / n * 1000:.0f} us a call, SM clock {clock:.0f} MHz, "
              f"power {power:.0f} W, {temp:.0f} C ({len(rows)} samples)", flush=True)
