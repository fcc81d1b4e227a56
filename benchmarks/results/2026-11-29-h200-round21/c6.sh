#!/bin/bash
# Round 21, call 6 (one H200; repository root, OUT set): the backward's preprocess, A/B of d430211
# (one warp a row, dq_accum zeroed by the binding) against 2c40325 (a thread per 16-byte chunk,
# dq_accum zeroed in the preprocess), d64 and d128 (scripts/bisect_fwd.sh: the whole backward
# against cuDNN, the sweep twice); then 2c40325's kernels one by one (kernel_times.py).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R=$PWD/benchmarks/results/2026-11-29-h200-round21
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
K=""
for d in 64 128; do for p in fwd bwd; do K="$K,sm90_${p}_bf16_hdim$d,sm90_${p}_bf16_hdim${d}_local"; done; done
JOBS=8 PASS=bwd DIMS=64,128 ONLY=${K#,} bash scripts/bisect_fwd.sh build/ab26
echo "ab done at ${SECONDS}s"
cd / && PYTHONPATH=$OLDPWD/build/ab26/2c40325 timeout 100 python3 $R/kernel_times.py 64:2048:1 128:2048:1 2>&1 | grep -v Warn | tee "$OUT/kernel-times-2c40325.txt"
echo "kernel times done at ${SECONDS}s"
