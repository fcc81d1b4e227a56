#!/bin/bash
# Round 14, first call (one H200; run from the repository root, OUT set): FlashAttention-4's wheels,
# part 1, into /tmp; the full 9.0a build; the full GPU suite (the FP8 kernel's tests in it);
# compute-sanitizer memcheck, racecheck and synccheck on FP8 cases, memcheck on the d128 backward.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
mkdir -p /tmp/fa4 && cp .fa4/a/* /tmp/fa4/
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s"; grep "flashattn build:" "$OUT/build.log" | tail -2
$PY -m pytest tests -m "gpu and not slow" -n 12 -q -p no:cacheprovider -ra > "$OUT/suite.log" 2>&1
echo "suite rc $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/suite.log" | tail -15
echo "suite done at ${SECONDS}s"
$PY -m pytest tests/test_fp8.py -m gpu -q -p no:cacheprovider -s -k "within_the_fp8_bound and 128 and 2049" 2>&1 | grep -i "err" | head -6
for tool in memcheck racecheck synccheck; do
  timeout 120 compute-sanitizer --tool $tool $PY -m pytest tests/test_fp8.py -q -p no:cacheprovider \
      -k "kernel_varlen or (kernel_sliding_window and bf16) or kernel_outliers" > "$OUT/san_$tool.log" 2>&1
  echo "$tool rc $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|passed|failed' "$OUT/san_$tool.log" | tr '\n' ' ')"
done
timeout 90 compute-sanitizer --tool memcheck $PY -m pytest tests/test_bwd.py -q -p no:cacheprovider -x \
    -k "128 and not deterministic" --maxfail=1 > "$OUT/san_bwd128.log" 2>&1
echo "bwd d128 memcheck rc $?: $(grep -E 'ERROR SUMMARY|passed|failed' "$OUT/san_bwd128.log" | tr '\n' ' ')"
echo "x1 done at ${SECONDS}s"
