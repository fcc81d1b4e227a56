#!/bin/bash
# Round 28, call 2 (one H200; repository root, OUT set; .fa4/a carried): main 3936395 (be75e19's
# sources: the raw value stages through StageOf, never run on a GPU before) -- FlashAttention-4's
# first wheel part into /tmp (scripts/stage_fa4.sh part1, for call 3 on the same warm machine), the
# full 9.0a build, the full GPU suite.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
bash scripts/stage_fa4.sh part1 && echo "fa4 part1 staged: $(ls /tmp/fa4 | wc -l) files"
MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s: $FLASHATTN_BUILD"; grep "flashattn build: compiled" "$OUT/build.log" | tail -1 | cut -c1-160
timeout $((590 - SECONDS)) $PY -m pytest tests -m "gpu and not slow" -n 12 -q -p no:cacheprovider -ra > "$OUT/suite.log" 2>&1
echo "suite rc $? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" "$OUT/suite.log" | tail -8
