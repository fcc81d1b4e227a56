#!/bin/bash
# Round 42, call 9 (inline, the same warm machine and build): the d256 causal 8k cell four times, each
# followed by round 37's kernels.py (flashattn and cuDNN kernel by kernel). The sweeps' results files
# did not come back (too many files); their table rows are in the call's output, quoted in README.md.
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1; SECONDS=0; PY=$(command -v python3)
ls flashattn/_C*.so >/dev/null 2>&1 || { echo "no build (fresh machine)"; exit 1; }
for i in 1 2 3 4; do
  PYTHONPATH=$PWD timeout 30 $PY -m benchmarks sweep --passes bwd --headdims 256 --seqlens 8192 --causal true --dtypes bf16 --backends flashattn,cudnn \
    --rounds 5 --memory-seqlens '' --train-memory-seqlens '' --out "$OUT/c8k-$i" > "$OUT/c8k-$i.log" 2>&1 || tail -3 "$OUT/c8k-$i.log"
  echo "run $i at ${SECONDS}s $(sed -n '/^| true/p' "$OUT/c8k-$i/results.md" 2>/dev/null)"
  PYTHONPATH=$PWD timeout 25 $PY benchmarks/results/2026-11-30-h200-round37/kernels.py --hdims=256 --only=flashattn,cudnn 2>&1 | grep -A3 "S=8192 causal=1" | cut -c1-90 > "$OUT/k-$i.log"
  head -3 "$OUT/k-$i.log"
done
