#!/bin/bash
# Round 34, call 5 (one H200): main (3808455, csrc as landed in round 33: the staged d256 epilogue) with the
# full 9.0a build; the full GPU suite; round 33's c4_sanitize_d256.py under memcheck and racecheck.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R33=benchmarks/results/2026-11-30-h200-round33
rm -f flashattn/_C*.so
FLASHATTN_FORCE_BUILD=1 MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s: $FLASHATTN_BUILD"; grep "flashattn build: compiled" "$OUT/build.log" | tail -1 | cut -c1-300
timeout 300 $PY -m pytest tests -m "gpu and not slow" -n 12 -q -p no:cacheprovider -ra > "$OUT/tests.log" 2>&1
echo "tests rc $? at ${SECONDS}s"; tail -4 "$OUT/tests.log"; grep -E "^FAILED|^ERROR" "$OUT/tests.log" | head -20
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck; do
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=$PWD timeout 60 $CS --tool $tool $PY $R33/c4_sanitize_d256.py > "$OUT/sanitize_$tool.log" 2>&1
  echo "$tool rc $? at ${SECONDS}s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|calls completed' "$OUT/sanitize_$tool.log" | tr '\n' ' ')"
done
