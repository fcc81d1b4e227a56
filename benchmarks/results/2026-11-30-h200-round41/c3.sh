#!/bin/bash
# Round 41, call 3: the d256 dK/dV kernel's per-step clocks (branch exp/d256-trace), 8k, 8k causal, 2k.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1 MAX_JOBS=16
SECONDS=0
PY=$(command -v python3)
FLASHATTN_KERNELS_ONLY='sm90_fwd_bf16_hdim256*,sm90_bwd_bf16_hdim256*' $PY setup.py build_ext --inplace > /tmp/build.log 2>&1
echo "build rc $? at ${SECONDS}s"; grep -i "spill\|error" /tmp/build.log | head -5
for args in "8192 0" "8192 1" "2048 0"; do
  set -- $args
  PYTHONPATH=$PWD timeout 60 $PY benchmarks/results/2026-11-30-h200-round41/trace_driver.py $1 $2 > "$OUT/trace-s$1-c$2.txt" 2>&1
  echo "trace $1 $2 rc $? at ${SECONDS}s lines $(grep -c TRACE "$OUT/trace-s$1-c$2.txt")"
done
