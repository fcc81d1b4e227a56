#!/bin/bash
# Round 42, call 7 (inline, the same warm machine and build): call 6's sweep with 5 rounds.
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1; SECONDS=0; PY=$(command -v python3)
ls flashattn/_C*.so >/dev/null 2>&1 || { echo "no build (fresh machine)"; exit 1; }
PYTHONPATH=$PWD timeout 150 $PY -m benchmarks sweep --passes bwd --headdims 64,128,256 --seqlens 2048,8192 --dtypes bf16 \
  --backends flashattn,flashattn_det,cudnn --rounds 5 --memory-seqlens '' --train-memory-seqlens '' --out "$OUT/sweep5" > "$OUT/sweep5.log" 2>&1
echo "sweep rc $? at ${SECONDS}s"; sed -n '/^### bf16/,$p' "$OUT/sweep5/results.md" | head -20
