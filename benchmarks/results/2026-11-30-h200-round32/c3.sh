#!/bin/bash
# Round 32, call 3 (the same warm H200 right after call 2; nothing carried): the quick sweep's backward
# and forward + backward (bf16, d64/128/256, S 2k and 8k) with FlashAttention-3's and -4's kernels
# beside ours, SDPA flash and cuDNN, each checked against the reference before it is timed.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
PY=$(command -v python3)
export FLASHATTN_FA4_DIR=/tmp/fa4site FLASHATTN_FA3_LIB=/tmp/fa3/libfa3.so
timeout 540 $PY -m benchmarks sweep --quick --passes fwd,bwd,fwdbwd --backends flashattn,flash,cudnn,fa4,fa3 \
  --memory-seqlens '' --train-memory-seqlens '' --out "$OUT/sweep" > "$OUT/sweep.log" 2>&1
echo "sweep rc $? at ${SECONDS}s"
sed -n '/^### bf16/,$p' "$OUT/sweep/results.md" | cut -c1-250 | head -80
grep -iE "mismatch|error|Traceback" "$OUT/sweep.log" | head -8
