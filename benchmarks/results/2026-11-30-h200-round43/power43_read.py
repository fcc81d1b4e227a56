"""Round 43: power43.py's windows against d3.sh's nvidia-smi samples: each window's mean SM clock and
board power, and its energy a backward (mean power x median time).
    python power43_read.py power.log smi.csv"""
import datetime
import sys

samples = []
for line in open(sys.argv[2]):
    parts = [p.strip() for p in line.split(",")]
    try:
        t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=datetime.timezone.utc)
        samples.append((t.timestamp(), float(parts[1].split()[0]), float(parts[2].split()[0])))
    except (ValueError, IndexError):
        continue
for line in open(sys.argv[1]):
    if not line.startswith("WINDOW"):
        continue
    w = line.split()
    t0, t1, ms, tflops = float(w[5]), float(w[6]), float(w[10]), float(w[12])
    inside = [(c, p) for t, c, p in samples if t0 + 0.3 <= t <= t1]  # the power reading lags by ~0.3 s
    if not inside:
        print(" ".join(w[1:5]), "no samples")
        continue
    clock = sum(c for c, _ in inside) / len(inside)
    power = sum(p for _, p in inside) / len(inside)
    print(f"{' '.join(w[1:5]):28s} {tflops:6.1f} TFLOP/s  {ms:6.3f} ms  clock {clock:6.0f} MHz  "
          f"power {power:5.0f} W  energy {power * ms:6.0f} mJ a call  ({len(inside)} samples)")
