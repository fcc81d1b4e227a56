#!/bin/bash
# Round 28, call 5 (one H200; repository root, OUT set): main 232beb0 (the dequantising path's
# stored x descale in two passes, fp8.times; no kernel change since be75e19) -- the full 9.0a build,
# the full GPU suite, then `python -m benchmarks fp8` at d64 and d128, S 2k and 8k (the "FP8
# dequantised" column against call 3's, which ran the three-pass dequantisation).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s: $FLASHATTN_BUILD"
timeout 300 $PY -m pytest tests -m "gpu and not slow" -n 12 -q -p no:cacheprovider -ra > "$OUT/suite.log" 2>&1
echo "suite rc $? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" "$OUT/suite.log" | tail -8
timeout $((590 - SECONDS)) $PY -m benchmarks fp8 --head-dims 64,128 --seqlens 2048,8192 --out "$OUT/fp8" > "$OUT/fp8.log" 2>&1
echo "fp8 rc $? at ${SECONDS}s"; grep "^d" "$OUT/fp8.log"
