#!/bin/bash
# Round 19, call 5 (one H200, fresh): main with the relative-bounds mask: the full 9.0a build (spill
# warnings counted), the full GPU suite, memcheck (full), initcheck (full) and synccheck (small) on this
# GPU's tiles, then the families in bf16 at d64/d128/d256, S 2k/8k (sm90, sm80, cuDNN, SDPA flash).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s"; grep "flashattn build:" "$OUT/build.log" | tail -1 | cut -c1-120
timeout 280 $PY -m pytest tests -m "gpu and not slow" -n 12 -q -p no:cacheprovider -ra > "$OUT/suite.log" 2>&1
echo "suite rc $? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" "$OUT/suite.log" | tail -15
timeout 120 $PY scripts/sanitize.py "$OUT/sanitize" --tiles gpu --tools memcheck,initcheck,synccheck 2>&1 | tail -7
echo "sanitizer done at ${SECONDS}s"
timeout $((585 - SECONDS)) $PY -m benchmarks families --dtype bf16 --head-dims 64,128,256 \
    --seqlens 2048,8192 --out "$OUT/families-bf16" > "$OUT/families-bf16.log" 2>&1
echo "families rc $? at ${SECONDS}s"; grep "^| " "$OUT/families-bf16/families.md" 2>/dev/null | cut -d'|' -f2-12
echo "x5 done at ${SECONDS}s"
