#!/bin/bash
# Round 43, call 5 (carry .fa4/a) then 6 (carry .fa4/b, the same warm machine): FA4's two parts; a
# kernels-only bf16 d256 build of main in call 5; power43.py in call 6 with nvidia-smi every 20 ms.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1 MAX_JOBS=16
SECONDS=0
PY=$(command -v python3)
R=benchmarks/results/2026-11-30-h200-round43
case "$1" in
  part1)
    bash scripts/stage_fa4.sh part1 && echo "fa4 part 1 staged"
    FLASHATTN_KERNELS_ONLY='sm90_fwd_bf16_hdim256,sm90_fwd_bf16_hdim256_local,sm90_bwd_bf16_hdim256,sm90_bwd_bf16_hdim256_local' \
      $PY setup.py build_ext --inplace > /tmp/build.log 2>&1
    echo "build rc $? at ${SECONDS}s" ;;
  part2)
    FA4=$(PY=$PY bash scripts/stage_fa4.sh part2) && export FLASHATTN_FA4_DIR=$FA4 && echo "fa4 at $FA4"
    nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader -lms 20 > "$OUT/smi.csv" 2>&1 &
    SMI=$!
    PYTHONPATH=$PWD timeout 200 $PY $R/power43.py 2>&1 | grep -v Warn | tee "$OUT/power.log"
    kill $SMI
    $PY $R/power43_read.py "$OUT/power.log" "$OUT/smi.csv"
    echo "done at ${SECONDS}s" ;;
esac
