#!/bin/bash
# Round 41, call 5: main with the d256 change (all of P loaded before dS is stored; the LSE read
# while S runs): full 9.0a build, full GPU suite, memcheck over round 36's sanitize_det256.py.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R36=benchmarks/results/2026-11-30-h200-round36
rm -f flashattn/_C*.so
FLASHATTN_FORCE_BUILD=1 MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s"; grep "flashattn build:" "$OUT/build.log" | tail -1 | cut -c1-300
timeout $((470 - SECONDS)) $PY -m pytest tests -m "gpu and not slow" -n 12 -q -p no:cacheprovider -ra > "$OUT/tests.log" 2>&1
echo "tests rc $? at ${SECONDS}s"; tail -1 "$OUT/tests.log" | cut -c1-200; grep -E "^FAILED|^ERROR" "$OUT/tests.log" | head -20 | cut -c1-250
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ $SECONDS -lt 480 ]; then
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=$PWD timeout $((585 - SECONDS)) $CS --tool memcheck $PY $R36/sanitize_det256.py > "$OUT/memcheck.log" 2>&1
  echo "memcheck rc $? at ${SECONDS}s: $(grep -E 'ERROR SUMMARY|calls completed' "$OUT/memcheck.log" | tr '\n' ' ')"
else
  echo "skip memcheck"
fi
echo "done at ${SECONDS}s"
