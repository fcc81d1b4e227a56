#!/bin/bash
# Round 37, call 5 (one H200): main at 4c54f84 (the d256 dK/dV kernel at N = 80, S issued first). Full
# 9.0a build; smoke37.py (d256, both dtypes; bf16 deterministic); the full GPU suite; memcheck and
# racecheck over round 36's sanitize_det256.py; the backward rows of the sweep (d64/128/256, 2k/8k) with
# the deterministic mode, cuDNN and FA3 in one process.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R=benchmarks/results/2026-11-30-h200-round37
mkdir -p /tmp/fa3 && cp .fa3/lib/libfa3.so /tmp/fa3/ && export FLASHATTN_FA3_LIB=/tmp/fa3/libfa3.so
rm -f flashattn/_C*.so
FLASHATTN_FORCE_BUILD=1 MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s"; grep "flashattn build:" "$OUT/build.log" | tail -1 | cut -c1-200
timeout 100 $PY $R/smoke37.py --hdims=256 > "$OUT/smoke.log" 2>&1; rc1=$?
echo "smoke rc $rc1: $(tail -1 "$OUT/smoke.log")"
timeout 100 $PY $R/smoke37.py --hdims=256 --dtypes=bf16 --det >> "$OUT/smoke.log" 2>&1; rc2=$?
echo "smoke det rc $rc2: $(tail -1 "$OUT/smoke.log")"; grep FAIL "$OUT/smoke.log" | head -5 | cut -c1-250
timeout 290 $PY -m pytest tests -m "gpu and not slow" -n 12 -q -p no:cacheprovider -ra > "$OUT/tests.log" 2>&1
echo "tests rc $? at ${SECONDS}s"; tail -1 "$OUT/tests.log" | cut -c1-200; grep -E "^FAILED|^ERROR" "$OUT/tests.log" | head -20 | cut -c1-250
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck; do
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=$PWD timeout 45 $CS --tool $tool $PY benchmarks/results/2026-11-30-h200-round36/sanitize_det256.py > /tmp/sanitize_$tool.log 2>&1
  echo "$tool rc $? at ${SECONDS}s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|calls completed' /tmp/sanitize_$tool.log | tr '\n' ' ')"
done
timeout $((590 - SECONDS)) $PY -m benchmarks sweep --passes bwd --headdims 64,128,256 --seqlens 2048,8192 --dtypes bf16 \
  --backends flashattn,flashattn_det,cudnn,fa3 --memory-seqlens '' --train-memory-seqlens '' --out "$OUT/sweep" > /tmp/sweep.log 2>&1
echo "sweep rc $? at ${SECONDS}s"
sed -n '/^### bf16/,$p' "$OUT/sweep/results.md" | cut -c1-260 | head -24
