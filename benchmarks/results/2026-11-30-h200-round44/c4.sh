#!/bin/bash
# Round 44, call 4 (carry .fa3/lib: FlashAttention-3 0251105a's d256 bf16 forward and backward, staged by
# scripts/stage_fa3.sh with FA3_UNITS naming those two, the driver's other entry points linked to stubs
# that abort, never called at d256): main's full 9.0a build; the d256 bf16 backward sweep (ours, cuDNN,
# FA3; three rounds, the 200 ms warm-up); then the GPU tests to their end.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
rm -f flashattn/_C*.so
FLASHATTN_FORCE_BUILD=1 MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s"
timeout -k 5 150 $PY -m benchmarks sweep --passes bwd --headdims 256 --seqlens 2048,8192 --dtypes bf16 \
  --backends flashattn,cudnn,fa3 --rounds 3 --memory-seqlens '' --train-memory-seqlens '' \
  --out "$OUT/sweep" > "$OUT/sweep.log" 2>&1
echo "sweep rc $? at ${SECONDS}s"
sed -n '/^### bf16/,/^### Notes/p' "$OUT/sweep/results.md" | cut -c1-300 | head -14
timeout -k 5 $((590 - SECONDS)) $PY -m pytest tests -m "gpu and not slow" -n 14 -q -p no:cacheprovider -ra > "$OUT/tests.log" 2>&1
echo "tests rc $? at ${SECONDS}s"
tail -5 "$OUT/tests.log"
