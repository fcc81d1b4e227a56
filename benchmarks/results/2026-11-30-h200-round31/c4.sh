#!/bin/bash
# Round 31, call 4 (the same warm H200 right after call 3; carries .fa4/b): FlashAttention-4 installed;
# Nsight Compute on c4_profile.py's four calls (ours and FA4's d128 causal prefill 8 x 2k, contiguous
# and pages of 16): where FA4's gather costs less than ours (call 2: its paged call 2-9% faster than
# ours, its contiguous one 3-7% slower or equal).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
PY=$(command -v python3)
FA4=$(PY=$PY bash scripts/stage_fa4.sh part2) && export FLASHATTN_FA4_DIR=$FA4 && echo "fa4 at $FA4"
ncu="$(command -v ncu || echo /usr/local/cuda/bin/ncu)"
export PYTHONPATH="$PWD"
D=benchmarks/results/2026-11-30-h200-round31
timeout 400 "$ncu" --profile-from-start off --clock-control none --cache-control none \
    --section SpeedOfLight --section WarpStateStats --section InstructionStats --section SchedulerStats \
    --section LaunchStats --section Occupancy \
    --metrics smsp__inst_executed_pipe_lsu.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed.sum,lts__t_sectors_srcunit_tex_op_read.sum,smsp__inst_executed_op_ldgsts.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed_op_shared_ld.sum,smsp__inst_executed_op_shared_st.sum \
    -o "$OUT/c4" -f $PY $D/c4_profile.py > "$OUT/ncu.log" 2>&1
echo "ncu rc $? at ${SECONDS}s"; grep -v "^==PROF==" "$OUT/ncu.log" | tail -8
"$ncu" --import "$OUT/c4.ncu-rep" --page details > "$OUT/c4-details.txt" 2>&1
"$ncu" --import "$OUT/c4.ncu-rep" --page raw --csv --metrics gpu__time_duration.sum,smsp__inst_executed.sum,smsp__inst_executed_op_ldgsts.sum,smsp__inst_executed_op_shared_ld.sum,smsp__inst_executed_op_shared_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size,launch__block_size,smsp__issue_active.avg.pct_of_peak_sustained_active > "$OUT/c4-raw.csv" 2>&1
cut -c1-400 "$OUT/c4-raw.csv" | head -12
grep -E "^  [a-zA-Z_].*\(|Duration|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Registers Per|Stall|Grid Size" "$OUT/c4-details.txt" | head -60
echo "done at ${SECONDS}s"
