#!/bin/bash
# Round 14, second call (same machine, warm): FlashAttention-4's wheels, part 2, joined and installed
# into /tmp/fa4site; the FP8 benchmark (python -m benchmarks fp8) with FA4's bf16 rows.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
if [ -f /tmp/fa4/cu13.part-aa ]; then
  cp .fa4/b/* /tmp/fa4/ && cat /tmp/fa4/cu13.part-aa /tmp/fa4/cu13.part-ab \
      > /tmp/fa4/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl && rm /tmp/fa4/cu13.part-*
else
  echo "no FA4 part 1 here (a fresh machine): FA4 rows will say n/a"
fi
MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build (skipped if unchanged): $FLASHATTN_BUILD at ${SECONDS}s"
ls /tmp/fa4/*.whl > /dev/null 2>&1 && $PY -m pip install --no-index --no-deps --target /tmp/fa4site /tmp/fa4/*.whl > "$OUT/fa4_install.log" 2>&1
echo "fa4 install rc $? at ${SECONDS}s"
export FLASHATTN_FA4_DIR=/tmp/fa4site
$PY -m benchmarks fp8 --out "$OUT/fp8" 2>&1 | grep -v "^|---" | tail -40
echo "x2 done at ${SECONDS}s"
