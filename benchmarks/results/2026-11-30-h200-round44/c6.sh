#!/bin/bash
# Round 44, call 6: main's full 9.0a build, then compute-sanitizer (memcheck, racecheck, synccheck) over
# round 39's sanitize39.py (the unmasked default and deterministic backward, head dims 59-256).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
rm -f flashattn/_C*.so
FLASHATTN_FORCE_BUILD=1 MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s"
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
DRV=benchmarks/results/2026-11-30-h200-round39/sanitize39.py
for tool in memcheck racecheck synccheck; do
  [ $SECONDS -gt 370 ] && { echo "skip $tool"; continue; }
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=$PWD timeout -k 5 $((410 - SECONDS)) $CS --tool $tool $PY $DRV > "$OUT/$tool.log" 2>&1
  echo "$tool rc $? at ${SECONDS}s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|calls completed' "$OUT/$tool.log" | tr '\n' ' ')"
done
