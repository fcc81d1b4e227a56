"""Round 44 (probe44b: as probe44, but the variants are round 36's two d256 backwards on 7ab480f's tree:
"reds" the default mode, FlashAttention-3's arrangement with dQ added by reds (five GEMMs), "two" the
deterministic mode, the dK/dV kernel without dQ and the dQ kernel (seven GEMMs).)
Round 44: what the d256 backward's copies from L2 cost under the H200's power cap. The branch
exp/energy-probe reads FLASHATTN_EXP_PROBE at each call: bit 0 skips the dK/dV kernel's Q and dO copies
on every odd step past the first ones (the stage keeps an older step's tile), bit 1 the dQ kernel's K and
V copies alike; the gradients are then wrong, the work is the same. Every variant and cuDNN are timed in
alternation, sustained (a 0.2 s untimed heat before each 0.4 s window of back-to-back calls, an L2 flush
before each call), nvidia-smi every 20 ms; the median window of each is printed with its clock and power."""
import datetime
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, ".")
from flashattn import flash_attn_func  # noqa: E402

smi_path = os.path.join(os.environ.get("OUT", "/tmp"), "smi44b.csv")
smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv,noheader,nounits",
                        "-lms", "20"], stdout=open(smi_path, "w"), stderr=subprocess.DEVNULL,
                       stdin=subprocess.DEVNULL, start_new_session=True)
flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
VARIANTS = ["reds", "two", "cudnn"]
ROUNDS = int(os.environ.get("ROUNDS", "4"))


def window(call, seconds):
    events = []
    t0 = time.time()
    while time.time() < t0 + seconds:
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
    return ms, t0, t1


records = []
try:
    for s, causal in ((2048, False), (2048, True), (8192, False), (8192, True)):
        d = 256
        b, h = 16384 // s, 2048 // d
        flops = 4 * b * h * s * s * d * 2.5 / (2 if causal else 1)
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        dout = torch.randn_like(q)
        out_r = flash_attn_func(q, k, v, causal=causal, deterministic=False)
        out_d = flash_attn_func(q, k, v, causal=causal, deterministic=True)
        qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out_c = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)

        def ours(out):
            def call():
                return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
            return call

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.autograd.grad(out_c, (qt, kt, vt), dout, retain_graph=True)

        calls = {"reds": ours(out_r), "two": ours(out_d), "cudnn": cudnn}
        g0, g1, gc = calls["reds"](), calls["two"](), calls["cudnn"]()
        err = [((a.float() - c.transpose(1, 2).float()).abs().max() / c.float().abs().max()).item()
               for a, c in zip(g0, gc)]
        err += [((a.float() - c.transpose(1, 2).float()).abs().max() / c.float().abs().max()).item()
                for a, c in zip(g1, gc)]
        print(f"d{d} s{s} causal{int(causal)}: reds, two against cuDNN, max|diff|/max|cudnn| dq dk dv {err}", flush=True)
        window(calls["reds"], 0.5)
        for r in range(ROUNDS):
            order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
            for name in order:
                window(calls[name], 0.2)
                ms, t0, t1 = window(calls[name], 0.4)
                records.append((s, causal, name, r, ms, t0, t1, flops))
                print(f"WINDOW s{s} causal{int(causal)} {name} round {r} {ms:.4f} ms", flush=True)
        del out_r, out_d, out_c, q, k, v, qt, kt, vt, dout
        torch.cuda.empty_cache()

finally:
    smi.terminate()
smi.wait()
samples = []
for line in open(smi_path):
    parts = [x.strip() for x in line.split(",")]
    try:
        ts = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        samples.append((ts, float(parts[1]), float(parts[2])))
    except (ValueError, IndexError):
        pass
print(f"{len(samples)} nvidia-smi samples")
print("| shape | backend | median ms | TFLOP/s | / reds time | MHz | W | J a call |")
print("|---|---|---|---|---|---|---|---|")
for s, causal in sorted({(x[0], x[1]) for x in records}):
    if True:
        rows = {}
        for name in VARIANTS:
            rec = [x for x in records if x[0] == s and x[1] == causal and x[2] == name]
            if not rec:
                continue
            ms = sorted(x[4] for x in rec)[len(rec) // 2]
            inside = [(c, p) for (ts, c, p) in samples for x in rec if x[5] + 0.05 <= ts <= x[6]]
            mhz = sum(c for c, _ in inside) / len(inside) if inside else float("nan")
            watts = sum(p for _, p in inside) / len(inside) if inside else float("nan")
            rows[name] = (ms, mhz, watts, rec[0][7])
        base = rows["reds"][0]
        for name, (ms, mhz, watts, flops) in rows.items():
            print(f"| d256 {s // 1024}k{' causal' if causal else ''} | {name} | {ms:.3f} | {flops / ms / 1e9:.1f} | "
                  f"{ms / base:.3f} | {mhz:.0f} | {watts:.0f} | {watts * ms / 1e3:.2f} |")
