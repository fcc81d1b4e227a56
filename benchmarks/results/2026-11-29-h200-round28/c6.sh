#!/bin/bash
# Round 28, call 6 (one H200; repository root, OUT set): main (232beb0's Python, be75e19's kernels) --
# a kernels-only build (the bf16 d128 forward), then c6_dequant.py: the dequantising route's steps.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
FLASHATTN_KERNELS_ONLY=sm90_fwd_bf16_hdim128 MAX_JOBS=16 python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s"
PYTHONPATH=$PWD timeout 200 python3 benchmarks/results/2026-11-29-h200-round28/c6_dequant.py 2>&1 | tee "$OUT/dequant.txt" | grep -v Warning
echo "done at ${SECONDS}s"
