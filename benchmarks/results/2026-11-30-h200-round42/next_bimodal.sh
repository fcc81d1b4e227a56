#!/bin/bash
# Prepared in round 42 for the next session (not run): bimodal.py in eight processes for flashattn
# and four for cuDNN on a kernels-only bf16 d256 build of main. About 40 s of build and 8 s a process.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
PY=$(command -v python3)
R=benchmarks/results/2026-11-30-h200-round42
FLASHATTN_KERNELS_ONLY='sm90_fwd_bf16_hdim256*,sm90_bwd_bf16_hdim256*' MAX_JOBS=16 $PY setup.py build_ext --inplace > /tmp/build.log 2>&1
echo "build rc $? at ${SECONDS}s"
for i in 1 2 3 4 5 6 7 8; do
  PYTHONPATH=$PWD timeout 40 $PY $R/bimodal.py --rounds=5 > "$OUT/bimodal-fa-$i.log" 2>&1
  echo "flashattn $i at ${SECONDS}s: $(grep -E '^round' "$OUT/bimodal-fa-$i.log" | awk '{print $5}' | tr '\n' ' ') $(grep -m1 'overlapping' "$OUT/bimodal-fa-$i.log")"
done
for i in 1 2 3 4; do
  PYTHONPATH=$PWD timeout 40 $PY $R/bimodal.py --rounds=3 --backend=cudnn > "$OUT/bimodal-cudnn-$i.log" 2>&1
  echo "cudnn $i at ${SECONDS}s: $(grep -E '^round' "$OUT/bimodal-cudnn-$i.log" | awk '{print $5}' | tr '\n' ' ') $(grep -m1 '^call 1' "$OUT/bimodal-cudnn-$i.log" | cut -c1-60)"
done
echo "done at ${SECONDS}s"
