#!/bin/bash
# Round 34, call 4 (one H200): what the d256 backward's dQ adds cost, by what they are replaced with
# (FLASHATTN_EXP_DQ, order 0, no rotation): e0 = the 16-byte reds (main's), e1 = plain 16-byte stores to the
# same addresses (dQ wrong: the cost of the write traffic without the L2's adds), e2 = nothing (call 2's o1).
# Builds as call 2; timed twice round robin with cuDNN in the same process (time_bwd.py; e0 checked).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R=benchmarks/results/2026-11-30-h200-round34
PY=$(command -v python3)
VARIANTS="e0:0 e1:1 e2:2"
for spec in $VARIANTS; do
  IFS=: read -r name dq <<< "$spec"
  mkdir -p /tmp/$name && tar --exclude=./build --exclude=./.fa3 -cf - . | tar -xf - -C /tmp/$name
  sed -i "s/^#define FLASHATTN_EXP_DQ 0$/#define FLASHATTN_EXP_DQ $dq/; s/^#define FLASHATTN_EXP_ROT 1$/#define FLASHATTN_EXP_ROT 0/" /tmp/$name/csrc/sm90/bwd_kernel.cuh
  grep -q "^#define FLASHATTN_EXP_DQ $dq$" /tmp/$name/csrc/sm90/bwd_kernel.cuh && grep -q "^#define FLASHATTN_EXP_ROT 0$" /tmp/$name/csrc/sm90/bwd_kernel.cuh || { echo "$name not set"; exit 1; }
  (cd /tmp/$name && FLASHATTN_KERNELS_ONLY='sm90_bwd_bf16_hdim256,sm90_bwd_bf16_hdim256_local,sm90_fwd_bf16_hdim256,sm90_fwd_bf16_hdim256_local' MAX_JOBS=5 $PY setup.py build_ext --inplace > "/tmp/build_$name.log" 2>&1
   echo "build $name rc $? at ${SECONDS}s: $(grep -o 'flashattn build: compiled.*' "/tmp/build_$name.log" | cut -c1-120)") &
done
wait
for round in 1 2; do
  for spec in $VARIANTS; do
    IFS=: read -r name dq <<< "$spec"
    flag=""; { [ $round = 2 ] || [ $dq != 0 ]; } && flag=--no-check
    PYTHONPATH=/tmp/$name timeout 100 $PY $R/time_bwd.py $name $flag 2>&1 | tee -a "$OUT/time.log" | grep -E "^(row|check)|Error" | grep -v " ok$" | cut -c1-240
  done
  echo "round $round done at ${SECONDS}s"
done
grep "^check" "$OUT/time.log" | grep -c " ok$" | sed "s/^/checks ok: /"
