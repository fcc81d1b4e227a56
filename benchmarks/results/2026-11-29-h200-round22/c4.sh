#!/bin/bash
# Round 22, call 4 (one H200; repository root, OUT set, build/ab02 carried): the SM clock and power
# while the FP8 d128 forward, ours bf16 and cuDNN bf16 each run alone for 4 s (power.py), on a
# kernels-only build of bcf48eb (main's FP8 configs) and of f70f028 (three warpgroups, 96-key tiles).
set -uo pipefail
SECONDS=0
here=$PWD
export CUDA_HOME=/usr/local/cuda TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16
export FLASHATTN_KERNELS_ONLY=sm90_fwd_fp8_bf16_hdim128,sm90_fwd_bf16_hdim128
for t in bcf48eb f70f028; do (cd build/ab02/$t && python3 setup.py build_ext --inplace > "$OUT/build_$t.log" 2>&1; echo "$t build rc $?") & done; wait
echo "built at ${SECONDS}s"
nvidia-smi -q -d POWER | grep -iE "limit|draw" | head -8
for t in bcf48eb f70f028; do
  echo "== $t"; (cd / && PYTHONPATH=$here/build/ab02/$t python3 "$here/benchmarks/results/2026-11-29-h200-round22/power.py")
done
echo "done at ${SECONDS}s"
