#!/bin/bash
# Round 33, call 5 (the same warm H200 right after call 4; carries .fa4/b and .fa3/lib): FlashAttention-4's
# second wheel part; the quick sweep's backward and forward + backward (bf16, d64/128/256, S 2k and 8k)
# with ours (default and deterministic), SDPA flash, cuDNN, FlashAttention-4 and -3 in one process, each
# checked against the reference before it is timed. Call 4's build (env.sh finds it current).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
PY=$(command -v python3)
FA4=$(PY=$PY bash scripts/stage_fa4.sh part2) && export FLASHATTN_FA4_DIR=$FA4 && echo "fa4 at $FA4"
mkdir -p /tmp/fa3 && cp .fa3/lib/libfa3.so /tmp/fa3/ && export FLASHATTN_FA3_LIB=/tmp/fa3/libfa3.so
source scripts/env.sh > "$OUT/env.log" 2>&1 || { tail -20 "$OUT/env.log"; exit 1; }
echo "env: $FLASHATTN_BUILD at ${SECONDS}s"
timeout 480 $PY -m benchmarks sweep --quick --passes bwd,fwdbwd --backends flashattn,flashattn_det,flash,cudnn,fa4,fa3 \
  --memory-seqlens '' --train-memory-seqlens '' --out "$OUT/sweep" > "$OUT/sweep.log" 2>&1
echo "sweep rc $? at ${SECONDS}s"
sed -n '/^### bf16/,$p' "$OUT/sweep/results.md" | cut -c1-260 | head -60
grep -iE "mismatch|error|Traceback" "$OUT/sweep.log" | head -8
