#!/bin/bash
# Round 36, call 1 (one H200): the deterministic d256 backward as two kernels (the slice kernel without
# dQ, then bwd_dq_kernel). Full 9.0a build; c1_det256.py (gradients against the fp32 reference, bitwise
# repeats); if it passes, the full GPU suite; memcheck and racecheck over sanitize_det256.py; the d256
# backward rows of the sweep with the deterministic mode and cuDNN in one process.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R=benchmarks/results/2026-11-30-h200-round36
rm -f flashattn/_C*.so
FLASHATTN_FORCE_BUILD=1 MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s"
timeout 120 $PY $R/c1_det256.py > "$OUT/det256.log" 2>&1
rc=$?
echo "det256 rc $rc at ${SECONDS}s: $(tail -1 "$OUT/det256.log")"; grep -E "FAIL|Error|error" "$OUT/det256.log" | head -10 | cut -c1-300
if [ $rc -eq 0 ]; then
  timeout 290 $PY -m pytest tests -m "gpu and not slow" -n 12 -q -p no:cacheprovider -ra > "$OUT/tests.log" 2>&1
  echo "tests rc $? at ${SECONDS}s"; tail -3 "$OUT/tests.log" | cut -c1-200; grep -E "^FAILED|^ERROR" "$OUT/tests.log" | head -20 | cut -c1-250
fi
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck; do
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=$PWD timeout 45 $CS --tool $tool $PY $R/sanitize_det256.py > "$OUT/sanitize_$tool.log" 2>&1
  echo "$tool rc $? at ${SECONDS}s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|calls completed' "$OUT/sanitize_$tool.log" | tr '\n' ' ')"
done
timeout $((585 - SECONDS)) $PY -m benchmarks sweep --passes bwd --headdims 256 --seqlens 2048,8192 --dtypes bf16 \
  --backends flashattn,flashattn_det,cudnn --memory-seqlens '' --train-memory-seqlens '' --out "$OUT/sweep" > "$OUT/sweep.log" 2>&1
echo "sweep rc $? at ${SECONDS}s"
sed -n '/^### bf16/,$p' "$OUT/sweep/results.md" | cut -c1-260 | head -30
