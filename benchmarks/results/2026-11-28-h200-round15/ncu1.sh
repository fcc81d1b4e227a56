#!/bin/bash
# Round 15, call 1 (one H200; run from the repository root, OUT set): a kernels-only build of the
# FP8 d128 forward, then ncu's warp-state statistics and source-level stall sampling of one
# d128 S 8192 non-causal call (fp8_one.py), exported as text and CSV.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R=benchmarks/results/2026-11-28-h200-round15
FLASHATTN_KERNELS_ONLY="${KONLY:-sm90_fwd_fp8_bf16_hdim128}" MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 \
  || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s"; grep "flashattn build:" "$OUT/build.log" | tail -2
ncu --kernel-name regex:fwd_kernel --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters --section ComputeWorkloadAnalysis \
    --section InstructionStats --section SchedulerStats \
    --metrics regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active \
    -o "$OUT/fp8d128" -f $PY benchmarks/results/2026-11-28-h200-round14/fp8_one.py 128 > "$OUT/ncu.log" 2>&1
echo "ncu rc $? at ${SECONDS}s"; tail -3 "$OUT/ncu.log"
ncu --import "$OUT/fp8d128.ncu-rep" --page details > "$OUT/details.txt" 2>&1
ncu --import "$OUT/fp8d128.ncu-rep" --page raw --csv > "$OUT/raw.csv" 2>&1
ncu --import "$OUT/fp8d128.ncu-rep" --page source --csv --print-source sass > "$OUT/source.csv" 2>&1
ls -la "$OUT"; grep -i "stalled" "$OUT/details.txt" | head -40
echo "done at ${SECONDS}s"
