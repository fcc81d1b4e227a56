#!/bin/bash
# Round 42, call 3: S3 (exp/d256-s-ahead-do: the next step's S issued behind dV^T, and dO released
# by each warpgroup as soon as its dV^T is complete) against main (A); T3 (exp/d256-s3-trace: S3
# with one block's per-step clocks) traced at 8k and 8k causal. Kernels-only bf16 d256 builds
# (tarballs in out/, carried); smoke37.py, racecheck and synccheck on S3; kernels.py A S3 three times.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R36=benchmarks/results/2026-11-30-h200-round36
R37=benchmarks/results/2026-11-30-h200-round37
R41=benchmarks/results/2026-11-30-h200-round41
PY=$(command -v python3)
KALL='sm90_fwd_bf16_hdim256*,sm90_bwd_bf16_hdim256*'
KTIME='sm90_fwd_bf16_hdim256,sm90_fwd_bf16_hdim256_local,sm90_bwd_bf16_hdim256,sm90_bwd_bf16_hdim256_local'
for t in A S3 T3; do
  rm -rf /tmp/$t && mkdir -p /tmp/$t && tar -xzf out/$t.tar.gz -C /tmp/$t
  K=$KTIME; [ $t = S3 ] && K=$KALL
  (cd /tmp/$t && FLASHATTN_KERNELS_ONLY="$K" MAX_JOBS=5 $PY setup.py build_ext --inplace > /tmp/build$t.log 2>&1; echo "build $t rc $? at ${SECONDS}s") &
done
wait
for args in "8192 0" "8192 1"; do
  set -- $args
  (cd /tmp && PYTHONPATH=/tmp/T3 timeout 60 $PY $OLDPWD/$R41/trace_driver.py $1 $2 > "$OUT/trace-s$1-c$2.txt" 2>&1
   echo "trace $1 $2 rc $? at ${SECONDS}s lines $(grep -c TRACE "$OUT/trace-s$1-c$2.txt")")
done
(cd /tmp && PYTHONPATH=/tmp/S3:$OLDPWD timeout 90 $PY $OLDPWD/$R37/smoke37.py --hdims=256 --dtypes=bf16 > "$OUT/smoke_S3.log" 2>&1; echo "smoke S3 rc $? at ${SECONDS}s: $(tail -1 "$OUT/smoke_S3.log")")
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in racecheck synccheck; do
  (cd /tmp && PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=/tmp/S3:$OLDPWD timeout 100 $CS --tool $tool $PY $OLDPWD/$R36/sanitize_det256.py > "$OUT/$tool.log" 2>&1
   echo "$tool rc $? at ${SECONDS}s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|calls completed' "$OUT/$tool.log" | tr '\n' ' ')")
done
for r in 1 2 3; do
  for t in A S3; do
    [ $SECONDS -gt 400 ] && { echo "skip kernels $t"; continue; }
    (cd /tmp && PYTHONPATH=/tmp/$t:$OLDPWD timeout 25 $PY $OLDPWD/$R37/kernels.py --hdims=256 --only=flashattn 2>&1 | grep -v Warn >> "$OUT/kernels_$t.log")
    echo "$t $(grep -h -E "^D=|bwd_kernel|bwd_dq_kernel" "$OUT/kernels_$t.log" | tail -9 | awk '/^D=/{printf "| %s %s ",$2,$3} /bwd_kernel/{printf "%s ",$1} /bwd_dq_kernel/{printf "%s ",$1}') at ${SECONDS}s"
  done
done
echo "done at ${SECONDS}s"
