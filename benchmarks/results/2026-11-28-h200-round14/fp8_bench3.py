import sys
sys.argv = [sys.argv[0], "none"]
exec(open("benchmarks/results/2026-11-28-h200-round14/fp8_quick.py").read())
case(2, 257, 513, 4, 4, 128, window=(64, 17))
case(1, 2049, 2049, 2, 1, 128, causal=True)
case(3, 129, 1000, 4, 2, 128, varlen=True)
for D, H in ((128, 16), (256, 8)):
    for causal in (False, True):
        bench(2, 8192, H, D, causal)
