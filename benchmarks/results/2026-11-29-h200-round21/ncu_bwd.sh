#!/bin/bash
# Round 21: Nsight Compute on one sm90 backward main kernel (bwd_kernel) of the flashattn tree TREE
# (a kernels-only build, scripts/bisect_fwd.sh), as scripts/profile_bwd.sh does without its build:
#   bash ncu_bwd.sh TREE HEAD_DIM CAUSAL(0|1) [S]     -> $OUT/ncu-dD-cC-{details,stalls}.txt
set -uo pipefail
tree=$(cd "$1" && pwd); d=$2; c=$3; s=${4:-8192}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
rep=/tmp/ncu-d$d-c$c
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
cd / && PYTHONPATH=$tree "$ncu" --clock-control none -k 'regex:^bwd_kernel$' --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section SchedulerStats --section LaunchStats \
    --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_sectors_op_red.sum,lts__t_sectors_op_read.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed \
    -o "$rep" -f python3 - "$d" "$c" "$s" <<'PYEOF' > /dev/null
import sys
import torch
from flashattn import flash_attn_func
d, causal, s = int(sys.argv[1]), bool(int(sys.argv[2])), int(sys.argv[3])
b, h = max(1, 16384 // s), 2048 // d
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
dout = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
out = flash_attn_func(q, k, v, causal=causal)
torch.autograd.grad(out, (q, k, v), dout)
torch.cuda.synchronize()
PYEOF
"$ncu" --import "$rep.ncu-rep" --page details > "$OUT/ncu-d$d-c$c-details.txt" 2>&1
"$ncu" --import "$rep.ncu-rep" --page source --csv --print-source sass > "$rep-source.csv" 2>&1
python3 "$repo/scripts/ncu_stalls.py" "$rep-source.csv" > "$OUT/ncu-d$d-c$c-stalls.txt" 2>&1
grep -E "Duration|Compute \(SM\) Throughput|L2 Cache Throughput|DRAM Throughput|lts__|gmma" "$OUT/ncu-d$d-c$c-details.txt" | head -12
