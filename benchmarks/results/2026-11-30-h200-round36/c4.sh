#!/bin/bash
# Round 36, call 4 (one H200): the d256 backward as two kernels in both modes (the dK/dV slice kernel, then
# bwd_dq_kernel launched behind it with programmatic stream serialization); the reds path, dq_tiles.h and
# its conversion removed. Full 9.0a build; c1_det256.py and round 33's c1_smoke.py (default mode);
# the full GPU suite; memcheck and racecheck over sanitize_det256.py; pdl_check.py; the backward rows of
# the sweep (d64/128/256, 2k/8k) with the deterministic mode, cuDNN and FA3 in one process.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R=benchmarks/results/2026-11-30-h200-round36
R33=benchmarks/results/2026-11-30-h200-round33
mkdir -p /tmp/fa3 && cp .fa3/lib/libfa3.so /tmp/fa3/ && export FLASHATTN_FA3_LIB=/tmp/fa3/libfa3.so
rm -f flashattn/_C*.so
FLASHATTN_FORCE_BUILD=1 MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s"
timeout 100 $PY $R/c1_det256.py > "$OUT/det256.log" 2>&1; rc1=$?
echo "det256 rc $rc1: $(tail -1 "$OUT/det256.log")"; grep FAIL "$OUT/det256.log" | head -5 | cut -c1-250
timeout 100 $PY $R33/c1_smoke.py > "$OUT/smoke.log" 2>&1; rc2=$?
echo "smoke (default) rc $rc2: $(grep -c ': ok$' "$OUT/smoke.log") ok; $(tail -1 "$OUT/smoke.log")"; grep FAIL "$OUT/smoke.log" | head -5 | cut -c1-250
if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ]; then
  timeout 290 $PY -m pytest tests -m "gpu and not slow" -n 12 -q -p no:cacheprovider -ra > "$OUT/tests.log" 2>&1
  echo "tests rc $? at ${SECONDS}s"; tail -1 "$OUT/tests.log" | cut -c1-200; grep -E "^FAILED|^ERROR" "$OUT/tests.log" | head -20 | cut -c1-250
fi
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck; do
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=$PWD timeout 45 $CS --tool $tool $PY $R/sanitize_det256.py > "$OUT/sanitize_$tool.log" 2>&1
  echo "$tool rc $? at ${SECONDS}s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|calls completed' "$OUT/sanitize_$tool.log" | tr '\n' ' ')"
done
timeout 30 $PY $R/pdl_check.py > "$OUT/pdl_check.log" 2>&1; echo "pdl_check rc $?"; grep -v Warn "$OUT/pdl_check.log" | cut -c1-110
timeout $((590 - SECONDS)) $PY -m benchmarks sweep --passes bwd --headdims 64,128,256 --seqlens 2048,8192 --dtypes bf16 \
  --backends flashattn,flashattn_det,cudnn,fa3 --memory-seqlens '' --train-memory-seqlens '' --out "$OUT/sweep" > "$OUT/sweep.log" 2>&1
echo "sweep rc $? at ${SECONDS}s"
sed -n '/^### bf16/,$p' "$OUT/sweep/results.md" | cut -c1-260 | head -24
