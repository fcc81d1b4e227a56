#!/bin/bash
# Round 21, call 1 (one H200; repository root, OUT set): the backward's causal grid order, A/B of
# 77e7b11 (main) against 62fcef4 (longest key tiles first in L2-sized sections), d64/d128/d256,
# each tree a kernels-only build (scripts/bisect_fwd.sh: backward against cuDNN, the sweep twice);
# then Nsight Compute on the d256 backward (non-causal, unchanged by the commit): is its step
# waiting on its one Q/dO stage, on L2, or on its own chain (NOTES, twentieth session)?
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
K=""
for d in 64 128 256; do for p in fwd bwd; do K="$K,sm90_${p}_bf16_hdim$d,sm90_${p}_bf16_hdim${d}_local"; done; done
JOBS=8 PASS=bwd DIMS=64,128,256 ONLY=${K#,} bash scripts/bisect_fwd.sh build/ab21
echo "ab done at ${SECONDS}s"
R=benchmarks/results/2026-11-29-h200-round21
timeout 150 bash $R/ncu_bwd.sh build/ab21/62fcef4 256 0
echo "ncu done at ${SECONDS}s"
