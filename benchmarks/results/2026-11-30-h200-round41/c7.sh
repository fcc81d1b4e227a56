#!/bin/bash
# Round 41, call 7 (run inline as two commands on the same machine, still warm; main f43eb6e):
# a kernels-only bf16 d256 build, then the d256 backward rows against cuDNN, best median of 3
# rounds (c7/sweep) and, in a second command, of 5 rounds (c7/sweep5).
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda
FLASHATTN_KERNELS_ONLY='sm90_fwd_bf16_hdim256*,sm90_bwd_bf16_hdim256*' MAX_JOBS=16 python3 setup.py build_ext --inplace > /tmp/b.log 2>&1
for rounds in 3 5; do
  out=sweep; [ $rounds = 5 ] && out=sweep5
  PYTHONPATH=$PWD timeout 150 python3 -m benchmarks sweep --passes bwd --headdims 256 --seqlens 2048,8192 --dtypes bf16 \
    --backends flashattn,flashattn_det,cudnn --rounds $rounds --memory-seqlens '' --train-memory-seqlens '' \
    --out "$OUT/$out" > "$OUT/$out.log" 2>&1
  sed -n '/^### bf16/,$p' "$OUT/$out/results.md" | head -12
done
