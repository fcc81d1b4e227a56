#!/bin/bash
# Round 36, call 7 (the same warm H200 right after call 6; carries .fa4/b and .fa3/lib): FlashAttention-4's
# second wheel part; a kernels-only build of call 4's tree (every sm90 bf16 d64, d128 and d256
# instantiation); the backward rows of the sweep (bf16, d64/128/256, S 2k and 8k, causal and not) with
# ours (default and deterministic), cuDNN, FlashAttention-4 and -3 in one process.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
PY=$(command -v python3)
FA4=$(PY=$PY bash scripts/stage_fa4.sh part2) && export FLASHATTN_FA4_DIR=$FA4 && echo "fa4 at $FA4"
mkdir -p /tmp/fa3 && cp .fa3/lib/libfa3.so /tmp/fa3/ && export FLASHATTN_FA3_LIB=/tmp/fa3/libfa3.so
rm -f flashattn/_C*.so
FLASHATTN_KERNELS_ONLY='sm90_*_bf16_hdim64*,sm90_*_bf16_hdim128*,sm90_*_bf16_hdim256*' MAX_JOBS=16 $PY setup.py build_ext --inplace > /tmp/build.log 2>&1
echo "build rc $? at ${SECONDS}s"
timeout $((290 - SECONDS)) $PY -m benchmarks sweep --passes bwd --headdims 64,128,256 --seqlens 2048,8192 --dtypes bf16 \
  --backends flashattn,flashattn_det,cudnn,fa4,fa3 --memory-seqlens '' --train-memory-seqlens '' --out "$OUT/sweep" > "$OUT/sweep.log" 2>&1
echo "sweep rc $? at ${SECONDS}s"
sed -n '/^### bf16/,$p' "$OUT/sweep/results.md" | cut -c1-300 | head -30
grep -iE "mismatch|error|Traceback" "$OUT/sweep.log" | head -8
