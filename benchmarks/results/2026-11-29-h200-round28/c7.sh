#!/bin/bash
# Round 28, call 7 (one H200; repository root, OUT set): main's kernels (be75e19), a kernels-only
# build of the FP8 d128 forward (and its local variant), then Nsight Compute on one FP8 d128 call at
# S 8k, non-causal and causal (B 2, H 16): where the warps wait (scripts/ncu_stalls.py), for round
# 27's open question -- why the in-kernel V transpose gained 2.2% without a mask and 0.4% with it.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
FLASHATTN_KERNELS_ONLY=sm90_fwd_fp8_bf16_hdim128,sm90_fwd_fp8_bf16_hdim128_local MAX_JOBS=16 \
  python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s"
ncu="$(command -v ncu || echo /usr/local/cuda/bin/ncu)"
for causal in 0 1; do
  PYTHONPATH=$PWD timeout 150 "$ncu" --clock-control none -k "regex:^fwd_kernel$" --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters --section SchedulerStats \
    --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active \
    -o "$OUT/fp8-c$causal" -f python3 - "$causal" > "$OUT/ncu-c$causal.log" 2>&1 <<'PYEOF'
import sys
import torch
from flashattn import flash_attn_func
causal = bool(int(sys.argv[1]))
q, k, v = ((torch.randn(2, 8192, 16, 128, device="cuda") * 2).to(torch.float8_e4m3fn) for _ in range(3))
ones = torch.ones(2, 16, device="cuda")
for _ in range(2):
    flash_attn_func(q, k, v, causal=causal, q_descale=ones, k_descale=ones, v_descale=ones)
torch.cuda.synchronize()
PYEOF
  echo "ncu causal=$causal rc $? at ${SECONDS}s"
  "$ncu" --import "$OUT/fp8-c$causal.ncu-rep" --page source --csv --print-source sass > "$OUT/fp8-c$causal-source.csv" 2>/dev/null
  "$ncu" --import "$OUT/fp8-c$causal.ncu-rep" --page details > "$OUT/fp8-c$causal-details.txt" 2>/dev/null
  python3 scripts/ncu_stalls.py "$OUT/fp8-c$causal-source.csv" 30 > "$OUT/fp8-c$causal-stalls.txt" 2>&1
  grep -E "Duration|gmma|pipe_xu|Issued Warp|No Eligible|Active Warps" "$OUT/fp8-c$causal-details.txt" | head -8
  head -20 "$OUT/fp8-c$causal-stalls.txt"
  rm -f "$OUT/fp8-c$causal.ncu-rep"
done
echo "done at ${SECONDS}s"
