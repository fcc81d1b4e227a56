#!/bin/bash
# Round 42, call 6 (run inline on call 5's warm machine and build): the backward sweep at every head
# dim (best median of 3 rounds), then racecheck and synccheck over round 39's sanitize39.py.
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1; SECONDS=0; PY=$(command -v python3)
ls flashattn/_C*.so >/dev/null 2>&1 || { echo "no build (fresh machine)"; exit 1; }
PYTHONPATH=$PWD timeout 230 $PY -m benchmarks sweep --passes bwd --headdims 64,128,256 --seqlens 2048,8192 --dtypes bf16 \
  --backends flashattn,flashattn_det,cudnn --rounds 3 --memory-seqlens '' --train-memory-seqlens '' --out "$OUT/sweep" > "$OUT/sweep.log" 2>&1
echo "sweep rc $? at ${SECONDS}s"; sed -n '/^### bf16/,$p' "$OUT/sweep/results.md" | head -20
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in racecheck synccheck; do
  [ $SECONDS -gt 270 ] && { echo "skip $tool"; continue; }
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=$PWD timeout $((320 - SECONDS)) $CS --tool $tool $PY benchmarks/results/2026-11-30-h200-round39/sanitize39.py > "$OUT/$tool-sanitize39.log" 2>&1
  echo "$tool rc $? at ${SECONDS}s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|calls completed' "$OUT/$tool-sanitize39.log" | tr '\n' ' ')"
done
