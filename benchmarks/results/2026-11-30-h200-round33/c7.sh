#!/bin/bash
# Round 33, call 7 (the last device time): the staged d256 epilogue (exp/d256-staged-epilogue),
# kernels-only build of the d256 instantiations; the GPU tests whose ids name d256; memcheck and
# racecheck over c4_sanitize_d256.py.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R=benchmarks/results/2026-11-30-h200-round33
rm -f flashattn/_C*.so
FLASHATTN_KERNELS_ONLY='sm90_*hdim256*' FLASHATTN_FORCE_BUILD=1 MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s: $FLASHATTN_BUILD"
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck; do
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=$PWD timeout 40 $CS --tool $tool $PY $R/c4_sanitize_d256.py > "$OUT/sanitize_$tool.log" 2>&1
  echo "$tool rc $? at ${SECONDS}s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|calls completed' "$OUT/sanitize_$tool.log" | tr '\n' ' ')"
done
timeout 100 $PY -m pytest tests -m "gpu and not slow" -k "d256" -n 12 -q -p no:cacheprovider > "$OUT/tests.log" 2>&1
echo "tests rc $? at ${SECONDS}s"; tail -3 "$OUT/tests.log"; grep -E "^FAILED|^ERROR" "$OUT/tests.log" | cut -c1-200 | head -20
