"""Medians of the clock64 trace (trace_patch.py) of block (10, 5, 0)'s steps: per consumer warpgroup,
the step's period and each stamp's cycles after the step's start (its gradients' head), over the middle
steps (the first and last 5 left out).

    python trace_summary.py TRACE.txt...
"""
import statistics
import sys

# stamp id: what had just happened (13-16 are the next step's scores, counted from this step's start)
NAMES = {1: "dV issued", 2: "dS^T stored", 4: "past the dS barrier", 5: "dQ^T complete", 11: "dQ^T reduce issued",
         7: "dK complete", 8: "next tiles in", 13: "next S^T complete", 14: "exponentials issued",
         15: "next dP^T complete", 16: "next dS^T complete"}

for path in sys.argv[1:]:
    rows = {}
    for line in open(path):
        if line.startswith("TRACE"):
            f = line.split()
            rows[(int(f[1][1:]), int(f[2][1:]))] = [int(x) for x in f[3:]]
    print(path)
    for c in (0, 1):
        steps = sorted(t for (cc, t) in rows if cc == c)[5:-5]
        period = statistics.median(rows[(c, t + 1)][0] - rows[(c, t)][0] for t in steps)
        cols = []
        for i, name in NAMES.items():
            vals = []
            for t in steps:
                src = rows[(c, t + 1)] if i >= 13 else rows[(c, t)]
                if src[i] >= 0:
                    vals.append(src[i] - rows[(c, t)][0])
            if vals:
                cols.append(f"{name} {statistics.median(vals):.0f}")
        print(f"  warpgroup {c}: period {period:.0f} cycles; " + ", ".join(cols))
