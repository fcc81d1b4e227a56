#!/bin/bash
# Round 38, call 4 (the warm H200 right after call 3, whose full 9.0a build of the working tree it uses;
# rebuilt if the machine is a fresh one): the full GPU suite; the two grid-limit tests of tests/test_family.py
# (one marked slow); memcheck and racecheck over sanitize38.py (the masked default backward at d64-d256) and
# round 36's sanitize_det256.py; power38.py (clock and power while ours, FA3 and cuDNN run).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R=benchmarks/results/2026-11-30-h200-round38
mkdir -p /tmp/fa3 && cp .fa3/lib/libfa3.so /tmp/fa3/ && export FLASHATTN_FA3_LIB=/tmp/fa3/libfa3.so
if ls flashattn/_C*.so > /dev/null 2>&1; then echo "build kept"; source scripts/env.sh > /tmp/env.log 2>&1; else
  FLASHATTN_FORCE_BUILD=1 MAX_JOBS=16 source scripts/env.sh > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
  echo "rebuilt at ${SECONDS}s"; fi
$PY -c "import flashattn, sys; print(flashattn.__file__)"
timeout 290 $PY -m pytest tests -m "gpu and not slow" -n 12 -q -p no:cacheprovider -ra > "$OUT/tests.log" 2>&1
echo "tests rc $? at ${SECONDS}s"; tail -1 "$OUT/tests.log" | cut -c1-200; grep -E "^FAILED|^ERROR" "$OUT/tests.log" | head -20 | cut -c1-250
timeout 120 $PY -m pytest tests/test_family.py -k "grid_holds" -q -p no:cacheprovider -ra > "$OUT/grid_tests.log" 2>&1
echo "grid tests rc $? at ${SECONDS}s: $(tail -1 "$OUT/grid_tests.log" | cut -c1-200)"
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck; do
  for s in $R/sanitize38.py benchmarks/results/2026-11-30-h200-round36/sanitize_det256.py; do
    [ $SECONDS -gt 520 ] && { echo "skip $tool $s"; continue; }
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=$PWD timeout $((560 - SECONDS)) $CS --tool $tool $PY $s > /tmp/san.log 2>&1
    echo "$tool $(basename $s) rc $? at ${SECONDS}s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|calls completed' /tmp/san.log | tr '\n' ' ')"
  done
done
timeout $((590 - SECONDS)) $PY $R/power38.py 2>&1 | grep -v Warn | tee "$OUT/power.log"
echo "done at ${SECONDS}s"
