#!/bin/bash
# Round 29, call 5 (one H200; repository root, OUT set): c5_lse.py on a kernels-only build of main
# (the FP8 and bf16 d128/d256 forwards).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
ONLY=sm90_fwd_fp8_bf16_hdim128,sm90_fwd_fp8_bf16_hdim256,sm90_fwd_bf16_hdim128,sm90_fwd_bf16_hdim256
FLASHATTN_KERNELS_ONLY=$ONLY MAX_JOBS=16 python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1
echo "build rc $? at ${SECONDS}s"
PYTHONPATH=$PWD timeout 200 python3 benchmarks/results/2026-11-29-h200-round29/c5_lse.py 2>&1 | tee "$OUT/lse.txt"
echo "done at ${SECONDS}s"
