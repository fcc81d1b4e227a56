#!/bin/bash
# Round 38, call 7 (a fresh H200): the d128 S = 8192 backward's spread, ours and cuDNN: spread38.py (eight
# rounds in one process) in two processes; kernels-only build of the d128 bf16 instantiations (089f42f).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
PY=$(command -v python3)
rm -f flashattn/_C*.so
FLASHATTN_KERNELS_ONLY='sm90_fwd_bf16_hdim128*,sm90_bwd_bf16_hdim128*' MAX_JOBS=16 $PY setup.py build_ext --inplace > /tmp/build.log 2>&1
echo "build rc $? at ${SECONDS}s"
for p in 1 2; do
  echo "== process $p at ${SECONDS}s"
  PYTHONPATH=$PWD timeout $((225 - SECONDS)) $PY benchmarks/results/2026-11-30-h200-round38/spread38.py 2>&1 | grep -v Warn | tee -a "$OUT/spread.log"
done
echo "done at ${SECONDS}s"
