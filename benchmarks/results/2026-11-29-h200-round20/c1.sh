#!/bin/bash
# Round 20, call 1 (one H200; repository root, OUT set): main's sm90 d64/d128/d256 bf16 kernels only
# (FLASHATTN_KERNELS_ONLY), the backward timed against cuDNN (scripts/bisect_fwd.py, PASS bwd), then
# Nsight Compute on the backward's main kernel with cuDNN's kernels beside it (scripts/profile_bwd.sh).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1 MAX_JOBS=16
export FLASHATTN_KERNELS_ONLY="sm90_fwd_bf16_hdim64,sm90_fwd_bf16_hdim64_local,sm90_bwd_bf16_hdim64,sm90_bwd_bf16_hdim64_local,sm90_fwd_bf16_hdim128,sm90_fwd_bf16_hdim128_local,sm90_bwd_bf16_hdim128,sm90_bwd_bf16_hdim128_local,sm90_fwd_bf16_hdim256,sm90_fwd_bf16_hdim256_local,sm90_bwd_bf16_hdim256,sm90_bwd_bf16_hdim256_local"
SECONDS=0
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s"; grep "flashattn build:" "$OUT/build.log" | tail -1 | cut -c1-300
(cd / && PYTHONPATH=$OLDPWD $PY $OLDPWD/scripts/bisect_fwd.py main 64,128,256 bwd 2>&1) | tee "$OUT/bwd-main.jsonl" || true
echo "bench done at ${SECONDS}s"
for cfg in "128 0" "128 1" "256 0" "64 0"; do
  OUT="$OUT/prof" BASELINE=1 COUNT=4 timeout 150 bash scripts/profile_bwd.sh $cfg 2>&1 | tail -8
  echo "profile $cfg done at ${SECONDS}s"
  [ $SECONDS -gt 480 ] && break
done
