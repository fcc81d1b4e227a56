#!/bin/bash
# Round 38, call 6: bimodal38.py in ten processes (0-63 MB of filler first), on call 3's build if kept.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
if ls flashattn/_C*.so > /dev/null 2>&1; then echo "build kept"; source scripts/env.sh > /tmp/env.log 2>&1; else
  FLASHATTN_KERNELS_ONLY='sm90_*_bf16_hdim128*' MAX_JOBS=16 python3 setup.py build_ext --inplace > /tmp/build.log 2>&1; PY=python3
  echo "rebuilt at ${SECONDS}s"; fi
for mb in 0 7 13 21 0 30 37 45 0 63; do
  timeout 60 $PY benchmarks/results/2026-11-30-h200-round38/bimodal38.py $mb 2>&1 | grep -v Warn | tee -a "$OUT/bimodal.log"
done
echo "done at ${SECONDS}s"
