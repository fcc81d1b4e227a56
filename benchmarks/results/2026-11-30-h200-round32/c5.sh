#!/bin/bash
# Round 32, call 5 (a fresh H200; carries .fa3/lib): main with FP8 d128 key tiles of 192 under a mask
# too (exp/fp8-causal-192's one line, in the working tree): the full 9.0a build and the full GPU suite;
# `python -m benchmarks fp8` at d128 (FP8 beside our bf16, cuDNN and FlashAttention-3's FP8 and bf16,
# one process); memcheck over the sanitizer driver's FP8 calls.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
mkdir -p /tmp/fa3 && cp .fa3/lib/libfa3.so /tmp/fa3/
rm -f flashattn/_C*.so
FLASHATTN_FORCE_BUILD=1 MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s: $FLASHATTN_BUILD"; echo "$FLASHATTN_BUILD_SUMMARY" | cut -c1-300
timeout 300 $PY -m pytest tests -m "gpu and not slow" -n 12 -q -p no:cacheprovider -ra > "$OUT/suite.log" 2>&1
echo "suite rc $? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" "$OUT/suite.log" | tail -8 | cut -c1-300
FLASHATTN_FA3_LIB=/tmp/fa3/libfa3.so timeout 100 $PY -m benchmarks fp8 --out "$OUT/fp8" --head-dims 128 \
  --seqlens 2048,8192,16384 > "$OUT/fp8.log" 2>&1
echo "fp8 rc $? at ${SECONDS}s"; grep -E "^d[0-9]+ S" "$OUT/fp8.log" | cut -c1-260
PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=$PWD timeout 110 compute-sanitizer --tool memcheck $PY \
  benchmarks/results/2026-11-30-h200-round32/c4_sanitize_fp8.py "$PWD/scripts" > "$OUT/memcheck.log" 2>&1
echo "memcheck rc $? at ${SECONDS}s"; tail -3 "$OUT/memcheck.log"
