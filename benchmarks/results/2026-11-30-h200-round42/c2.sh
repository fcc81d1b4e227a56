#!/bin/bash
# Round 42, call 2: main (A, 72d7be4: csrc as f43eb6e) against two d256 dK/dV candidates:
#   S  exp/d256-s-ahead: the P warpgroup issues the next step's S behind both warpgroups' dV^T (it waits
#      for the dS warpgroup's issue at named barrier 4), so it runs while dS is made;
#   S2 exp/d256-s-ahead-nobar: S without that wait.
# Kernels-only bf16 d256 builds (tarballs in out/, carried); smoke37.py, racecheck and synccheck on
# S; then kernels.py alternating A S S2 three times.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R36=benchmarks/results/2026-11-30-h200-round36
R37=benchmarks/results/2026-11-30-h200-round37
PY=$(command -v python3)
KALL='sm90_fwd_bf16_hdim256*,sm90_bwd_bf16_hdim256*'
KTIME='sm90_fwd_bf16_hdim256,sm90_fwd_bf16_hdim256_local,sm90_bwd_bf16_hdim256,sm90_bwd_bf16_hdim256_local'
for t in A S S2; do
  rm -rf /tmp/$t && mkdir -p /tmp/$t && tar -xzf out/$t.tar.gz -C /tmp/$t
  K=$KTIME; [ $t = S ] && K=$KALL
  (cd /tmp/$t && FLASHATTN_KERNELS_ONLY="$K" MAX_JOBS=5 $PY setup.py build_ext --inplace > /tmp/build$t.log 2>&1; echo "build $t rc $? at ${SECONDS}s") &
done
wait
grep -h -i "spill" /tmp/build*.log | head -5
(cd /tmp && PYTHONPATH=/tmp/S:$OLDPWD timeout 90 $PY $OLDPWD/$R37/smoke37.py --hdims=256 --dtypes=bf16 > "$OUT/smoke_S.log" 2>&1; echo "smoke S rc $? at ${SECONDS}s: $(tail -1 "$OUT/smoke_S.log")")
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in racecheck synccheck; do
  (cd /tmp && PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=/tmp/S:$OLDPWD timeout 100 $CS --tool $tool $PY $OLDPWD/$R36/sanitize_det256.py > "$OUT/$tool.log" 2>&1
   echo "$tool rc $? at ${SECONDS}s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|calls completed' "$OUT/$tool.log" | tr '\n' ' ')")
done
for r in 1 2 3; do
  for t in A S S2; do
    [ $SECONDS -gt 520 ] && { echo "skip kernels $t"; continue; }
    (cd /tmp && PYTHONPATH=/tmp/$t:$OLDPWD timeout 25 $PY $OLDPWD/$R37/kernels.py --hdims=256 --only=flashattn 2>&1 | grep -v Warn >> "$OUT/kernels_$t.log")
    echo "$t $(grep -h -E "^D=|bwd_kernel|bwd_dq_kernel" "$OUT/kernels_$t.log" | tail -9 | awk '/^D=/{printf "| %s %s ",$2,$3} /bwd_kernel/{printf "%s ",$1} /bwd_dq_kernel/{printf "%s ",$1}') at ${SECONDS}s"
  done
done
echo "done at ${SECONDS}s"
