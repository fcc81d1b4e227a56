#!/bin/bash
# Round 22, call 5 (one H200; repository root, OUT set, .fa4/a carried): main (5f4acb1) -- the full
# 9.0a build for the benchmarks of call 6, and FlashAttention-4's first wheel part into /tmp.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s: $FLASHATTN_BUILD"; grep "flashattn build: compiled" "$OUT/build.log" | tail -1 | cut -c1-120
bash scripts/stage_fa4.sh part1 && ls /tmp/fa4 | wc -l
