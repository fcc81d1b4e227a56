"""deterministic=True on the sm90 backward with the grid's runs (BwdWork, det_run): the time against
the default mode's at each run length (FLASHATTN_AB_DET_RUN, read by the A/B build's launcher only:
0 = whole pairs, round 22's order; unset = the launcher's choice), and the gradients of every run
length bitwise equal to each other (the order of the adds does not depend on the grid's order).
    python det_runs.py [RUNS, e.g. 0,4,8,16]
bf16, B * S = 16k, H * D = 2048 (MLA: H 16). Run with the built tree on PYTHONPATH."""
import os
import sys

import torch
from triton.testing import do_bench

from flashattn import flash_attn_func

TOKENS, WIDTH = 16384, 2048
# Call 3: 0,1,2,4,8 and the launcher's choice; call 6 (branch next/det-runs, where unset is 0): argv.
RUNS = tuple(sys.argv[1].split(",")) if len(sys.argv) > 1 else ("0", "1", "2", "4", "8", None)
gen = torch.Generator("cuda").manual_seed(0)
mismatches = 0
for d, dv in ((64, 64), (128, 128), (192, 192), (192, 128), (256, 256)):
    for seqlen in (2048, 8192):
        for causal in (False, True):
            heads = WIDTH // d if dv == d else 16
            q = torch.randn(TOKENS // seqlen, seqlen, heads, d, generator=gen, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(q.shape, generator=gen, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(*q.shape[:3], dv, generator=gen, device="cuda", dtype=torch.bfloat16)
            dout = torch.randn(*q.shape[:3], dv, generator=gen, device="cuda", dtype=torch.bfloat16)
            leaves = [x.requires_grad_() for x in (q, k, v)]
            ms, first = {}, None
            for det, run in [(False, None)] + [(True, r) for r in RUNS]:
                if run is None:
                    os.environ.pop("FLASHATTN_AB_DET_RUN", None)
                else:
                    os.environ["FLASHATTN_AB_DET_RUN"] = run
                out = flash_attn_func(*leaves, causal=causal, deterministic=det)
                fn = lambda out=out: torch.autograd.grad(out, leaves, dout, retain_graph=True)
                if det:
                    g = fn()
                    if first is None:
                        first = g
                    elif not all(torch.equal(a, b) for a, b in zip(g, first)):
                        mismatches += 1
                        print(f"  MISMATCH d{d}/{dv} S{seqlen} causal={causal} run={run}", flush=True)
                ms[(det, run)] = min(do_bench(fn, warmup=10, rep=60, return_mode="median") for _ in range(2))
            os.environ.pop("FLASHATTN_AB_DET_RUN", None)
            flops = 2.5 * 4 * q.shape[0] * heads * seqlen**2 * (d + dv) / 2 / (2 if causal else 1)
            base = ms[(False, None)]
            cells = " ".join(f"{'auto' if r is None else r}:{ms[(True, r)] / base:.3f}" for r in RUNS)
            print(f"d{d}/{dv} S{seqlen} causal={int(causal)} default {flops / base / 1e9:.0f} TFLOP/s; "
                  f"det time / default by run: {cells}", flush=True)
print(f"bitwise mismatches across run lengths: {mismatches}")
