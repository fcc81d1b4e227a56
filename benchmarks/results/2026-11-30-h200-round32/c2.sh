#!/bin/bash
# Round 32, call 2 (the same warm H200 right after call 1; carries .fa4/b): FlashAttention-4 joined and
# installed; `python -m benchmarks fp8` with FlashAttention-3's FP8 and bf16 kernels (call 1's
# /tmp/fa3/libfa3.so) and FlashAttention-4's bf16 in the same rounds as ours and cuDNN's.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
PY=$(command -v python3)
FA4=$(PY=$PY bash scripts/stage_fa4.sh part2) && export FLASHATTN_FA4_DIR=$FA4 && echo "fa4 at $FA4"
export FLASHATTN_FA3_LIB=/tmp/fa3/libfa3.so
timeout 420 $PY -m benchmarks fp8 --out "$OUT/fp8" --head-dims 64,128,256 --seqlens 2048,8192,16384 \
  > "$OUT/fp8.log" 2>&1
echo "fp8 rc $? at ${SECONDS}s"; grep -E "^d[0-9]+ S" "$OUT/fp8.log" | cut -c1-330
grep -iE "error|Traceback|FlashAttention" "$OUT/fp8.log" | head -8
