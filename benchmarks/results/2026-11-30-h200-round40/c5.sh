#!/bin/bash
# Round 40, call 5 (the warm H200 right after call 4, which carried .fa4/a; this one carries .fa4/b and
# .fa3/lib): FlashAttention-4's second part; V8 (what landed in round 39; csrc as dfb7719) full 9.0a
# build; the sweep's bf16 backward rows with the deterministic mode, cuDNN, FA4, FA3 and SDPA's flash
# backend (--rounds 5), then forward + backward (flashattn, cuDNN, FA4), then the fp16 backward rows.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
FA4=$(PY=$(command -v python3) bash scripts/stage_fa4.sh part2) && export FLASHATTN_FA4_DIR=$FA4 && echo "fa4 at $FA4"
mkdir -p /tmp/fa3 && cp .fa3/lib/libfa3.so /tmp/fa3/ && export FLASHATTN_FA3_LIB=/tmp/fa3/libfa3.so
rm -f flashattn/_C*.so
FLASHATTN_FORCE_BUILD=1 MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s"
timeout $((370 - SECONDS)) $PY -m benchmarks sweep --passes bwd --headdims 64,128,256 --seqlens 2048,8192 --dtypes bf16 \
  --backends flashattn,flashattn_det,cudnn,fa4,fa3,flash --rounds 5 --memory-seqlens '' --train-memory-seqlens '' \
  --out "$OUT/sweep" > "$OUT/sweep.log" 2>&1
echo "sweep rc $? at ${SECONDS}s"
sed -n '/^### bf16/,/^### Notes/p' "$OUT/sweep/results.md" | cut -c1-330 | head -18
[ $SECONDS -lt 400 ] && timeout $((440 - SECONDS)) $PY -m benchmarks sweep --passes fwdbwd --headdims 64,128,256 --seqlens 2048,8192 --dtypes bf16 \
  --backends flashattn,cudnn,fa4 --memory-seqlens '' --train-memory-seqlens '' --out "$OUT/sweep_fwdbwd" > "$OUT/sweep_fwdbwd.log" 2>&1
echo "fwdbwd rc $? at ${SECONDS}s"
sed -n '/^### bf16/,/^### Notes/p' "$OUT/sweep_fwdbwd/results.md" 2>/dev/null | cut -c1-250 | head -18
[ $SECONDS -lt 460 ] && timeout $((510 - SECONDS)) $PY -m benchmarks sweep --passes bwd --headdims 64,128,256 --seqlens 2048,8192 --dtypes fp16 \
  --backends flashattn,cudnn,fa4 --rounds 2 --memory-seqlens '' --train-memory-seqlens '' --out "$OUT/sweep_fp16" > "$OUT/sweep_fp16.log" 2>&1
echo "fp16 rc $? at ${SECONDS}s"
sed -n '/^### fp16/,/^### Notes/p' "$OUT/sweep_fp16/results.md" 2>/dev/null | cut -c1-250 | head -18
