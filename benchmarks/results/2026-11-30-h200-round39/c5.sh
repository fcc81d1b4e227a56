#!/bin/bash
# Round 39, call 5 (the warm H200 of call 4, its full build of B): memcheck, racecheck and synccheck over
# sanitize39.py (the unmasked default backward, its grids' tails in parts); then, as time allows, the
# sweep's backward rows again (--rounds 3, cuDNN).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R=benchmarks/results/2026-11-30-h200-round39
if ls flashattn/_C*.so > /dev/null 2>&1; then echo "build kept"; source scripts/env.sh > /tmp/env.log 2>&1; else echo "no build: a fresh machine"; exit 1; fi
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck synccheck; do
  [ $SECONDS -gt 400 ] && { echo "skip $tool"; continue; }
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=$PWD timeout $((470 - SECONDS)) $CS --tool $tool $PY $R/sanitize39.py > /tmp/san.log 2>&1
  echo "$tool rc $? at ${SECONDS}s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|calls completed' /tmp/san.log | tr '\n' ' ')"
  cp /tmp/san.log "$OUT/$tool.log"
done
[ $SECONDS -lt 430 ] && timeout $((540 - SECONDS)) $PY -m benchmarks sweep --passes bwd --headdims 128,256 --seqlens 2048,8192 --dtypes bf16 \
  --backends flashattn,cudnn --rounds 3 --memory-seqlens '' --train-memory-seqlens '' --out "$OUT/sweep" > "$OUT/sweep.log" 2>&1
echo "sweep rc $? at ${SECONDS}s"
sed -n '/^### bf16/,$p' "$OUT/sweep/results.md" 2>/dev/null | cut -c1-200 | head -12
