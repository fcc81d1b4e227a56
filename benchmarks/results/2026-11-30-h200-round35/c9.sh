#!/bin/bash
# Round 35, call 10 (one H200; carries .fa3/lib): why our causal backward trails FA3's by 9-10% at d128 and
# d256 8k while the non-causal one ties it. Nsight Compute, metrics only, on one causal call each of ours
# (main, ce42535's kernels: a kernels-only build of the d128 and d256 bf16 local instantiations) and FA3's, d128
# (B 2, H 16) and d256 (B 2, H 8) at 8k: duration, the SMs' active cycles over elapsed ones (a grid that ends
# on long tiles leaves SMs idle: lower), L2 hit rate, DRAM throughput.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
PY=$(command -v python3)
mkdir -p /tmp/fa3 && cp .fa3/lib/libfa3.so /tmp/fa3/ && export FLASHATTN_FA3_LIB=/tmp/fa3/libfa3.so
rm -f flashattn/_C*.so
FLASHATTN_KERNELS_ONLY='sm90_bwd_bf16_hdim128_local,sm90_bwd_bf16_hdim256_local,sm90_fwd_bf16_hdim128_local,sm90_fwd_bf16_hdim256_local' MAX_JOBS=16 $PY setup.py build_ext --inplace > /tmp/build.log 2>&1
echo "build rc $? at ${SECONDS}s"
timeout 150 ncu --clock-control none --kernel-name-base demangled -k 'regex:sm90::bwd_kernel|FlashAttnBwdSm90' --launch-count 4 \
  --metrics gpu__time_duration.sum,sm__cycles_active.avg,sm__cycles_elapsed.avg,lts__t_sector_hit_rate.pct,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed \
  $PY - > "$OUT/ncu.log" 2>&1 <<'PYEOF'
import sys
sys.path.insert(0, ".")
import torch
from benchmarks.backends import fa3_fn, flash_attention_3
from flashattn import flash_attn_func
fa3, _ = flash_attention_3()
for d, h in ((128, 16), (256, 8)):
    q, k, v = (torch.randn(2, 8192, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)
    for fn in (lambda: flash_attn_func(q, k, v, causal=True), fa3_fn(fa3, q, k, v, True, d ** -0.5)):
        torch.autograd.grad(fn(), (q, k, v), dout)
torch.cuda.synchronize()
PYEOF
echo "ncu rc $? at ${SECONDS}s"
grep -E "bwd_kernel<|FlashAttnBwdSm90<|gpu__time|sm__cycles|lts__|dram__" "$OUT/ncu.log" | sed -E 's/(void [a-z:_]*[A-Za-z]*)<.{0,60}.*/\1/' | cut -c1-110
