#!/bin/bash
# Round 36, call 5 (one H200): call 4's tree (the d256 backward as two kernels in both modes), a
# kernels-only build of the bf16 d256 instantiations; Nsight Compute on one d256 8k backward (the dK/dV
# kernel and the dQ kernel: scripts/profile_bwd.sh, COUNT=2); then time36.py with three rounds (d256,
# default and deterministic against cuDNN, one process).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R=benchmarks/results/2026-11-30-h200-round36
rm -f flashattn/_C*.so
FLASHATTN_KERNELS_ONLY='sm90_*_bf16_hdim256*' MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s"
OUT="$OUT/prof" COUNT=2 FLASHATTN_KERNELS_ONLY='sm90_*_bf16_hdim256*' timeout 240 bash scripts/profile_bwd.sh 256 0 8192 2>&1 | tail -12
echo "profile rc $? at ${SECONDS}s"
rm -f "$OUT"/prof/*.ncu-rep "$OUT"/prof/*-source.csv
grep -E "^(==|Kernel|  [a-z])" "$OUT"/prof/bwd-d256-c0-stalls.txt | head -40
timeout $((280 - SECONDS)) $PY $R/time36.py --rounds=3 2>&1 | grep row
echo "done at ${SECONDS}s"
