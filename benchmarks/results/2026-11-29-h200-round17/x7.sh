#!/bin/bash
# Round 17, call 7 (the machine of call 6, warm; builds if fresh): compute-sanitizer racecheck over
# every kernel (scripts/sanitize.py, this GPU's tiles).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build (skipped if unchanged): $FLASHATTN_BUILD at ${SECONDS}s"
timeout ${SAN_S:-300} $PY scripts/sanitize.py "$OUT/sanitize" --tiles gpu --tools racecheck 2>&1 | tail -6
echo "x7 done at ${SECONDS}s"
