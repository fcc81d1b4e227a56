#!/bin/bash
# Round 43, call 3 (carry .fa4/a): FlashAttention-4's first part; main's full 9.0a build; then the bf16
# backward sweep (ours default and deterministic, cuDNN; --rounds 3) twice: with the sweep's do_bench
# warm-up of 10 ms, then of 200 ms (--grad-warmup 200), nvidia-smi sampling the SM clock and power.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
bash scripts/stage_fa4.sh part1 && echo "fa4 part 1 staged: $(ls /tmp/fa4 | wc -l) files"
rm -f flashattn/_C*.so
FLASHATTN_FORCE_BUILD=1 MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv,noheader -lms 100 > "$OUT/smi.csv" 2>&1 &
SMI=$!
for w in 10 200; do
  timeout 200 $PY -m benchmarks sweep --passes bwd --headdims 64,128,256 --seqlens 2048,8192 --dtypes bf16 \
    --backends flashattn,flashattn_det,cudnn --rounds 3 --grad-warmup $w --memory-seqlens '' --train-memory-seqlens '' \
    --out "$OUT/sweep_w$w" > "$OUT/sweep_w$w.log" 2>&1
  echo "sweep warm-up $w ms rc $? at ${SECONDS}s"
  sed -n '/^### bf16/,/^### Notes/p' "$OUT/sweep_w$w/results.md" | cut -c1-260 | head -18
done
kill $SMI
echo "done at ${SECONDS}s"
