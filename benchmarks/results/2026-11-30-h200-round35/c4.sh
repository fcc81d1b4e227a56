#!/bin/bash
# Round 35, call 4 (one H200): under a causal mask or a window the backward's grid becomes (KV heads, key
# tiles, batch): every pair's key tile 0 (the longest) first, then key tile 1, ..., so the grid ends on short
# tiles (it ended on the last pair's longest). Kernels-only build of the d256 and d128 instantiations (extras
# included) in place; round 33's c1_smoke.py, compute-sanitizer memcheck and racecheck on c4_sanitize_d256.py,
# then kernels.py (kernel by kernel, with FA3 and cuDNN) at d256 and d128; Nsight Compute's memory figures
# of our causal d256 8k backward (DRAM: do the heads at once still hit L2?).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R=benchmarks/results/2026-11-30-h200-round35
R33=benchmarks/results/2026-11-30-h200-round33
PY=$(command -v python3)
mkdir -p /tmp/fa3 && cp .fa3/lib/libfa3.so /tmp/fa3/ && export FLASHATTN_FA3_LIB=/tmp/fa3/libfa3.so
rm -f flashattn/_C*.so
FLASHATTN_KERNELS_ONLY='sm90_*hdim256*,sm90_*hdim128*' MAX_JOBS=16 $PY setup.py build_ext --inplace > /tmp/build.log 2>&1
echo "build rc $? at ${SECONDS}s: $(grep -o 'flashattn build: compiled.*' /tmp/build.log | cut -c1-120)"
timeout 150 $PY $R33/c1_smoke.py > "$OUT/smoke.log" 2>&1
echo "smoke rc $? at ${SECONDS}s: $(grep -c ': ok$' "$OUT/smoke.log") ok"; grep -v ": ok$" "$OUT/smoke.log" | cut -c1-300 | tail -6
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck; do
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 100 $CS --tool $tool $PY $R33/c4_sanitize_d256.py > "$OUT/sanitize_$tool.log" 2>&1
  echo "$tool rc $? at ${SECONDS}s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|calls completed' "$OUT/sanitize_$tool.log" | tr '\n' ' ')"
done
timeout 200 $PY $R/kernels.py --hdims=256,128 2>&1 | tee "$OUT/kernels.log" | grep -v Warn | grep -E "^D=|bwd_kernel|FlashAttnBwdSm90|cudnn_gen" | cut -c1-110
echo "kernels done at ${SECONDS}s"
timeout 120 ncu --clock-control none --kernel-name-base demangled -k 'regex:sm90::bwd_kernel' --launch-count 1 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis -o /tmp/prof -f $PY - > "$OUT/ncu.log" 2>&1 <<'PYEOF'
import sys
sys.path.insert(0, ".")
import torch
from flashattn import flash_attn_func
q, k, v = (torch.randn(2, 8192, 8, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
torch.autograd.grad(flash_attn_func(q, k, v, causal=True), (q, k, v), torch.randn_like(q))
torch.cuda.synchronize()
PYEOF
echo "ncu rc $? at ${SECONDS}s"
ncu --import /tmp/prof.ncu-rep --page details 2>&1 | grep -E "Duration|DRAM Throughput|L2 Cache Throughput|L2 Hit|Compute \(SM\) Throughput" | cut -c1-100
