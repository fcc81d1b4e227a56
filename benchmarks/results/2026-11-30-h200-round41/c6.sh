#!/bin/bash
# Round 41, call 6 (run inline on call 5's machine, kept warm; main f43eb6e, call 5's full build):
# time37.py (three rounds) and kernels.py at d256.
R37=benchmarks/results/2026-11-30-h200-round37
PYTHONPATH=$PWD timeout 60 python3 $R37/time37.py --hdims=256 --rounds=3 2>&1 | grep -v Warn | tee $OUT/time_main.log | grep row
PYTHONPATH=$PWD timeout 30 python3 $R37/kernels.py --hdims=256 --only=flashattn 2>&1 | grep -v Warn > $OUT/kernels_main.log
grep -E "^D=|bwd_kernel|bwd_dq_kernel" $OUT/kernels_main.log | cut -c1-90
