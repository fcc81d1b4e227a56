#!/bin/bash
# Round 31, call 3 (one H200; repository root, OUT set; carries .fa4/a): FlashAttention-4's first
# wheel part into /tmp/fa4; a kernels-only build of main's d128 causal bf16 forward for call 4.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
export FLASHATTN_KERNELS_ONLY="sm90_fwd_bf16_hdim128_local"
SECONDS=0
bash scripts/stage_fa4.sh part1 && echo "fa4 part1 staged"
MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s: $FLASHATTN_BUILD"
