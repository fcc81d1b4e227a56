#!/bin/bash
# Round 19, call 2 (the machine of call 1, warm; carry .fa4/b): FA4 part 2; racecheck (small sweep,
# this GPU's tiles); the families benchmark in bf16 (head dims 64-256, S 512-16k, sm90, sm80, cuDNN,
# SDPA flash, FA4) on main as it closes issue 18.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build (skipped if unchanged): $FLASHATTN_BUILD at ${SECONDS}s"
FLASHATTN_FA4_DIR=$(PY=$PY bash scripts/stage_fa4.sh part2) && export FLASHATTN_FA4_DIR
echo "fa4: ${FLASHATTN_FA4_DIR:-not staged} at ${SECONDS}s"
timeout ${SAN_S:-260} $PY scripts/sanitize.py "$OUT/san-race" --tiles gpu --tools racecheck 2>&1 | tail -5
echo "racecheck done at ${SECONDS}s"
timeout $((585 - SECONDS)) $PY -m benchmarks families --dtype bf16 --head-dims 64,96,128,192,256 \
    --seqlens 512,2048,8192,16384 --out "$OUT/families-bf16" > "$OUT/families-bf16.log" 2>&1
echo "families bf16 rc $? at ${SECONDS}s"; grep "^| " "$OUT/families-bf16/families.md" 2>/dev/null | cut -d'|' -f2-12
echo "x2 done at ${SECONDS}s"
