"""Round 43: probe43.py's wall-clock marks against d2.sh's nvidia-smi samples: every sample (SM clock,
power, temperature, clock-event reasons; 0x4 = SW power cap) from just before each backend's first
window of phase 1 to the end of phase 3, in seconds after the "phase 1" mark, with the marks between.
    python probe43_read.py c2/probe.log c2/smi.csv"""
import datetime
import sys

marks = [(float(line.split()[0]), line.split(")", 1)[1].strip()) for line in open(sys.argv[1]) if line[:1].isdigit()]
t0 = marks[0][0]
events = [(t - t0, "mark: " + text) for t, text in marks]
for line in open(sys.argv[2]):
    parts = [p.strip() for p in line.split(",")]
    try:
        t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=datetime.timezone.utc)
    except (ValueError, IndexError):
        continue
    events.append((t.timestamp() - t0, "  ".join(parts[1:])))
end = next(t for t, text in events if "phase 4" in text)
for t, text in sorted(events):
    if 2.5 <= t <= end:
        print(f"{t:6.2f}  {text}")
