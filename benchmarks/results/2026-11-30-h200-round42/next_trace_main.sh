#!/bin/bash
# Prepared in round 42 for the next session (not run): the trace of main's d256 dK/dV step. On a
# tree with trace_main.patch applied (git apply), a kernels-only bf16 d256 build, then round 41's
# trace_driver.py at 8k and 8k causal; read with trace_steps42.py --layout=main. About 60 s.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1 MAX_JOBS=16
SECONDS=0
PY=$(command -v python3)
FLASHATTN_KERNELS_ONLY='sm90_fwd_bf16_hdim256,sm90_fwd_bf16_hdim256_local,sm90_bwd_bf16_hdim256,sm90_bwd_bf16_hdim256_local' \
  $PY setup.py build_ext --inplace > /tmp/build.log 2>&1
echo "build rc $? at ${SECONDS}s"; grep -i "spill\|error" /tmp/build.log | head -5
for args in "8192 0" "8192 1"; do
  set -- $args
  PYTHONPATH=$PWD timeout 60 $PY benchmarks/results/2026-11-30-h200-round41/trace_driver.py $1 $2 > "$OUT/trace-s$1-c$2.txt" 2>&1
  echo "trace $1 $2 rc $? at ${SECONDS}s lines $(grep -c TRACE "$OUT/trace-s$1-c$2.txt")"
  $PY benchmarks/results/2026-11-30-h200-round42/trace_steps42.py --layout=main "$OUT/trace-s$1-c$2.txt"
done
