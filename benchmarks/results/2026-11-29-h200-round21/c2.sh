#!/bin/bash
# Round 21, call 2 (one H200; repository root, OUT set): the backward's causal grid order again,
# A/B of 77e7b11 (main) against 3ec87f5 (the order's place computed once, in shared memory),
# d64/d128/d256, kernels-only builds (scripts/bisect_fwd.sh: backward against cuDNN, twice).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
K=""
for d in 64 128 256; do for p in fwd bwd; do K="$K,sm90_${p}_bf16_hdim$d,sm90_${p}_bf16_hdim${d}_local"; done; done
JOBS=8 PASS=bwd DIMS=64,128,256 ONLY=${K#,} bash scripts/bisect_fwd.sh build/ab22
echo "ab done at ${SECONDS}s"
