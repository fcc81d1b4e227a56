#!/bin/bash
# Round 30, call 3 (one H200; repository root, OUT set): why the FP8 decoding kernel reads at 3.7
# TB/s where the bf16 one reads 4.4 -- Nsight Compute on main's kernel (Hk 32, B 8, S 64k), and an
# A/B against bis_trees/dense4 (FP8 Dense blocks at 4 an SM: 56 KB, <= 128 registers; FP8 splits
# fill the Dense slots also when there are more blocks than SMs). Kernels-only builds.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
PY=python3
for tree in . bis_trees/dense4; do
  name=$(basename "$(cd $tree && pwd)")
  ( cd $tree && FLASHATTN_KERNELS_ONLY='sm80_fwd_kvcache_fp8_bf16_hdim128' MAX_JOBS=8 $PY setup.py build_ext --inplace \
      > "$OUT/build_$name.log" 2>&1; echo "$name: build rc $? at ${SECONDS}s" ) &
done
wait
here=$PWD
AB=$here/benchmarks/results/2026-11-30-h200-round30/ab_decode_fp8.py
for pass in 1 2; do
  for tree in . bis_trees/dense4; do
    name=$(basename "$(cd $tree && pwd)")
    (cd / && PYTHONPATH="$here/$tree" timeout 120 $PY $AB "$name" 2>&1 | tail -6)
  done
done
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
(cd / && PYTHONPATH="$here" timeout 150 $NCU --kernel-name regex:decode_kernel --launch-skip 4 --launch-count 1 \
  --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section Occupancy \
  --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis $PY $AB profile) > "$OUT/ncu.log" 2>&1
echo "ncu rc $? at ${SECONDS}s"
grep -E "Throughput|Duration|Issue|Eligible|Active Warps|Registers|Stall|Achieved|Theoretical Occ|Pipe|Executed Ipc|Warp Cycles|L1/TEX Hit|DRAM" "$OUT/ncu.log" | head -60
