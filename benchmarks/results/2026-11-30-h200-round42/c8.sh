#!/bin/bash
# Round 42, call 8 (inline, the same warm machine and build): the d256 rows twice, flashattn and cuDNN.
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1; SECONDS=0; PY=$(command -v python3)
ls flashattn/_C*.so >/dev/null 2>&1 || { echo "no build (fresh machine)"; exit 1; }
for i in 1 2; do
  PYTHONPATH=$PWD timeout 60 $PY -m benchmarks sweep --passes bwd --headdims 256 --seqlens 2048,8192 --dtypes bf16 --backends flashattn,cudnn \
    --rounds 5 --memory-seqlens '' --train-memory-seqlens '' --out "$OUT/sweep256-$i" > "$OUT/sweep256-$i.log" 2>&1
  echo "sweep $i rc $? at ${SECONDS}s"; sed -n '/^| false\|^| true/p' "$OUT/sweep256-$i/results.md" | head -8
done
