#!/bin/bash
# Round 17, call 3 (one H200; repository root, OUT set): FlashAttention-4's wheels, part 1, into /tmp;
# the full 9.0a build (ninja's log kept: each file's compile time); the full GPU suite.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
bash scripts/stage_fa4.sh part1
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader; ninja --version
MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s"; grep "flashattn build:" "$OUT/build.log" | tail -1 | cut -c1-400
find build -name .ninja_log -exec cp {} "$OUT/ninja_log.txt" \;
timeout 300 $PY -m pytest tests -m "gpu and not slow" -n 12 -q -p no:cacheprovider -ra > "$OUT/suite.log" 2>&1
echo "suite rc $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/suite.log" | tail -15
echo "x3 done at ${SECONDS}s"
