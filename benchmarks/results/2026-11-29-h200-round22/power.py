"""The SM clock and board power while one kernel runs alone (issue 20: is the FP8 forward power-capped?).
Each backend -- the FP8 forward (d128, S 8192, B 2, H 16, non-causal), ours bf16 and cuDNN bf16 on the
same values -- runs back to back for SECONDS seconds while nvidia-smi samples every 50 ms; the samples
of the middle of each run are summarised beside the run's TFLOP/s. Run with the built tree on
PYTHONPATH."""
import subprocess
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashattn import flash_attn_func

SECONDS = 4.0
B, S, H, D = 2, 8192, 16, 128
FLOPS = 4 * B * H * S * S * D
gen = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(B, S, H, D, generator=gen, device="cuda") for _ in range(3))
q8, k8, v8 = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
qb, kb, vb = (t.to(torch.bfloat16) for t in (q8, k8, v8))
ones = torch.ones(B, H, device="cuda")


def cudnn():
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (qb, kb, vb)))


fns = {"fp8": lambda: flash_attn_func(q8, k8, v8, q_descale=ones, k_descale=ones, v_descale=ones),
       "ours_bf16": lambda: flash_attn_func(qb, kb, vb), "cudnn_bf16": cudnn}
for name, fn in fns.items():
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    time.sleep(1.0)  # start each from the same idle state
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                            "--format=csv,noheader,nounits", "-lms", "50"], stdout=subprocess.PIPE, text=True)
    start = time.time()
    st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    st.record()
    calls = 0
    while time.time() - start < SECONDS:
        for _ in range(20):
            fn()
        calls += 20
        torch.cuda.synchronize()
    en.record()
    torch.cuda.synchronize()
    smi.terminate()
    lines = smi.communicate()[0].strip().splitlines()
    samples = [tuple(float(x) for x in l.split(",")) for l in lines if l.count(",") == 2]
    mid = samples[len(samples) // 4: 3 * len(samples) // 4] or samples
    clocks = sorted(s[0] for s in mid)
    power = sorted(s[1] for s in mid)
    ms = st.elapsed_time(en) / calls
    print(f"{name}: {FLOPS / ms / 1e9:.0f} TFLOP/s over {calls} calls; SM clock MHz median {clocks[len(clocks) // 2]:.0f} "
          f"(min {clocks[0]:.0f}, max {clocks[-1]:.0f}); power W median {power[len(power) // 2]:.0f} "
          f"(max {power[-1]:.0f}); {len(mid)} samples; temp {mid[-1][2]:.0f} C", flush=True)
