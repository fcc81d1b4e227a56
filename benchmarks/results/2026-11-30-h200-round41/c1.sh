#!/bin/bash
# Prepared in round 40 for a later session (not run): two candidate changes to the d256 backward's
# steps, each alone and together, against main. Trees (branches):
#   A main;
#   B exp/d256-p-arrive: the dK/dV kernel's P warpgroup issues dV^T once its own P stores are
#     complete, not after the barrier that the dS warpgroup passes when dP completes;
#   C exp/d256-dq-turns: the dQ kernel's warpgroup 1 issues its S and dP behind warpgroup 0's;
#   D exp/d256-candidates: B and C.
# Before the call, here:
#   for t in A:main B:exp/d256-p-arrive C:exp/d256-dq-turns D:exp/d256-candidates; do
#     git archive --format=tar.gz -o out/${t%%:*}.tar.gz ${t#*:} csrc flashattn setup.py; done
# then run this script (from any checkout that has it) with carry ["out"]. Each tree is built
# kernels-only (bf16 d256, forward and backward) in /tmp. On D: smoke37.py at d256 (bf16) and
# racecheck and synccheck over round 36's sanitize_det256.py (d256 and d200, masked and not,
# softcap, a packed batch). Then kernels.py and time37.py, A B C D twice.
# Predictions: B 1-3% off the dK/dV kernel (each step's dP -> dV^T gap: wgmma wait, a 256-thread
# barrier, the issue); C 3-7% off the dQ kernel (both warpgroups make dS at once, the tensor cores
# idle meanwhile); D about their sum, 2-5% off the d256 backward call, any mask.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R36=benchmarks/results/2026-11-30-h200-round36
R37=benchmarks/results/2026-11-30-h200-round37
PY=$(command -v python3)
KALL='sm90_fwd_bf16_hdim256*,sm90_bwd_bf16_hdim256*'
for t in A B C D; do
  rm -rf /tmp/$t && mkdir -p /tmp/$t && tar -xzf out/$t.tar.gz -C /tmp/$t
  (cd /tmp/$t && FLASHATTN_KERNELS_ONLY="$KALL" MAX_JOBS=4 $PY setup.py build_ext --inplace > /tmp/build$t.log 2>&1; echo "build $t rc $? at ${SECONDS}s") &
done
wait
grep -c "kPStoredBarrier\|kTurnBarrier" /tmp/{A,B,C,D}/csrc/sm90/bwd_kernel.cuh /tmp/{A,B,C,D}/csrc/sm90/bwd_dq_kernel.cuh
(cd /tmp && PYTHONPATH=/tmp/D:$OLDPWD timeout 90 $PY $OLDPWD/$R37/smoke37.py --hdims=256 --dtypes=bf16 > "$OUT/smoke_D.log" 2>&1; echo "smoke D rc $? at ${SECONDS}s: $(tail -1 "$OUT/smoke_D.log")")
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in racecheck synccheck; do
  [ $SECONDS -gt 300 ] && { echo "skip $tool"; continue; }
  (cd /tmp && PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=/tmp/D:$OLDPWD timeout 100 $CS --tool $tool $PY $OLDPWD/$R36/sanitize_det256.py > "$OUT/$tool.log" 2>&1
   echo "$tool rc $? at ${SECONDS}s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|calls completed' "$OUT/$tool.log" | tr '\n' ' ')")
done
for t in A B C D A B C D; do
  [ $SECONDS -gt 480 ] && { echo "skip kernels $t"; continue; }
  (cd /tmp && PYTHONPATH=/tmp/$t:$OLDPWD timeout 30 $PY $OLDPWD/$R37/kernels.py --hdims=256 --only=flashattn 2>&1 | grep -v Warn >> "$OUT/kernels_$t.log"; echo "kernels $t at ${SECONDS}s")
  grep -h -E "^D=|bwd_kernel|bwd_dq_kernel" "$OUT/kernels_$t.log" | tail -9 | cut -c1-80 | paste - - - | cut -c1-200
done
for t in A B C D A B C D; do
  [ $SECONDS -gt 560 ] && { echo "skip time $t"; continue; }
  (cd /tmp && PYTHONPATH=/tmp/$t:$OLDPWD timeout 30 $PY $OLDPWD/$R37/time37.py --hdims=256 --rounds=1 2>&1 | tee -a "$OUT/time_$t.log" | grep row | sed "s/^/$t /" | cut -c1-110)
done
echo "done at ${SECONDS}s"
