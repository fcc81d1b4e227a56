#!/bin/bash
# Round 34, call 2 (one H200): orders of the d256 backward's dQ reds, one build each (tree copies in /tmp,
# `setup.py build_ext --inplace`, only the d256 bf16 forward and backward
# instantiations, plain and local (causal), built; csrc/sm90/bwd_kernel.cuh's
# FLASHATTN_EXP_ORDER): 0 = call 1's branch, 1 = no reds (dQ wrong: the ceiling), 2 = dQ_0 and dQ_1 in two
# register sets before dK, 3 = FlashAttention-3's order, 6 = dQ_1's reds after the next step's S is issued.
# Each timed twice (round robin) with cuDNN in the same process (time_bwd.py); Nsight Compute on the best.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R=benchmarks/results/2026-11-30-h200-round34
PY=$(command -v python3)
ORDERS="0 1 2 3 6"
for o in $ORDERS; do
  mkdir -p /tmp/v$o && tar --exclude=./build --exclude=./.fa3 -cf - . | tar -xf - -C /tmp/v$o
  sed -i "s/^#define FLASHATTN_EXP_ORDER 0$/#define FLASHATTN_EXP_ORDER $o/" /tmp/v$o/csrc/sm90/bwd_kernel.cuh
  grep -c "^#define FLASHATTN_EXP_ORDER $o$" /tmp/v$o/csrc/sm90/bwd_kernel.cuh > /dev/null || { echo "order $o not set"; exit 1; }
  (cd /tmp/v$o && FLASHATTN_KERNELS_ONLY='sm90_bwd_bf16_hdim256,sm90_bwd_bf16_hdim256_local,sm90_fwd_bf16_hdim256,sm90_fwd_bf16_hdim256_local' MAX_JOBS=4 $PY setup.py build_ext --inplace > "/tmp/build_o$o.log" 2>&1
   echo "build o$o rc $? at ${SECONDS}s: $(grep -o 'flashattn build: compiled.*' "/tmp/build_o$o.log" | cut -c1-200)") &
done
wait
for round in 1 2; do
  for o in $ORDERS; do
    flag=""; { [ $round = 2 ] || [ $o = 1 ]; } && flag=--no-check
    PYTHONPATH=/tmp/v$o timeout 100 $PY $R/time_bwd.py o$o $flag 2>&1 | tee -a "$OUT/time.log" | grep -E "^(row|check)|Error" | grep -v " ok$" | cut -c1-240
  done
  echo "round $round done at ${SECONDS}s"
done
best=$(grep "^row" "$OUT/time.log" | grep -v "row o1 " | grep "causal=0 S=8192" | sort -k6 -n -r | head -1 | awk '{print $2}')
grep "^check" "$OUT/time.log" | grep -c " ok$" | sed "s/^/checks ok: /"
echo "best at 8k: $best"
o=${best#o}
PYTHONPATH=/tmp/v$o timeout 150 ncu --clock-control none -k 'regex:^bwd_kernel$' --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section SourceCounters --section SchedulerStats \
  -o "$OUT/prof_$best" -f $PY - <<'PYEOF' > "$OUT/prof.log" 2>&1
import torch
from flashattn import flash_attn_func
q, k, v = (torch.randn(2, 8192, 8, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
out = flash_attn_func(q, k, v)
torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
torch.cuda.synchronize()
PYEOF
echo "profile rc $? at ${SECONDS}s"
ncu --import "$OUT/prof_$best.ncu-rep" --page source --csv --print-source sass > "$OUT/prof_$best-source.csv" 2>&1
$PY scripts/ncu_stalls.py "$OUT/prof_$best-source.csv" > "$OUT/prof_$best-stalls.txt" 2>&1
head -42 "$OUT/prof_$best-stalls.txt"; rm -f "$OUT/prof_$best.ncu-rep"; gzip "$OUT/prof_$best-source.csv"
