#!/bin/bash
# Round 33, call 4 (one H200; repository root, OUT set; carries .fa4/a and .fa3/lib): FlashAttention-4's
# first wheel part into /tmp/fa4; the full 9.0a build; the full GPU suite; c4_sanitize_d256.py under
# memcheck, racecheck and synccheck.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R=benchmarks/results/2026-11-30-h200-round33
bash scripts/stage_fa4.sh part1 > "$OUT/fa4.log" 2>&1 && echo "fa4 part1 staged"
mkdir -p /tmp/fa3 && cp .fa3/lib/libfa3.so /tmp/fa3/
rm -f flashattn/_C*.so
FLASHATTN_FORCE_BUILD=1 MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s: $FLASHATTN_BUILD"; grep "flashattn build: compiled" "$OUT/build.log" | tail -1
timeout 300 $PY -m pytest tests -m "gpu and not slow" -n 12 -q -p no:cacheprovider -ra > "$OUT/tests.log" 2>&1
echo "tests rc $? at ${SECONDS}s"; tail -4 "$OUT/tests.log"; grep -E "^FAILED|^ERROR" "$OUT/tests.log" | head -20
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck synccheck; do
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=$PWD timeout 150 $CS --tool $tool $PY $R/c4_sanitize_d256.py > "$OUT/sanitize_$tool.log" 2>&1
  echo "$tool rc $? at ${SECONDS}s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|calls completed' "$OUT/sanitize_$tool.log" | tr '\n' ' ')"
done
