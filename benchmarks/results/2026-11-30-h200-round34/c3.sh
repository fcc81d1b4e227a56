#!/bin/bash
# Round 34, call 3 (one H200): each block's query tiles started at its own (BwdWork::m_first = key tile
# mod query tiles, default mode), so that the blocks running at once add into different dQ tiles. Builds
# as call 2 (tree copies, FLASHATTN_EXP_ORDER and FLASHATTN_EXP_ROT set in each): r0 = call 2's o0 (no
# rotation), r1 = o0 rotated, r3 = o3 (FlashAttention-3's order) rotated; d256 and d128 bf16 (r3: d256).
# Timed twice round robin with cuDNN in the same process (time_bwd.py); Nsight Compute on r1's d256 8k.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R=benchmarks/results/2026-11-30-h200-round34
PY=$(command -v python3)
VARIANTS="r0:0:0:256,128 r1:0:1:256,128 r3:3:1:256"
K256='sm90_bwd_bf16_hdim256,sm90_bwd_bf16_hdim256_local,sm90_fwd_bf16_hdim256,sm90_fwd_bf16_hdim256_local'
K128='sm90_bwd_bf16_hdim128,sm90_bwd_bf16_hdim128_local,sm90_fwd_bf16_hdim128,sm90_fwd_bf16_hdim128_local'
for spec in $VARIANTS; do
  IFS=: read -r name order rot hd <<< "$spec"
  mkdir -p /tmp/$name && tar --exclude=./build --exclude=./.fa3 -cf - . | tar -xf - -C /tmp/$name
  sed -i "s/^#define FLASHATTN_EXP_ORDER 0$/#define FLASHATTN_EXP_ORDER $order/; s/^#define FLASHATTN_EXP_ROT 1$/#define FLASHATTN_EXP_ROT $rot/" /tmp/$name/csrc/sm90/bwd_kernel.cuh
  grep -q "^#define FLASHATTN_EXP_ORDER $order$" /tmp/$name/csrc/sm90/bwd_kernel.cuh && grep -q "^#define FLASHATTN_EXP_ROT $rot$" /tmp/$name/csrc/sm90/bwd_kernel.cuh || { echo "$name not set"; exit 1; }
  only=$K256; [ "$hd" = "256,128" ] && only="$K256,$K128"
  (cd /tmp/$name && FLASHATTN_KERNELS_ONLY="$only" MAX_JOBS=5 $PY setup.py build_ext --inplace > "/tmp/build_$name.log" 2>&1
   echo "build $name rc $? at ${SECONDS}s: $(grep -o 'flashattn build: compiled.*' "/tmp/build_$name.log" | cut -c1-200)") &
done
wait
for round in 1 2; do
  for spec in $VARIANTS; do
    IFS=: read -r name order rot hd <<< "$spec"
    flag=""; [ $round = 2 ] && flag=--no-check
    PYTHONPATH=/tmp/$name timeout 150 $PY $R/time_bwd.py $name --hdims=$hd $flag 2>&1 | tee -a "$OUT/time.log" | grep -E "^(row|check)|Error" | grep -v " ok$" | cut -c1-240
  done
  echo "round $round done at ${SECONDS}s"
done
grep "^check" "$OUT/time.log" | grep -c " ok$" | sed "s/^/checks ok: /"
PYTHONPATH=/tmp/r1 timeout 150 ncu --clock-control none -k 'regex:^bwd_kernel$' --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section SourceCounters --section SchedulerStats \
  -o "$OUT/prof_r1" -f $PY - <<'PYEOF' > "$OUT/prof.log" 2>&1
import torch
from flashattn import flash_attn_func
q, k, v = (torch.randn(2, 8192, 8, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
out = flash_attn_func(q, k, v)
torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
torch.cuda.synchronize()
PYEOF
echo "profile rc $? at ${SECONDS}s"; tail -3 "$OUT/prof.log"
ncu --import "$OUT/prof_r1.ncu-rep" --page source --csv --print-source sass > "$OUT/prof_r1-source.csv" 2>&1
$PY scripts/ncu_stalls.py "$OUT/prof_r1-source.csv" > "$OUT/prof_r1-stalls.txt" 2>&1
head -40 "$OUT/prof_r1-stalls.txt"; rm -f "$OUT/prof_r1.ncu-rep"; gzip "$OUT/prof_r1-source.csv"
