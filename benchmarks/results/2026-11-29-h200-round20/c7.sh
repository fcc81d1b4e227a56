#!/bin/bash
# Round 20, call 7 (the same warm H200 as call 6; carry .fa4/b): FA4 part 2 joined and installed; the
# backward of main (2e3ba1d) against cuDNN and FlashAttention-4 (round 13's bench_bwd.py), one process.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build: $FLASHATTN_BUILD at ${SECONDS}s"
export FLASHATTN_FA4_DIR=$(PY=$PY bash scripts/stage_fa4.sh part2)
echo "fa4: ${FLASHATTN_FA4_DIR:-not staged} at ${SECONDS}s"
PYTHONPATH=$PWD timeout 240 $PY benchmarks/results/2026-11-28-h200-round13/bench_bwd.py 64 128 256 2> "$OUT/bwd.err" | tee "$OUT/bwd.md"
tail -3 "$OUT/bwd.err"; echo "bwd done at ${SECONDS}s"
