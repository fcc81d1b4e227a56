#!/bin/bash
# Round 32, call 1 (one H200; repository root, OUT set; carries .fa4/a and .fa3/lib): FlashAttention-4's
# first wheel part into /tmp/fa4; main's full 9.0a build; FlashAttention-3's library (scripts/stage_fa3.sh,
# built on the CPU machine) checked against the reference beside our kernels (c1_fa3_smoke.py).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
bash scripts/stage_fa4.sh part1 && echo "fa4 part1 staged"
mkdir -p /tmp/fa3 && cp .fa3/lib/libfa3.so /tmp/fa3/ && echo "fa3 library in /tmp/fa3"
rm -f flashattn/_C*.so
FLASHATTN_FORCE_BUILD=1 MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s: $FLASHATTN_BUILD"
FLASHATTN_FA3_LIB=/tmp/fa3/libfa3.so PYTHONPATH=$PWD timeout 200 $PY \
  benchmarks/results/2026-11-30-h200-round32/c1_fa3_smoke.py > "$OUT/fa3_smoke.log" 2>&1
echo "smoke rc $? at ${SECONDS}s"; cat "$OUT/fa3_smoke.log" | cut -c1-400 | tail -40
