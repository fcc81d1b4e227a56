#!/bin/bash
# Round 24, call 4 (the warm H200 of call 3, which ran round 22's c5.sh: the full 9.0a build of main
# 210101e and FlashAttention-4's first wheel part into /tmp; .fa4/b carried): FlashAttention-4
# installed, then in one process the backward and forward + backward sweep (sm90 default and
# deterministic, SDPA flash, cuDNN, FA4), then the FP8 forward at head dims 128 and 256. Round 22's
# c6.sh without its sm80 sweep (device time).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
MAX_JOBS=16 source scripts/env.sh > "$OUT/env.log" 2>&1; echo "env at ${SECONDS}s"
FLASHATTN_FA4_DIR=$(PY=$PY bash scripts/stage_fa4.sh part2) && export FLASHATTN_FA4_DIR
echo "FA4 ${FLASHATTN_FA4_DIR:-none} at ${SECONDS}s"
timeout 300 $PY -m benchmarks sweep --quick --passes bwd,fwdbwd --backends flashattn,flashattn_det,flash,cudnn,fa4 \
  --out "$OUT/sweep" > "$OUT/sweep.log" 2>&1
echo "sweep rc $? at ${SECONDS}s"; tail -3 "$OUT/sweep.log"
timeout 120 $PY -m benchmarks fp8 --head-dims 128,256 --seqlens 2048,8192 --out "$OUT/fp8" > "$OUT/fp8.log" 2>&1
echo "fp8 rc $? at ${SECONDS}s"; tail -14 "$OUT/fp8.log"
