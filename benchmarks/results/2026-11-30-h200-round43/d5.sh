#!/bin/bash
# Round 43, call 9: the trace of main's d256 dK/dV step with two more events in the P warpgroup
# (trace_main43.patch = round 42's trace_main.patch + 10: past the dV^T barrier, 11: the next Q ready),
# on a copy of the tree, kernels-only bf16 d256; round 41's trace_driver.py at 8k and 8k causal, read
# with trace_steps42.py --layout=main.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1 MAX_JOBS=16
SECONDS=0
PY=$(command -v python3)
ROOT=$PWD
R=benchmarks/results/2026-11-30-h200-round43
rm -rf /tmp/trace && mkdir /tmp/trace && cp -r $(ls -A | grep -vx ".fa4\|.git\|build") /tmp/trace/ &&
  (cd /tmp/trace && patch -p1 < "$ROOT/$R/trace_main43.patch" > /tmp/patch.log 2>&1; echo "patch rc $?")
(cd /tmp/trace && FLASHATTN_KERNELS_ONLY='sm90_fwd_bf16_hdim256,sm90_fwd_bf16_hdim256_local,sm90_bwd_bf16_hdim256,sm90_bwd_bf16_hdim256_local' \
  $PY setup.py build_ext --inplace > /tmp/build_trace.log 2>&1; echo "trace build rc $? at ${SECONDS}s")
for args in "8192 0" "8192 1"; do
  set -- $args
  (cd /tmp/trace && PYTHONPATH=/tmp/trace timeout 60 $PY "$ROOT/benchmarks/results/2026-11-30-h200-round41/trace_driver.py" $1 $2) > "$OUT/trace-s$1-c$2.txt" 2>&1
  echo "trace $1 $2 rc $? at ${SECONDS}s lines $(grep -c TRACE "$OUT/trace-s$1-c$2.txt")"
  $PY benchmarks/results/2026-11-30-h200-round42/trace_steps42.py --layout=main "$OUT/trace-s$1-c$2.txt"
done
echo "done at ${SECONDS}s"
