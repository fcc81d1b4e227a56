#!/bin/bash
# Round 26, call 3 (one H200; repository root, OUT set): branch exp/paged-hybrid -- a build of the
# d64 and d128 causal bf16 forward kernels only (sm90, and sm80's local_extras for the benchmark's
# ALiBi column); the paged benchmark with keys by TMA boxes and values gathered (hybrid) against
# the row gather (auto) and TMA boxes for both (tma), one process.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
export FLASHATTN_KERNELS_ONLY="sm90_fwd_bf16_hdim64_local,sm90_fwd_bf16_hdim128_local,sm80_fwd_bf16_hdim64_local_extras,sm80_fwd_bf16_hdim128_local_extras"
SECONDS=0
MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s: $FLASHATTN_BUILD"
timeout 300 $PY -m benchmarks paged --out "$OUT/paged" --copy-modes auto,hybrid,tma > "$OUT/paged.log" 2>&1
echo "paged rc $? at ${SECONDS}s"; grep -E "^\| (128|64) " "$OUT/paged/results.md" | grep "| 16 |" | cut -d'|' -f2-5,9,11 | head -40
tail -5 "$OUT/paged.log"
