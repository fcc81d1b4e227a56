#!/bin/bash
# Round 43, call 7: the README's main job, quick (`bash scripts/suite.sh --quick`), on this round's
# benchmarks/ (every do_bench warm-up HEAT_MS = 200 ms): does it run, how long does it take.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1 MAX_JOBS=16
SECONDS=0
timeout 560 bash scripts/suite.sh --quick --out "$OUT/suite" > "$OUT/suite.log" 2>&1
echo "suite rc $? at ${SECONDS}s"
grep -n "built in\|flashattn build:.*kernels\|took\|minutes\|elapsed" "$OUT/suite.log" | tail -8
tail -15 "$OUT/suite.log"
