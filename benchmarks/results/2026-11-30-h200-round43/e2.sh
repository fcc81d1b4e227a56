#!/bin/bash
# Round 43, call 4 (the warm machine of call 3, carry .fa4/b): FlashAttention-4's second part; on call 3's
# build, with every do_bench warm-up 200 ms (NOTES, round 43: the power cap): the bf16 backward rows (ours
# default and deterministic, cuDNN, FA4, SDPA flash; --rounds 3), forward + backward (ours, cuDNN, FA4),
# and the forward (ours, cuDNN, FA4).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
PY=$(command -v python3)
FA4=$(PY=$PY bash scripts/stage_fa4.sh part2) && export FLASHATTN_FA4_DIR=$FA4 && echo "fa4 at $FA4"
ls flashattn/_C*.so || { echo "no build: a fresh machine"; exit 1; }
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv,noheader -lms 100 > "$OUT/smi.csv" 2>&1 &
SMI=$!
timeout 280 $PY -m benchmarks sweep --passes bwd --backends flashattn,flashattn_det,cudnn,fa4,flash --rounds 3 \
  --headdims 64,128,256 --seqlens 2048,8192 --dtypes bf16 --memory-seqlens '' --train-memory-seqlens '' --warmup 200 --grad-warmup 200 \
  --out "$OUT/sweep_bwd" > "$OUT/sweep_bwd.log" 2>&1
echo "bwd rc $? at ${SECONDS}s"
sed -n '/^### bf16/,/^### Notes/p' "$OUT/sweep_bwd/results.md" | cut -c1-330 | head -18
timeout $((450 - SECONDS)) $PY -m benchmarks sweep --passes fwdbwd --backends flashattn,cudnn,fa4 --rounds 2 \
  --headdims 64,128,256 --seqlens 2048,8192 --dtypes bf16 --memory-seqlens '' --train-memory-seqlens '' --warmup 200 --grad-warmup 200 \
  --out "$OUT/sweep_fwdbwd" > "$OUT/sweep_fwdbwd.log" 2>&1
echo "fwdbwd rc $? at ${SECONDS}s"
sed -n '/^### bf16/,/^### Notes/p' "$OUT/sweep_fwdbwd/results.md" | cut -c1-250 | head -18
timeout $((570 - SECONDS)) $PY -m benchmarks sweep --passes fwd --backends flashattn,cudnn,fa4 --rounds 2 \
  --headdims 64,128,256 --seqlens 2048,8192 --dtypes bf16 --memory-seqlens '' --train-memory-seqlens '' --warmup 200 --grad-warmup 200 \
  --out "$OUT/sweep_fwd" > "$OUT/sweep_fwd.log" 2>&1
echo "fwd rc $? at ${SECONDS}s"
sed -n '/^### bf16/,/^### Notes/p' "$OUT/sweep_fwd/results.md" | cut -c1-250 | head -18
kill $SMI
echo "done at ${SECONDS}s"
