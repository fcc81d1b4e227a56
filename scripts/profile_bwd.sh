#!/usr/bin/env bash
# Nsight Compute on one backward step of flashattn and of SDPA's flash backend
# (FlashAttention-2), same shape, side by side: where the dK/dV kernel's time
# goes (tensor pipe, shared-memory wavefronts, warp stalls, spills).
#
#   bash scripts/profile_bwd.sh [HEAD_DIM] [CAUSAL(0|1)]     (default 128 0)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
# shellcheck source=scripts/env.sh
source scripts/env.sh || exit $?
head_dim=${1:-128}
causal=${2:-0}
ncu="$(command -v ncu || echo "${CUDA_HOME:-/usr/local/cuda}/bin/ncu")"
"$ncu" --clock-control none -k 'regex:bwd_dk_dv_kernel|flash_bwd_dq_dk_dv' -c 2 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
    --section Occupancy --section LaunchStats \
    --metrics l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed_op_ldsm.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum,smsp__inst_executed.sum,sm__cycles_elapsed.avg \
    "$PY" - "$head_dim" "$causal" <<'PYEOF'
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from flashattn import flash_attn_func

d, causal = int(sys.argv[1]), bool(int(sys.argv[2]))
b, s, h = 2, 4096, 2048 // d
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
dout = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
out = flash_attn_func(q, k, v, causal=causal)
torch.autograd.grad(out, (q, k, v), dout)
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    torch.autograd.grad(out, (qt, kt, vt), dout.transpose(1, 2))
torch.cuda.synchronize()
PYEOF
