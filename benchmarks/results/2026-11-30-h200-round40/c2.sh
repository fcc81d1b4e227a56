#!/bin/bash
# Round 40, call 2 (call 1's warm H200 and its V8 build; carries .fa4/b, .fa3/lib): FA4's second part;
# memcheck, racecheck, synccheck over round 39's sanitize39.py; the sweep's backward rows (--rounds 3,
# ours default and deterministic, cuDNN, FA4, FA3).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R39=benchmarks/results/2026-11-30-h200-round39
FA4=$(PY=$(command -v python3) bash scripts/stage_fa4.sh part2) && export FLASHATTN_FA4_DIR=$FA4 && echo "fa4 at $FA4"
mkdir -p /tmp/fa3 && cp .fa3/lib/libfa3.so /tmp/fa3/ && export FLASHATTN_FA3_LIB=/tmp/fa3/libfa3.so
if ls flashattn/_C*.so > /dev/null 2>&1; then echo "build kept"; source scripts/env.sh > /tmp/env.log 2>&1; else echo "no build: a fresh machine"; exit 1; fi
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck synccheck; do
  [ $SECONDS -gt 380 ] && { echo "skip $tool"; continue; }
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=$PWD timeout $((450 - SECONDS)) $CS --tool $tool $PY $R39/sanitize39.py > /tmp/san.log 2>&1
  echo "$tool rc $? at ${SECONDS}s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|calls completed' /tmp/san.log | tr '\n' ' ')"
  cp /tmp/san.log "$OUT/$tool.log"
done
timeout $((595 - SECONDS)) $PY -m benchmarks sweep --passes bwd --headdims 64,128,256 --seqlens 2048,8192 --dtypes bf16 \
  --backends flashattn,flashattn_det,cudnn,fa4,fa3 --rounds 3 --memory-seqlens '' --train-memory-seqlens '' \
  --out "$OUT/sweep" > "$OUT/sweep.log" 2>&1
echo "sweep rc $? at ${SECONDS}s"
sed -n '/^### bf16/,$p' "$OUT/sweep/results.md" 2>/dev/null | cut -c1-330 | head -18
