#!/bin/bash
# Round 15, the landing call (one H200; run from the repository root, OUT set): the full 9.0a
# build, the full GPU suite, then compute-sanitizer memcheck and synccheck on FP8 kernel cases
# (the d128 kernel with three stages among them: varlen d128, outliers d128).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s"; grep "flashattn build:" "$OUT/build.log" | tail -2
timeout 270 $PY -m pytest tests -m "gpu and not slow" -n 12 -q -p no:cacheprovider -ra > "$OUT/suite.log" 2>&1
echo "suite rc $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/suite.log" | tail -15
echo "suite done at ${SECONDS}s"
for tool in memcheck synccheck; do
  timeout 60 compute-sanitizer --tool $tool $PY -m pytest tests/test_fp8.py -q -p no:cacheprovider \
      -k "kernel_varlen or kernel_outliers" > "$OUT/san_$tool.log" 2>&1
  echo "$tool rc $?: $(grep -E 'ERROR SUMMARY|passed|failed' "$OUT/san_$tool.log" | tr '\n' ' ')"
done
echo "x1 done at ${SECONDS}s"
