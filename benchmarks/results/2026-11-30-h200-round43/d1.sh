#!/bin/bash
# Round 43, call 1 (carry .fa4/a): FlashAttention-4's first part into /tmp/fa4; a kernels-only bf16 d256
# build of main; round 42's bimodal.py in eight flashattn and four cuDNN processes; then round 42's
# trace of main's d256 dK/dV step (trace_main.patch on a copy of the tree, its own kernels-only build).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1 MAX_JOBS=16
SECONDS=0
PY=$(command -v python3)
ROOT=$PWD
bash scripts/stage_fa4.sh part1 && echo "fa4 part 1 staged: $(ls /tmp/fa4 | wc -l) files"
R42=benchmarks/results/2026-11-30-h200-round42
ONLY='sm90_fwd_bf16_hdim256,sm90_fwd_bf16_hdim256_local,sm90_bwd_bf16_hdim256,sm90_bwd_bf16_hdim256_local'
# Both builds at once (the trace tree: trace_main.patch on a copy), finished before any timing.
rm -rf /tmp/trace && mkdir /tmp/trace && cp -r $(ls -A | grep -vx ".fa4\|.git\|build") /tmp/trace/ &&
  (cd /tmp/trace && patch -p1 < "$ROOT/$R42/trace_main.patch" > /tmp/patch.log 2>&1; echo "patch rc $?")
(cd /tmp/trace && FLASHATTN_KERNELS_ONLY=$ONLY MAX_JOBS=8 $PY setup.py build_ext --inplace > /tmp/build_trace.log 2>&1; echo "trace build rc $? at ${SECONDS}s") &
FLASHATTN_KERNELS_ONLY=$ONLY MAX_JOBS=8 $PY setup.py build_ext --inplace > /tmp/build.log 2>&1
echo "build rc $? at ${SECONDS}s"
wait
for i in 1 2 3 4 5 6 7 8; do
  PYTHONPATH=$PWD timeout 40 $PY $R42/bimodal.py --rounds=5 > "$OUT/bimodal-fa-$i.log" 2>&1
  echo "flashattn $i at ${SECONDS}s: $(grep -E '^round' "$OUT/bimodal-fa-$i.log" | awk '{print $5}' | tr '\n' ' ') $(grep -m1 'overlapping' "$OUT/bimodal-fa-$i.log")"
done
for i in 1 2 3 4; do
  PYTHONPATH=$PWD timeout 40 $PY $R42/bimodal.py --rounds=3 --backend=cudnn > "$OUT/bimodal-cudnn-$i.log" 2>&1
  echo "cudnn $i at ${SECONDS}s: $(grep -E '^round' "$OUT/bimodal-cudnn-$i.log" | awk '{print $5}' | tr '\n' ' ') $(grep -m1 '^call 1' "$OUT/bimodal-cudnn-$i.log" | cut -c1-60)"
done
cp /tmp/build_trace.log "$OUT/" 
for args in "8192 0" "8192 1"; do
  set -- $args
  (cd /tmp/trace && PYTHONPATH=/tmp/trace timeout 60 $PY "$ROOT/benchmarks/results/2026-11-30-h200-round41/trace_driver.py" $1 $2) > "$OUT/trace-s$1-c$2.txt" 2>&1
  echo "trace $1 $2 rc $? at ${SECONDS}s lines $(grep -c TRACE "$OUT/trace-s$1-c$2.txt")"
  $PY $R42/trace_steps42.py --layout=main "$OUT/trace-s$1-c$2.txt"
done
echo "done at ${SECONDS}s"
