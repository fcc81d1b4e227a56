#!/bin/bash
# Round 35, call 2 (one H200): the d256 bf16 backward kernel by kernel (kernels.py: torch.profiler) for
# main's kernel (this branch with FLASHATTN_EXP_Q4 0 is main's), FlashAttention-3 and cuDNN, one process;
# then Nsight Compute (SpeedOfLight, memory and compute workload) on one call of our main kernel and FA3's.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R=benchmarks/results/2026-11-30-h200-round35
PY=$(command -v python3)
mkdir -p /tmp/fa3 && cp .fa3/lib/libfa3.so /tmp/fa3/ && export FLASHATTN_FA3_LIB=/tmp/fa3/libfa3.so
grep -q "^#define FLASHATTN_EXP_Q4 0$" csrc/sm90/bwd_kernel.cuh || { echo "not main's variant"; exit 1; }
rm -f flashattn/_C*.so
FLASHATTN_KERNELS_ONLY='sm90_bwd_bf16_hdim256,sm90_bwd_bf16_hdim256_local,sm90_fwd_bf16_hdim256,sm90_fwd_bf16_hdim256_local' MAX_JOBS=16 $PY setup.py build_ext --inplace > /tmp/build.log 2>&1
echo "build rc $? at ${SECONDS}s: $(grep -o 'flashattn build: compiled.*' /tmp/build.log | cut -c1-120)"
timeout 150 $PY $R/kernels.py 2>&1 | tee "$OUT/kernels.log" | cut -c1-150
echo "kernels done at ${SECONDS}s"
timeout 200 ncu --clock-control none --kernel-name-base demangled -k 'regex:sm90::bwd_kernel|FlashAttnBwdSm90' --launch-count 2 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
  --section WarpStateStats -o /tmp/prof -f $PY - > "$OUT/ncu.log" 2>&1 <<'PYEOF'
import sys
sys.path.insert(0, ".")
import torch
from benchmarks.backends import fa3_fn, flash_attention_3
from flashattn import flash_attn_func
fa3, _ = flash_attention_3()
q, k, v = (torch.randn(2, 8192, 8, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
dout = torch.randn_like(q)
for fn in (lambda: flash_attn_func(q, k, v), fa3_fn(fa3, q, k, v, False, 256 ** -0.5)):
    torch.autograd.grad(fn(), (q, k, v), dout)
torch.cuda.synchronize()
PYEOF
echo "ncu rc $? at ${SECONDS}s"; grep -E "==PROF==|Error" "$OUT/ncu.log" | head -5
ncu --import /tmp/prof.ncu-rep --page details > "$OUT/ncu_details.txt" 2>&1
grep -E "^  [a-zA-Z_]|Duration|Compute \(SM\) Throughput|Memory Throughput|L1/TEX Hit|L2 Hit|DRAM Throughput|L1/TEX Cache Throughput|L2 Cache Throughput|Executed Ipc A|Issue Slots Busy|Warp Cycles Per Issued|Mem Busy|Max Bandwidth|Mem Pipes Busy|SM Busy|Registers" "$OUT/ncu_details.txt" | cut -c1-120 | head -60
