#!/bin/bash
# Round 21, call 4 (one H200; repository root, OUT set): the d256 backward with two Q/dO stages,
# A/B of 77e7b11 (main) against d430211 (the same, each stage released before the next dS barrier),
# kernels-only builds (scripts/bisect_fwd.sh: backward against cuDNN, the sweep twice); then
# Nsight Compute on the new d256 backward (non-causal), as call 1 did on main's.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
JOBS=8 PASS=bwd DIMS=256 ONLY=sm90_fwd_bf16_hdim256,sm90_fwd_bf16_hdim256_local,sm90_bwd_bf16_hdim256,sm90_bwd_bf16_hdim256_local bash scripts/bisect_fwd.sh build/ab24
echo "ab done at ${SECONDS}s"
timeout 150 bash benchmarks/results/2026-11-29-h200-round21/ncu_bwd.sh build/ab24/d430211 256 0
echo "ncu done at ${SECONDS}s"
