#!/bin/bash
# Round 42, call 5: main with both changes (cbb033f, 3ed0c1e): full 9.0a build, full GPU suite,
# memcheck over round 39's sanitize39.py (unmasked default and deterministic backward, d59-d256) and
# round 36's sanitize_det256.py (d256 masked, softcap, packed).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R36=benchmarks/results/2026-11-30-h200-round36
R39=benchmarks/results/2026-11-30-h200-round39
rm -f flashattn/_C*.so
FLASHATTN_FORCE_BUILD=1 MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s"; grep "flashattn build:" "$OUT/build.log" | tail -1 | cut -c1-300
timeout $((440 - SECONDS)) $PY -m pytest tests -m "gpu and not slow" -n 12 -q -p no:cacheprovider -ra > "$OUT/tests.log" 2>&1
echo "tests rc $? at ${SECONDS}s"; tail -1 "$OUT/tests.log" | cut -c1-200; grep -E "^FAILED|^ERROR" "$OUT/tests.log" | head -20 | cut -c1-250
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for drv in $R36/sanitize_det256.py $R39/sanitize39.py; do
  [ $SECONDS -gt 540 ] && { echo "skip memcheck $drv"; continue; }
  n=$(basename $drv .py)
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=$PWD timeout $((590 - SECONDS)) $CS --tool memcheck $PY $drv > "$OUT/memcheck-$n.log" 2>&1
  echo "memcheck $n rc $? at ${SECONDS}s: $(grep -E 'ERROR SUMMARY|calls completed' "$OUT/memcheck-$n.log" | tr '\n' ' ')"
done
echo "done at ${SECONDS}s"
