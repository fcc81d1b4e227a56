#!/bin/bash
# Round 18, call 1 (one H200; repository root, OUT set): FlashAttention-4's wheels, part 1, into /tmp;
# the full 9.0a build of next/own-key-tiles (ninja's log kept), the full GPU suite, then
# compute-sanitizer memcheck, initcheck and synccheck over every kernel (scripts/sanitize.py, this
# GPU's tiles).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
bash scripts/stage_fa4.sh part1
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s"; grep "flashattn build:" "$OUT/build.log" | tail -1 | cut -c1-200
find "$PWD" /tmp -name .ninja_log 2>/dev/null | head -2 | while read -r f; do cp "$f" "$OUT/ninja_log_$(basename "$(dirname "$f")").txt"; done
timeout 280 $PY -m pytest tests -m "gpu and not slow" -n 12 -q -p no:cacheprovider -ra > "$OUT/suite.log" 2>&1
echo "suite rc $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/suite.log" | tail -15
echo "suite done at ${SECONDS}s"
timeout $((570 - SECONDS)) $PY scripts/sanitize.py "$OUT/sanitize" --tiles gpu --tools memcheck,initcheck,synccheck 2>&1 | tail -8
echo "r1 done at ${SECONDS}s"
