#!/bin/bash
# Round 27, call 4 (one H200; repository root, OUT set): main-to-be 81e3d19 (FP8 d128 transposing v in
# the kernel) -- the full 9.0a build and the full GPU suite.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s: $FLASHATTN_BUILD"; grep "flashattn build: compiled" "$OUT/build.log" | tail -1 | cut -c1-160
grep -o "sm90_[a-z0-9_]*" "$OUT/build.log" | sort -u | tr '\n' ' '; echo
timeout $((590 - SECONDS)) $PY -m pytest tests -m "gpu and not slow" -n 12 -q -p no:cacheprovider -ra > "$OUT/suite.log" 2>&1
echo "suite rc $? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" "$OUT/suite.log" | tail -8
