#!/bin/bash
# Round 41, call 8 (exploratory, the last of the round's device time): main (A, f43eb6e) against
# exp/d256-ds-in-p (F): the P warpgroup makes dS from the dS warpgroup's dP - D, and dV^T and dK^T
# are issued back to back. Kernels-only bf16 d256 builds; smoke37.py and racecheck on F; kernels.py
# alternating A F.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R36=benchmarks/results/2026-11-30-h200-round36
R37=benchmarks/results/2026-11-30-h200-round37
PY=$(command -v python3)
KALL='sm90_fwd_bf16_hdim256*,sm90_bwd_bf16_hdim256*'
for t in A F; do
  rm -rf /tmp/$t && mkdir -p /tmp/$t && tar -xzf out/$t.tar.gz -C /tmp/$t
  (cd /tmp/$t && FLASHATTN_KERNELS_ONLY="$KALL" MAX_JOBS=8 $PY setup.py build_ext --inplace > /tmp/build$t.log 2>&1; echo "build $t rc $? at ${SECONDS}s") &
done
wait
(cd /tmp && PYTHONPATH=/tmp/F:$OLDPWD timeout 60 $PY $OLDPWD/$R37/smoke37.py --hdims=256 --dtypes=bf16 > "$OUT/smoke_F.log" 2>&1; echo "smoke F rc $? at ${SECONDS}s: $(tail -1 "$OUT/smoke_F.log")")
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
(cd /tmp && PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=/tmp/F:$OLDPWD timeout 40 $CS --tool racecheck $PY $OLDPWD/$R36/sanitize_det256.py > "$OUT/racecheck.log" 2>&1
 echo "racecheck rc $? at ${SECONDS}s: $(grep -E 'RACECHECK SUMMARY|calls completed' "$OUT/racecheck.log" | tr '\n' ' ')")
for t in A F A F; do
  [ $SECONDS -gt 150 ] && { echo "skip kernels $t"; continue; }
  (cd /tmp && PYTHONPATH=/tmp/$t:$OLDPWD timeout 25 $PY $OLDPWD/$R37/kernels.py --hdims=256 --only=flashattn 2>&1 | grep -v Warn >> "$OUT/kernels_$t.log"; echo "kernels $t at ${SECONDS}s")
  grep -h -E "^D=|bwd_kernel|bwd_dq_kernel" "$OUT/kernels_$t.log" | tail -9 | cut -c1-80 | paste - - - | cut -c1-200
done
echo "done at ${SECONDS}s"
