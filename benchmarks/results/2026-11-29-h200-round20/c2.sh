#!/bin/bash
# Round 20, call 2 (one H200; repository root, OUT set; carry build/ab20 and build/trace20, trees made by
# `scripts/bisect_fwd.sh DIR REV...`): the d128 backward of main (6873962) against exp/red-dq (f316bb9:
# dQ^T added from registers by red.global.add.f32), built side by side, timed in turn against cuDNN
# (scripts/bisect_fwd.sh, PASS=bwd); Nsight Compute on red-dq's main kernel; then the clock64 trace of
# one block's steps (exp/red-dq-trace, 8fb4e89).
set -uo pipefail
export CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
export ONLY=sm90_fwd_bf16_hdim128,sm90_fwd_bf16_hdim128_local,sm90_bwd_bf16_hdim128,sm90_bwd_bf16_hdim128_local
( cd build/trace20/8fb4e89 && CUDA_HOME=/usr/local/cuda TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=4 \
  FLASHATTN_KERNELS_ONLY=sm90_fwd_bf16_hdim128,sm90_bwd_bf16_hdim128 python3 setup.py build_ext --inplace > "$OUT/build_trace.log" 2>&1; echo "trace build rc $? at ${SECONDS}s" ) &
JOBS=4 PASS=bwd DIMS=128 bash scripts/bisect_fwd.sh build/ab20 2>&1 | tail -5
wait
echo "A/B done at ${SECONDS}s"
cat "$OUT/bisect.jsonl"
red=$PWD/build/ab20/f316bb9
(cd / && timeout 120 ncu --clock-control none -k 'regex:^bwd_kernel$' --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section SourceCounters --section ComputeWorkloadAnalysis \
  --section MemoryWorkloadAnalysis --section SchedulerStats \
  -o "$OUT/red-d128-c0" -f env PYTHONPATH="$red" python3 -c "
import torch; from flashattn import flash_attn_func
q,k,v=(torch.randn(2,8192,16,128,device='cuda',dtype=torch.bfloat16,requires_grad=True) for _ in range(3))
o=flash_attn_func(q,k,v); torch.autograd.grad(o,(q,k,v),torch.randn_like(o)); torch.cuda.synchronize()" > "$OUT/ncu.log" 2>&1)
echo "ncu rc $? at ${SECONDS}s"
ncu --import "$OUT/red-d128-c0.ncu-rep" --page details > "$OUT/red-d128-c0-details.txt" 2>&1
ncu --import "$OUT/red-d128-c0.ncu-rep" --page source --csv --print-source sass > "$OUT/red-d128-c0-source.csv" 2>&1
grep -E "Duration|Elapsed Cycles|SM Active|L1/TEX Cache Throughput|Compute \(SM\)" "$OUT/red-d128-c0-details.txt"
rm -f "$OUT/red-d128-c0.ncu-rep"
tr=build/trace20/8fb4e89
(cd / && PYTHONPATH="$OLDPWD/$tr" timeout 60 python3 -c "
import torch; from flashattn import flash_attn_func
q,k,v=(torch.randn(2,8192,16,128,device='cuda',dtype=torch.bfloat16,requires_grad=True) for _ in range(3))
o=flash_attn_func(q,k,v); do=torch.randn_like(o)
for i in range(6): torch.autograd.grad(o,(q,k,v),do,retain_graph=True)
torch.cuda.synchronize()") > "$OUT/trace.txt" 2>&1
echo "trace rc $? lines $(grep -c TRACE "$OUT/trace.txt") at ${SECONDS}s"
