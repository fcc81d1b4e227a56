#!/bin/bash
# Round 21, call 5 (one H200; repository root, OUT set): main (77e7b11) kernels-only (d64 and d128,
# their deterministic backwards too): where a backward call's time goes kernel by kernel against
# cuDNN's (kernel_times.py), and deterministic=True against the default (det_times.py).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1 MAX_JOBS=16
SECONDS=0
R=$PWD/benchmarks/results/2026-11-29-h200-round21
K=""
for d in 64 128; do for v in fwd fwd_local bwd bwd_local bwd_det bwd_local_det; do K="$K,sm90_${v%%_*}_bf16_hdim$d${v#${v%%_*}}"; done; done
echo "${K#,}"
(cd build/ab25/77e7b11 && FLASHATTN_KERNELS_ONLY=${K#,} python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1); echo "build rc $? at ${SECONDS}s"
cd / && PYTHONPATH=$OLDPWD/build/ab25/77e7b11 timeout 200 python3 $R/kernel_times.py 64:2048:1 64:2048:0 64:8192:1 128:2048:1 2>&1 | tee "$OUT/kernel-times.txt" | grep -v "^    .*  0\.[0-9]%"
echo "kernel times done at ${SECONDS}s"
PYTHONPATH=$OLDPWD/build/ab25/77e7b11 timeout 200 python3 $R/det_times.py 2>&1 | tee "$OUT/det-times.md"
echo "det done at ${SECONDS}s"
