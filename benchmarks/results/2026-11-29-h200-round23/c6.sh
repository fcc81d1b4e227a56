#!/bin/bash
# Round 23, call 6 (one H200; repository root, OUT set; carry build/ab23run): branch next/det-runs (main's
# two dQ writers plus the grid in runs across (KV head, batch) pairs, FLASHATTN_AB_DET_RUN), for the
# next session: det_runs.py at runs 0 (whole pairs: main's order), 4, 8, 16. Kernels-only build.
set -uo pipefail
export CUDA_HOME=/usr/local/cuda TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 PYTHONUNBUFFERED=1
SECONDS=0
here=$PWD
pats=""
for d in hdim64 hdim128 hdim192 hdim192_v128 hdim256; do
  pats="$pats,sm90_fwd_bf16_${d},sm90_fwd_bf16_${d}_local"
  for x in "" _det _local _local_det; do pats="$pats,sm90_bwd_bf16_${d}${x}"; done
done
export FLASHATTN_KERNELS_ONLY="${pats#,}"
(cd build/ab23run && python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1); echo "build rc $? at ${SECONDS}s"
(cd / && PYTHONPATH="$here/build/ab23run" timeout 150 python3 "$here/benchmarks/results/2026-11-29-h200-round23/det_runs.py" 0,4,8,16) 2>&1 | tee "$OUT/det_runs.txt"
echo "done at ${SECONDS}s"
