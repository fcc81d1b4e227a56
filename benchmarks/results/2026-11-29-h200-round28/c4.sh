#!/bin/bash
# Round 28, call 4 (one H200; repository root, OUT set): main (be75e19's sources) -- the full 9.0a
# build, then `python -m benchmarks features` (issue 21's rows on this machine today: sinks, combine,
# MLA's 192 / 128 against v padded to 192, head dim 512; and varlen, windows, extras), fwd and
# fwd + bwd, every backend of a case in one run.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s: $FLASHATTN_BUILD"
timeout $((590 - SECONDS)) $PY -m benchmarks features --out "$OUT/features" > "$OUT/features.log" 2>&1
echo "features rc $? at ${SECONDS}s"; tail -5 "$OUT/features.log"
grep -A40 "### Learnable sinks" "$OUT/features/features.md" | head -60
