#!/bin/bash
# Round 33, call 3 (as call 1, with dQ added into tiles of its own layout, dq_tiles.h): a kernels-only build
# of the d256 instantiations; c1_smoke.py; the d256 backward rows of the sweep with cuDNN and
# FlashAttention-3.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R=benchmarks/results/2026-11-30-h200-round33
mkdir -p /tmp/fa3 && cp .fa3/lib/libfa3.so /tmp/fa3/
rm -f flashattn/_C*.so
FLASHATTN_KERNELS_ONLY='sm90_*hdim256*' FLASHATTN_FORCE_BUILD=1 MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s: $FLASHATTN_BUILD"; grep -i "spill" "$OUT/build.log" | tail -2
PYTHONPATH=$PWD timeout 150 $PY $R/c1_smoke.py > "$OUT/smoke.log" 2>&1
echo "smoke rc $? at ${SECONDS}s"; grep -v ": ok$" "$OUT/smoke.log" | cut -c1-300 | tail -30
export FLASHATTN_FA3_LIB=/tmp/fa3/libfa3.so
timeout 200 $PY -m benchmarks sweep --passes bwd --headdims 256 --seqlens 2048,8192 --dtypes bf16 \
  --backends flashattn,cudnn,fa3 --memory-seqlens '' --train-memory-seqlens '' --out "$OUT/sweep" > "$OUT/sweep.log" 2>&1
echo "sweep rc $? at ${SECONDS}s"
sed -n '/^### bf16/,$p' "$OUT/sweep/results.md" | cut -c1-250 | head -30
grep -iE "mismatch|error|Traceback" "$OUT/sweep.log" | head -8
