#!/bin/bash
# Round 38, call 3 (the warm H200 right after call 2, which carried .fa4/a; this one carries .fa4/b and
# .fa3/lib): FlashAttention-4's second wheel part; the working tree (C2: the masked default backward in
# the grid (batch, key tile, KV head), d256's masked dQ kernel in (batch, query tile, head); unmasked
# grids as main's); full 9.0a build; smoke37.py at d256 (both dtypes, bf16 deterministic), d128 and d64;
# the sweep's backward and forward + backward rows (bf16, d64/128/256, S 2k and 8k, causal and not) with
# ours (default and deterministic), cuDNN, FlashAttention-4, FlashAttention-3 and SDPA's flash backend in
# one process.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R=benchmarks/results/2026-11-30-h200-round38
R37=benchmarks/results/2026-11-30-h200-round37
FA4=$(PY=$(command -v python3) bash scripts/stage_fa4.sh part2) && export FLASHATTN_FA4_DIR=$FA4 && echo "fa4 at $FA4"
mkdir -p /tmp/fa3 && cp .fa3/lib/libfa3.so /tmp/fa3/ && export FLASHATTN_FA3_LIB=/tmp/fa3/libfa3.so
rm -f flashattn/_C*.so
FLASHATTN_FORCE_BUILD=1 MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s"; grep "flashattn build:" "$OUT/build.log" | tail -1 | cut -c1-200
for spec in "--hdims=256" "--hdims=256 --dtypes=bf16 --det" "--hdims=128" "--hdims=64"; do
  timeout 60 $PY $R37/smoke37.py $spec >> "$OUT/smoke.log" 2>&1; echo "smoke $spec rc $? at ${SECONDS}s: $(tail -1 "$OUT/smoke.log")"
done
grep FAIL "$OUT/smoke.log" | head -5 | cut -c1-250
timeout $((590 - SECONDS)) $PY -m benchmarks sweep --passes bwd,fwdbwd --headdims 64,128,256 --seqlens 2048,8192 --dtypes bf16 \
  --backends flashattn,flashattn_det,cudnn,fa4,fa3,flash --memory-seqlens '' --train-memory-seqlens '' --out "$OUT/sweep" > "$OUT/sweep.log" 2>&1
echo "sweep rc $? at ${SECONDS}s"
sed -n '/^### bf16/,$p' "$OUT/sweep/results.md" | cut -c1-330 | head -40
grep -iE "mismatch|error|Traceback" "$OUT/sweep.log" | head -8
