#!/bin/bash
# Round 42, call 4: main (A) against
#   S4 exp/d256-s4: S3, and the P warpgroup makes the next step's P while dK^T runs (its S issued
#      ahead of dK^T), the loop's last step peeled so that ptxas keeps the wgmma pipelined;
#   S5 exp/d256-s5: S4, and the producer reads each step's row stats (LSE, D) a step ahead, so the
#      dO copy is not held behind their ~1500-clock reads (all backward main kernels: d128 timed too).
# Kernels-only builds (tarballs in out/, carried); smoke37.py, racecheck and synccheck on S5 (d256);
# kernels.py at d256 A S4 S5 three times, at d128 A S5 twice.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R36=benchmarks/results/2026-11-30-h200-round36
R37=benchmarks/results/2026-11-30-h200-round37
PY=$(command -v python3)
KALL='sm90_fwd_bf16_hdim256*,sm90_bwd_bf16_hdim256*'
KTIME='sm90_fwd_bf16_hdim256,sm90_fwd_bf16_hdim256_local,sm90_bwd_bf16_hdim256,sm90_bwd_bf16_hdim256_local'
K128='sm90_fwd_bf16_hdim128,sm90_fwd_bf16_hdim128_local,sm90_bwd_bf16_hdim128,sm90_bwd_bf16_hdim128_local'
for t in A S4 S5; do
  rm -rf /tmp/$t && mkdir -p /tmp/$t && tar -xzf out/$t.tar.gz -C /tmp/$t
  case $t in A) K="$KTIME,$K128";; S4) K=$KTIME;; S5) K="$KALL,$K128";; esac
  (cd /tmp/$t && FLASHATTN_KERNELS_ONLY="$K" MAX_JOBS=5 $PY setup.py build_ext --inplace > /tmp/build$t.log 2>&1; echo "build $t rc $? at ${SECONDS}s"; grep -h "flashattn build:" /tmp/build$t.log) &
done
wait
(cd /tmp && PYTHONPATH=/tmp/S5:$OLDPWD timeout 90 $PY $OLDPWD/$R37/smoke37.py --hdims=256 --dtypes=bf16 > "$OUT/smoke_S5.log" 2>&1; echo "smoke S5 rc $? at ${SECONDS}s: $(tail -1 "$OUT/smoke_S5.log")")
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in racecheck synccheck; do
  (cd /tmp && PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=/tmp/S5:$OLDPWD timeout 100 $CS --tool $tool $PY $OLDPWD/$R36/sanitize_det256.py > "$OUT/$tool.log" 2>&1
   echo "$tool rc $? at ${SECONDS}s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|calls completed' "$OUT/$tool.log" | tr '\n' ' ')")
done
show() { grep -h -E "^D=|bwd_kernel|bwd_dq_kernel|convert_dq" "$1" | tail -$2 | awk '/^D=/{printf "| %s %s %s ",$1,$2,$3} /bwd_kernel/{printf "%s ",$1} /bwd_dq_kernel/{printf "%s ",$1}'; }
for r in 1 2 3; do
  for t in A S4 S5; do
    [ $SECONDS -gt 420 ] && { echo "skip kernels $t"; continue; }
    (cd /tmp && PYTHONPATH=/tmp/$t:$OLDPWD timeout 25 $PY $OLDPWD/$R37/kernels.py --hdims=256 --only=flashattn 2>&1 | grep -v Warn >> "$OUT/kernels_$t.log")
    echo "$t $(show "$OUT/kernels_$t.log" 9) at ${SECONDS}s"
  done
done
for r in 1 2; do
  for t in A S5; do
    [ $SECONDS -gt 450 ] && { echo "skip kernels128 $t"; continue; }
    (cd /tmp && PYTHONPATH=/tmp/$t:$OLDPWD timeout 25 $PY $OLDPWD/$R37/kernels.py --hdims=128 --only=flashattn 2>&1 | grep -v Warn >> "$OUT/kernels128_$t.log")
    echo "$t $(grep -h -E "^D=" "$OUT/kernels128_$t.log" | tail -3 | cut -d' ' -f1-7 | tr '\n' ' ') at ${SECONDS}s"
  done
done
echo "done at ${SECONDS}s"
