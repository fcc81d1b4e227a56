#!/bin/bash
# Round 20, call 4 (one H200; repository root, OUT set; carry build/ab20 and build/trace20): the d128
# backward of exp/fa3-order (b8a94f9) against exp/poly-exp (8a61978: one exponential of each n8 tile on
# the FMA pipe) and its copy with two (8a61978p2: FLASHATTN_POLY_EXP 2), timed in turn against cuDNN
# (bisect_fwd.sh, PASS=bwd); then the clock64 trace of 8a61978 (trace_patch.py).
set -uo pipefail
export CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
export ONLY=sm90_fwd_bf16_hdim128,sm90_fwd_bf16_hdim128_local,sm90_bwd_bf16_hdim128,sm90_bwd_bf16_hdim128_local
for tree in build/trace20/*/; do
  ( cd "$tree" && CUDA_HOME=/usr/local/cuda TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=2 \
    FLASHATTN_KERNELS_ONLY=sm90_fwd_bf16_hdim128,sm90_bwd_bf16_hdim128 python3 setup.py build_ext --inplace > "$OUT/build_trace_$(basename $tree).log" 2>&1
    echo "trace build $(basename $tree) rc $? at ${SECONDS}s" ) &
done
JOBS=4 PASS=bwd DIMS=128 bash scripts/bisect_fwd.sh build/ab20 2>&1 | tail -5
wait
echo "A/B done at ${SECONDS}s"
cat "$OUT/bisect.jsonl"
for tree in build/trace20/*/; do
  name=$(basename $tree)
  (cd / && PYTHONPATH="$OLDPWD/$tree" timeout 60 python3 -c "
import torch; from flashattn import flash_attn_func
q,k,v=(torch.randn(2,8192,16,128,device='cuda',dtype=torch.bfloat16,requires_grad=True) for _ in range(3))
o=flash_attn_func(q,k,v); do=torch.randn_like(o)
for i in range(6): torch.autograd.grad(o,(q,k,v),do,retain_graph=True)
torch.cuda.synchronize()") > "$OUT/trace-$name.txt" 2>&1
  echo "trace $name rc $? lines $(grep -c TRACE "$OUT/trace-$name.txt") at ${SECONDS}s"
done
