#!/usr/bin/env bash
# Nsight Compute on one backward call of flashattn (the family the GPU runs; FLASHATTN_FAMILY=sm80
# forces the Ampere one) and, with BASELINE=1, of SDPA's cuDNN backend on the same shape: where
# the main kernel's time goes (tensor pipe, warp stalls per SASS instruction, spills).
#
#   bash scripts/profile_bwd.sh [HEAD_DIM] [CAUSAL(0|1)] [S]     (default 128 0 8192)
#
# bf16, B * S = 16k tokens, H * D = 2048 (the families benchmark's shapes). The report goes to
# $OUT (default build/profile): bwd-dD-cC.ncu-rep, its details page as text, and its SASS source
# page (per-instruction warp-state samples) as CSV, which is what says which phase of a step waits,
# and that page summed by scripts/ncu_stalls.py (stall reasons, shared-memory wavefronts).
# Clocks are left as the GPU sets them (--clock-control none), as the benchmarks run.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
# shellcheck source=scripts/env.sh
source scripts/env.sh || exit $?
head_dim=${1:-128}
causal=${2:-0}
seqlen=${3:-8192}
out_dir=${OUT:-build/profile}
mkdir -p "$out_dir"
name="bwd-d${head_dim}-c${causal}"
ncu="$(command -v ncu || echo "${CUDA_HOME:-/usr/local/cuda}/bin/ncu")"
# The main kernels: sm90's bwd_kernel (and at d256 its dQ kernel, bwd_dq_kernel: COUNT=2 takes
# both), sm80's bwd_dk_dv_kernel (ncu matches the function's base name); cuDNN's backward kernels
# carry "bprop" in theirs (BASELINE=1 adds them).
filter='regex:^(bwd_kernel|bwd_dq_kernel|bwd_dk_dv_kernel)$'
[ "${BASELINE:-0}" = 1 ] && filter='regex:^(bwd_kernel|bwd_dq_kernel|bwd_dk_dv_kernel)$|bprop'
"$ncu" --clock-control none -k "$filter" --launch-skip "${SKIP:-0}" --launch-count "${COUNT:-1}" \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters --section ComputeWorkloadAnalysis \
    --section InstructionStats --section SchedulerStats --section Occupancy --section LaunchStats \
    --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum \
    -o "$out_dir/$name" -f "$PY" - "$head_dim" "$causal" "$seqlen" <<'PYEOF'
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from flashattn import flash_attn_func

d, causal, s = int(sys.argv[1]), bool(int(sys.argv[2])), int(sys.argv[3])
b, h = max(1, 16384 // s), 2048 // d
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
dout = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
out = flash_attn_func(q, k, v, causal=causal)
torch.autograd.grad(out, (q, k, v), dout)
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    torch.autograd.grad(out, (qt, kt, vt), dout.transpose(1, 2))
torch.cuda.synchronize()
PYEOF
rc=$?
[ $rc -eq 0 ] || exit $rc
"$ncu" --import "$out_dir/$name.ncu-rep" --page details > "$out_dir/$name-details.txt" 2>&1
"$ncu" --import "$out_dir/$name.ncu-rep" --page source --csv --print-source sass > "$out_dir/$name-source.csv" 2>&1
"${PY}" scripts/ncu_stalls.py "$out_dir/$name-source.csv" > "$out_dir/$name-stalls.txt" 2>&1
grep -E "Duration|Compute \(SM\) Throughput|Registers Per Thread|Warp Cycles Per Issued" "$out_dir/$name-details.txt"
