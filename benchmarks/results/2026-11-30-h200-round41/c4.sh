#!/bin/bash
# Round 41, call 4: main (A) against exp/d256-batch-ldsm (E): the dS warpgroup loads all of P
# before it stores dS, and the P warpgroup reads the LSE while S runs. Kernels-only bf16 d256
# builds of both (tarballs in out/); smoke37.py, racecheck and synccheck on E; then kernels.py
# and time37.py alternating A E.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R36=benchmarks/results/2026-11-30-h200-round36
R37=benchmarks/results/2026-11-30-h200-round37
PY=$(command -v python3)
KALL='sm90_fwd_bf16_hdim256*,sm90_bwd_bf16_hdim256*'
for t in A E; do
  rm -rf /tmp/$t && mkdir -p /tmp/$t && tar -xzf out/$t.tar.gz -C /tmp/$t
  (cd /tmp/$t && FLASHATTN_KERNELS_ONLY="$KALL" MAX_JOBS=8 $PY setup.py build_ext --inplace > /tmp/build$t.log 2>&1; echo "build $t rc $? at ${SECONDS}s") &
done
wait
(cd /tmp && PYTHONPATH=/tmp/E:$OLDPWD timeout 90 $PY $OLDPWD/$R37/smoke37.py --hdims=256 --dtypes=bf16 > "$OUT/smoke_E.log" 2>&1; echo "smoke E rc $? at ${SECONDS}s: $(tail -1 "$OUT/smoke_E.log")")
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in racecheck synccheck; do
  (cd /tmp && PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=/tmp/E:$OLDPWD timeout 100 $CS --tool $tool $PY $OLDPWD/$R36/sanitize_det256.py > "$OUT/$tool.log" 2>&1
   echo "$tool rc $? at ${SECONDS}s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|calls completed' "$OUT/$tool.log" | tr '\n' ' ')")
done
for t in A E A E; do
  (cd /tmp && PYTHONPATH=/tmp/$t:$OLDPWD timeout 30 $PY $OLDPWD/$R37/kernels.py --hdims=256 --only=flashattn 2>&1 | grep -v Warn >> "$OUT/kernels_$t.log"; echo "kernels $t at ${SECONDS}s")
  grep -h -E "^D=|bwd_kernel|bwd_dq_kernel" "$OUT/kernels_$t.log" | tail -9 | cut -c1-80 | paste - - - | cut -c1-200
done
for t in A E A E A E; do
  [ $SECONDS -gt 400 ] && { echo "skip time $t"; continue; }
  (cd /tmp && PYTHONPATH=/tmp/$t:$OLDPWD timeout 30 $PY $OLDPWD/$R37/time37.py --hdims=256 --rounds=1 2>&1 | tee -a "$OUT/time_$t.log" | grep row | sed "s/^/$t /" | cut -c1-110)
done
echo "done at ${SECONDS}s"
