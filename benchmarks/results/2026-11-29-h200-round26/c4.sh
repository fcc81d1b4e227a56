#!/bin/bash
# Round 26, call 4 (one H200; repository root, OUT set): main -- a build of the d128 causal bf16
# forward only; Nsight Compute on three calls of the paged benchmark's "chunk 1k of 16k x 2"
# (H 32, Hk 8, causal): pages of 256 by TMA boxes, the same pages gathered (rows, 4 lanes a row),
# pages of 16 gathered. Where the gathered kernels' time goes: the details page (stall reasons,
# pipes, shared-memory wavefronts) and the per-instruction warp-state samples (scripts/ncu_stalls.py).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
export FLASHATTN_KERNELS_ONLY="sm90_fwd_bf16_hdim128_local"
SECONDS=0
MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s: $FLASHATTN_BUILD"
ncu="$(command -v ncu || echo /usr/local/cuda/bin/ncu)"
cat > /tmp/paged_profile.py <<'PYEOF'
import os
import torch
from benchmarks.paged import HEADS, HEADS_K, to_pages
from flashattn import flash_attn_varlen_func

lengths_q, lengths_k, d = [1024] * 2, [16384] * 2, 128
gen = torch.Generator().manual_seed(0)
cu_q = torch.tensor([0, 1024, 2048], dtype=torch.int32, device="cuda")
cu_k = torch.tensor([0, 16384, 32768], dtype=torch.int32, device="cuda")
q = torch.randn(2048, HEADS, d, generator=gen).to("cuda", torch.bfloat16)
k, v = (torch.randn(32768, HEADS_K, d, generator=gen).to("cuda", torch.bfloat16) for _ in range(2))
for page, mode in ((256, "tma"), (256, "gather"), (16, "gather")):
    k_pages, v_pages, table = to_pages(k, v, cu_k, lengths_k, page, gen)
    os.environ["FLASHATTN_SM90_PAGED_COPY"] = mode
    flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, 1024, 16384, causal=True, block_table=table)
    torch.cuda.synchronize()
    print("done", page, mode, flush=True)
PYEOF
export PYTHONPATH="$PWD"  # the driver runs from /tmp and imports benchmarks/
timeout 360 "$ncu" --clock-control none --cache-control none -k "regex:^fwd_kernel$" --launch-count 3 \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters --section InstructionStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis_Tables --section LaunchStats \
    --metrics smsp__inst_executed_pipe_lsu.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed.sum \
    -o "$OUT/paged" -f $PY /tmp/paged_profile.py > "$OUT/ncu.log" 2>&1
echo "ncu rc $? at ${SECONDS}s"; tail -4 "$OUT/ncu.log"
"$ncu" --import "$OUT/paged.ncu-rep" --page details > "$OUT/paged-details.txt" 2>&1
"$ncu" --import "$OUT/paged.ncu-rep" --page source --csv --print-source sass > /tmp/paged-source.csv 2>&1
$PY scripts/ncu_stalls.py /tmp/paged-source.csv 40 > "$OUT/paged-stalls.txt" 2>&1
grep -E "^  fwd_kernel|Duration|Warp Cycles Per Issued|Issue Slots Busy|No Eligible|smsp__inst_executed.sum|wavefronts_mem_shared" "$OUT/paged-details.txt" | head -40
rm -f "$OUT/paged.ncu-rep.tmp"; ls -la "$OUT"; echo "done at ${SECONDS}s"
