#!/bin/bash
# Round 39, call 7 (the warm H200 right after call 6, which carried .fa4/a; this one carries .fa4/b and
# .fa3/lib): FlashAttention-4's second part; the final tree (split tails; d256's masked dQ kernel's SASS
# as main's); full 9.0a build; the sweep's backward rows with FA4 (--rounds 3), then forward + backward.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
FA4=$(PY=$(command -v python3) bash scripts/stage_fa4.sh part2) && export FLASHATTN_FA4_DIR=$FA4 && echo "fa4 at $FA4"
mkdir -p /tmp/fa3 && cp .fa3/lib/libfa3.so /tmp/fa3/ && export FLASHATTN_FA3_LIB=/tmp/fa3/libfa3.so
rm -f flashattn/_C*.so
FLASHATTN_FORCE_BUILD=1 MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s"
timeout $((330 - SECONDS)) $PY -m benchmarks sweep --passes bwd --headdims 64,128,256 --seqlens 2048,8192 --dtypes bf16 \
  --backends flashattn,flashattn_det,cudnn,fa4,fa3 --rounds 3 --memory-seqlens '' --train-memory-seqlens '' \
  --out "$OUT/sweep" > "$OUT/sweep.log" 2>&1
echo "sweep rc $? at ${SECONDS}s"
sed -n '/^### bf16/,/^### Notes/p' "$OUT/sweep/results.md" | cut -c1-330 | head -18
[ $SECONDS -lt 300 ] && timeout $((350 - SECONDS)) $PY -m benchmarks sweep --passes fwdbwd --headdims 64,128,256 --seqlens 2048,8192 --dtypes bf16 \
  --backends flashattn,cudnn,fa4 --memory-seqlens '' --train-memory-seqlens '' --out "$OUT/sweep_fwdbwd" > "$OUT/sweep_fwdbwd.log" 2>&1
echo "fwdbwd rc $? at ${SECONDS}s"
sed -n '/^### bf16/,/^### Notes/p' "$OUT/sweep_fwdbwd/results.md" 2>/dev/null | cut -c1-250 | head -18
