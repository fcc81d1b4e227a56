#!/bin/bash
# Round 17, call 5 (the machine of calls 3-4, warm; builds if fresh): compute-sanitizer's four tools
# over every kernel (scripts/sanitize.py, this GPU's tile configs).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build (skipped if unchanged): $FLASHATTN_BUILD at ${SECONDS}s"
timeout ${SAN_S:-520} $PY scripts/sanitize.py "$OUT/sanitize" --tiles gpu 2>&1 | tail -14
echo "x5 done at ${SECONDS}s"
