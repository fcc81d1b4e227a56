"""Round 41: per-step phases of the d256 dK/dV kernel from the trace (c3/trace-*.txt).

    python trace_steps.py c3/trace-s8192-c0.txt

The trace (trace.patch, branch exp/d256-trace) has one block's SM clock at each event, per role
(0: the P warpgroup, 1: the dS warpgroup, 2: the producer), per step. The events after a named
barrier (BAR.SYNC.DEFER_BLOCKING) read the clock when the warp arrives, not when the barrier opens:
the clock read does not wait for it. So a barrier opens at the later of the two roles' arrivals,
and each role's own durations are what the events give directly. The last launch's rows are used.
"""
import statistics
import sys

rows = [line.split() for line in open(sys.argv[1]) if line.startswith("TRACE")][-192:]
clock = {(int(r[1]), int(r[2])): [int(x) for x in r[3:]] for r in rows}
steps = [t for t in range(64) if clock[(0, t)][0] != 0]
steady = steps[4:-2]


def at(role, t, e):
    return clock[(role, t)][e]


def mean(f):
    return round(statistics.mean(f(t) for t in steady))


step = mean(lambda t: (at(0, t + 1, 0) - at(0, t, 0)) & 0xFFFFFFFF)
print(f"{sys.argv[1]}: steps {len(steps)}, steady {len(steady)}, a step {step} clocks")
phases = {
    "P warpgroup: top -> Q ready": (0, 0, 1),
    "P warpgroup: S issued (16 wgmma)": (0, 1, 2),
    "P warpgroup: S issued -> complete": (0, 2, 3),
    "P warpgroup: P made and stored": (0, 3, 4),
    "P warpgroup: dV^T issued (from its P-barrier arrival)": (0, 5, 6),
    "dS warpgroup: S-barrier arrival -> dO ready": (1, 1, 2),
    "dS warpgroup: dP issued (16 wgmma)": (1, 2, 3),
    "dS warpgroup: dP issued -> complete": (1, 3, 4),
    "dS warpgroup: dV^T issued (from its P-barrier arrival)": (1, 5, 6),
    "dS warpgroup: dS made and stored": (1, 6, 7),
    "P warpgroup: dS-barrier arrival -> dV^T complete (dK^T_0 issued)": (0, 8, 9),
    "P warpgroup: dK^T_1 issued -> all complete": (0, 9, 10),
}
for name, (role, a, b) in phases.items():
    print(f"  {name:66s} {mean(lambda t: at(role, t, b) - at(role, t, a)):6d}")
# Barrier waits: a barrier opens at the later arrival (same SM clock for both roles).
p_open = mean(lambda t: max(at(0, t, 4), at(1, t, 4)) - at(0, t, 0))
ds_open = mean(lambda t: max(at(0, t, 7), at(1, t, 7)) - at(0, t, 0))
print(f"  P barrier opens at {p_open} (P stored at {mean(lambda t: at(0, t, 4) - at(0, t, 0))}, "
      f"dP complete at {mean(lambda t: at(1, t, 4) - at(0, t, 0))}), from the P warpgroup's step top")
print(f"  dS barrier opens at {ds_open} (P warpgroup arrives at {mean(lambda t: at(0, t, 7) - at(0, t, 0))}, "
      f"dS stored at {mean(lambda t: at(1, t, 7) - at(0, t, 0))})")
print(f"  ends: P warpgroup {mean(lambda t: at(0, t, 10) - at(0, t, 0))}, "
      f"dS warpgroup {mean(lambda t: at(1, t, 10) - at(0, t, 0))}")
print(f"  producer: dO(t+1) copy issued at {mean(lambda t: at(2, t + 1, 3) - at(0, t, 0))}")
