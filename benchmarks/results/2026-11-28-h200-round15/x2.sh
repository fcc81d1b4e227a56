#!/bin/bash
# Round 15, after x1.sh on the same (warm) machine: racecheck on four FP8 d128 cases, the FP8
# benchmark (no FlashAttention-4 staged), memcheck on the sm90 d128 backward.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "env at ${SECONDS}s: $FLASHATTN_BUILD"
timeout 70 compute-sanitizer --tool racecheck $PY -m pytest tests/test_fp8.py -q -p no:cacheprovider \
    -k "(kernel_varlen or kernel_outliers) and d128" > "$OUT/san_racecheck.log" 2>&1
echo "racecheck rc $?: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|passed|failed' "$OUT/san_racecheck.log" | tr '\n' ' ')"
timeout 60 $PY -m benchmarks fp8 --head-dims 128,256 --seqlens 2048,8192 --out "$OUT/fp8" > "$OUT/fp8.log" 2>&1
echo "fp8 bench rc $? at ${SECONDS}s"; cat "$OUT"/fp8/*.md 2>/dev/null | tail -20
timeout 40 compute-sanitizer --tool memcheck $PY -m pytest tests/test_backward.py -q -p no:cacheprovider -x \
    -k "test_backward_gpu and d128 and bf16 and atomic" --maxfail=1 > "$OUT/san_bwd128.log" 2>&1
echo "bwd d128 memcheck rc $?: $(grep -E 'ERROR SUMMARY|passed|failed' "$OUT/san_bwd128.log" | tr '\n' ' ')"
echo "x2 done at ${SECONDS}s"
