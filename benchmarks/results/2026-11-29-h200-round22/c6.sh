#!/bin/bash
# Round 22, call 6 (the same warm H200 as call 5; .fa4/b carried): FlashAttention-4 installed, then in
# one run: `python -m benchmarks sweep --quick --passes bwd,fwdbwd` (sm90 default, deterministic, SDPA
# flash and cuDNN, FA4; the training-step memory at S 8k and 64k), the same sweep of the sm80 family
# alone (FLASHATTN_FAMILY=sm80, a process of its own), and `python -m benchmarks fp8` at head dims 128
# and 256 with FA4's bf16 column.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
MAX_JOBS=16 source scripts/env.sh > "$OUT/env.log" 2>&1 || { tail -30 "$OUT/env.log"; exit 1; }
echo "env at ${SECONDS}s: $FLASHATTN_BUILD"
FLASHATTN_FA4_DIR=$(PY=$PY bash scripts/stage_fa4.sh part2) && export FLASHATTN_FA4_DIR
echo "FA4 dir: ${FLASHATTN_FA4_DIR:-none} at ${SECONDS}s"
timeout 300 $PY -m benchmarks sweep --quick --passes bwd,fwdbwd --backends flashattn,flashattn_det,flash,cudnn,fa4 \
  --out "$OUT/sweep" > "$OUT/sweep.log" 2>&1
echo "sweep rc $? at ${SECONDS}s"; tail -4 "$OUT/sweep.log"
FLASHATTN_FAMILY=sm80 timeout 150 $PY -m benchmarks sweep --quick --passes bwd,fwdbwd --backends flashattn \
  --memory-seqlens '' --train-memory-seqlens '' --out "$OUT/sweep-sm80" > "$OUT/sweep-sm80.log" 2>&1
echo "sm80 sweep rc $? at ${SECONDS}s"; tail -2 "$OUT/sweep-sm80.log"
timeout 150 $PY -m benchmarks fp8 --head-dims 128,256 --seqlens 2048,8192 --out "$OUT/fp8" > "$OUT/fp8.log" 2>&1
echo "fp8 rc $? at ${SECONDS}s"; tail -14 "$OUT/fp8.log"
ls -R "$OUT" | head -30
