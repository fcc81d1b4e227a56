#!/bin/bash
# Round 39, call 2 (the warm H200 right after call 1, which carried .fa4/a; this one carries .fa4/b and
# .fa3/lib): FlashAttention-4's second wheel part; the working tree (ba78fc5: cc06e19's kernels, not
# run on a GPU before); full 9.0a build; the issue-19 bars' backward rows (bf16, d64/128/256, S 2k
# and 8k, causal and not) with ours (default and deterministic), cuDNN, FlashAttention-4 and
# FlashAttention-3 in one process, timed with --rounds 5 (each backend's best median of five rounds
# taken in turn).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
FA4=$(PY=$(command -v python3) bash scripts/stage_fa4.sh part2) && export FLASHATTN_FA4_DIR=$FA4 && echo "fa4 at $FA4"
mkdir -p /tmp/fa3 && cp .fa3/lib/libfa3.so /tmp/fa3/ && export FLASHATTN_FA3_LIB=/tmp/fa3/libfa3.so
rm -f flashattn/_C*.so
FLASHATTN_FORCE_BUILD=1 MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s"; grep "flashattn build:" "$OUT/build.log" | tail -1 | cut -c1-200
timeout $((590 - SECONDS)) $PY -m benchmarks sweep --passes bwd --headdims 64,128,256 --seqlens 2048,8192 --dtypes bf16 \
  --backends flashattn,flashattn_det,cudnn,fa4,fa3 --rounds 5 --memory-seqlens '' --train-memory-seqlens '' \
  --out "$OUT/sweep" > "$OUT/sweep.log" 2>&1
echo "sweep rc $? at ${SECONDS}s"
sed -n '/^### bf16/,$p' "$OUT/sweep/results.md" | cut -c1-330 | head -24
grep -iE "mismatch|error|Traceback" "$OUT/sweep.log" | head -8
