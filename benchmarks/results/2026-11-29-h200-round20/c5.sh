#!/bin/bash
# Round 20, call 5 (one H200; repository root, OUT set; carry build/ab20): the d128 backward of
# exp/fa3-order (b8a94f9) against exp/defer-reduce (its dQ^T reduce issued a step later, at the next dS
# barrier), timed in turn against cuDNN (bisect_fwd.sh, PASS=bwd), two passes.
set -uo pipefail
export CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
export ONLY=sm90_fwd_bf16_hdim128,sm90_fwd_bf16_hdim128_local,sm90_bwd_bf16_hdim128,sm90_bwd_bf16_hdim128_local
JOBS=8 PASS=bwd DIMS=128 bash scripts/bisect_fwd.sh build/ab20 2>&1 | tail -5
wait
echo "A/B done at ${SECONDS}s"
cat "$OUT/bisect.jsonl"
