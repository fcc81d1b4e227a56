#!/bin/bash
# Round 19, call 1 (one H200; repository root, OUT set; carry .fa4/a): FA4 part 1 staged into /tmp;
# the full 9.0a build of main with the NVTX initcheck marking; the full GPU suite; memcheck and
# synccheck (this GPU's tiles); then initcheck (full sweep) with what time is left.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
bash scripts/stage_fa4.sh part1 && echo "fa4 part1 staged"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s"; grep "flashattn build:" "$OUT/build.log" | tail -1 | cut -c1-200
timeout 280 $PY -m pytest tests -m "gpu and not slow" -n 12 -q -p no:cacheprovider -ra > "$OUT/suite.log" 2>&1
echo "suite rc $? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" "$OUT/suite.log" | tail -15
timeout 120 $PY scripts/sanitize.py "$OUT/san-mem-sync" --tiles gpu --tools memcheck,synccheck 2>&1 | tail -6
echo "memcheck+synccheck done at ${SECONDS}s"
timeout $((585 - SECONDS)) $PY scripts/sanitize.py "$OUT/san-init" --tiles gpu --tools initcheck 2>&1 | tail -5
echo "x1 done at ${SECONDS}s"
