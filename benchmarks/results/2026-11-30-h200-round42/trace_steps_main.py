"""Round 42, prepared for the next session (not run): the phases of main's d256 dK/dV step (3ed0c1e)
from a trace of trace_main.patch, one block's SM clock per event, relative to the P warpgroup's
step top (its P of the step already stored).

    python trace_steps_main.py trace-s8192-c0.txt

Events (role 0: the P warpgroup, 1: the dS warpgroup, 2: the producer, for step t + 1):
  P:  0 top, 1 P barrier passed and dO ready, 2 dV^T issued, 3 dV^T complete, 4 the next S issued,
      5 at the dS barrier, 6 dK^T issued, 7 the next S complete, 8 the next P made, 9 all complete
  dS: 0 top, 1 dO ready (S barrier passed), 2 dP issued, 3 dP complete, 4 dV^T issued,
      5 dS stored, 6 dV^T complete, 7 at the dS barrier, 8 dK^T issued, 9 all complete
  producer (its step t + 1): 0 top, 1 Q stage free, 2 row stats stored (before the dO wait),
      3 dO stage free (copy issued), 4 D stored
A clock read right after a named barrier reads the warp's arrival, not the barrier's opening.
"""
import statistics
import sys

rows = [line.split() for line in open(sys.argv[1]) if line.startswith("TRACE")][-192:]
clock = {(int(r[1]), int(r[2])): [int(x) for x in r[3:]] for r in rows}
steps = [t for t in range(64) if clock[(0, t)][0] != 0]
steady = steps[4:-2]


def mean(f):
    return round(statistics.mean(f(t) for t in steady))


def signed(d):  # a 32-bit clock difference, either sign
    d &= 0xFFFFFFFF
    return d - (1 << 32) if d >= 1 << 31 else d


def rel(role, e, ahead=0):
    return mean(lambda t: signed(clock[(role, t + ahead)][e] - clock[(0, t)][0]))


print(f"{sys.argv[1]}: steps {len(steps)}, steady {len(steady)}, "
      f"a step {mean(lambda t: (clock[(0, t + 1)][0] - clock[(0, t)][0]) & 0xFFFFFFFF)} clocks")
print("  P warpgroup: ", {e: rel(0, e) for e in range(10)})
print("  dS warpgroup:", {e: rel(1, e) for e in range(10)})
print("  producer, step t + 1:", {e: rel(2, e, 1) for e in range(5)})
