#!/bin/bash
# Round 26, call 5 (one H200; repository root, OUT set): branch next/gather-banks with its A/B commit
# (gather8 = the 4-lane gather with the earlier rows) -- a build of the d64 and d128 causal bf16
# forward only (and sm80's local_extras for the benchmark's ALiBi column); the paged benchmark,
# the gather with split quarter-warps (auto) against the earlier rows (gather8) and TMA boxes (tma),
# one process; Nsight Compute's shared-memory wavefronts of both gathers at pages of 16.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
export FLASHATTN_KERNELS_ONLY="sm90_fwd_bf16_hdim64_local,sm90_fwd_bf16_hdim128_local,sm80_fwd_bf16_hdim64_local_extras,sm80_fwd_bf16_hdim128_local_extras"
SECONDS=0
MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s: $FLASHATTN_BUILD"
timeout 200 $PY -m benchmarks paged --out "$OUT/paged" --copy-modes auto,gather8,tma > "$OUT/paged.log" 2>&1
echo "paged rc $? at ${SECONDS}s"; grep -E "^\| (128|64) " "$OUT/paged/results.md" | cut -d'|' -f2-5,9,11 | head -48
ncu="$(command -v ncu || echo /usr/local/cuda/bin/ncu)"
cat > /tmp/paged_banks.py <<'PYEOF'
import os
import torch
from benchmarks.paged import HEADS, HEADS_K, to_pages
from flashattn import flash_attn_varlen_func

gen = torch.Generator().manual_seed(0)
cu_q = torch.tensor([0, 1024, 2048], dtype=torch.int32, device="cuda")
cu_k = torch.tensor([0, 16384, 32768], dtype=torch.int32, device="cuda")
q = torch.randn(2048, HEADS, 128, generator=gen).to("cuda", torch.bfloat16)
k, v = (torch.randn(32768, HEADS_K, 128, generator=gen).to("cuda", torch.bfloat16) for _ in range(2))
k_pages, v_pages, table = to_pages(k, v, cu_k, [16384] * 2, 16, gen)
for mode in ("auto", "gather8"):
    os.environ["FLASHATTN_SM90_PAGED_COPY"] = mode
    flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, 1024, 16384, causal=True, block_table=table)
    torch.cuda.synchronize()
PYEOF
export PYTHONPATH="$PWD"
timeout 120 "$ncu" --clock-control none --cache-control none -k "regex:^fwd_kernel$" --launch-count 2 \
    --metrics gpu__time_duration.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__inst_executed.sum \
    $PY /tmp/paged_banks.py > "$OUT/ncu-banks.txt" 2>&1
echo "ncu rc $? at ${SECONDS}s"; grep -E "fwd_kernel|duration|wavefronts|conflicts|inst_executed" "$OUT/ncu-banks.txt" | cut -c1-150
