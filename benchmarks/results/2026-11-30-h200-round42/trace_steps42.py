"""Round 42: the phases of the d256 dK/dV step from a per-step trace, one block's SM clock per event,
relative to the P warpgroup's step top. Two event layouts:

  --layout=s3 (default): call 3's trace (trace_s3.patch on S3: the next step's S issued behind
    dV^T, dO released at each warpgroup's dV^T end); the step top is where S is complete.
  --layout=main: trace_main.patch on main (3ed0c1e; prepared, not run in round 42); the step top
    is where the step's P is already stored.

    python trace_steps42.py c3/trace-s8192-c0.txt
    python trace_steps42.py --layout=main trace-s8192-c0.txt

Events (role 0: the P warpgroup, 1: the dS warpgroup, 2: the producer, for step t + 1):
  s3    P:  0 top, 1 P stored, 2 P barrier passed and dO ready, 3 dV^T issued, 5 dV^T complete,
            4 the next S issued, 6 at the dS barrier, 7 dK^T_0 issued, 8 all complete
        dS: 0 top, 1 dO ready (S barrier passed), 2 dP issued, 3 dP complete, 4 dV^T issued,
            5 dS stored, 9 dV^T complete, 6 at the dS barrier, 7 dK^T_0 issued, 8 all complete
  main  P:  0 top, 1 P barrier passed and dO ready, 2 dV^T issued, 3 dV^T complete, (round 43's
            trace_main43.patch: 10 past the dV^T barrier, 11 the next Q ready), 4 the next S
            issued and its LSE read, 5 at the dS barrier, 6 dK^T issued, 7 the next S complete,
            8 the next P made, 9 all complete
        dS: 0 top, 1 dO ready (S barrier passed), 2 dP issued, 3 dP complete, 4 dV^T issued,
            5 dS stored, 6 dV^T complete, 7 at the dS barrier, 8 dK^T issued, 9 all complete
  both  producer (its step t + 1): 0 top, 1 Q stage free, 2 row stats stored (before the dO wait),
            3 dO stage free (copy issued), 4 D stored
A clock read right after a named barrier reads the warp's arrival, not the barrier's opening.
"""
import statistics
import sys

layout = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--layout=")), "s3")
path = next(a for a in sys.argv[1:] if not a.startswith("--"))
# The events of each warpgroup in the order they happen.
ORDER = {"s3": ((0, 1, 2, 3, 5, 4, 6, 7, 8), (0, 1, 2, 3, 4, 5, 9, 6, 7, 8)),
         "main": ((0, 1, 2, 3, 10, 11, 4, 5, 6, 7, 8, 9), tuple(range(10)))}[layout]

rows = [line.split() for line in open(path) if line.startswith("TRACE")][-192:]
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


print(f"{path} ({layout}): steps {len(steps)}, steady {len(steady)}, "
      f"a step {mean(lambda t: signed(clock[(0, t + 1)][0] - clock[(0, t)][0]))} clocks")
# Events a trace does not record (round 43's 10 and 11 in round 42's) read 0 at every step.
recorded = [e for e in ORDER[0] if any(clock[(0, t)][e] for t in steady)]
print("  P warpgroup: ", {e: rel(0, e) for e in recorded})
print("  dS warpgroup:", {e: rel(1, e) for e in ORDER[1]})
print("  producer, step t + 1:", {e: rel(2, e, 1) for e in range(5)})
