#!/bin/bash
# Round 35, call 1 (one H200): the d256 backward's dQ in four 32-column quarters through two 16-register
# sets (csrc/sm90/bwd_kernel.cuh's FLASHATTN_EXP_Q4: 0 = main's two 64-column slices in one set, 1 and 2 =
# quarters, two orders), so that a quarter's GEMM never writes the registers the previous quarter's reds
# still read. One tree copy per variant in /tmp (`setup.py build_ext --inplace`, d256 bf16 forward and
# backward, plain and local), each timed twice round robin with cuDNN in the same process
# (round 34's time_bwd.py), gradients checked against the fp32 reference in round 1.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R=benchmarks/results/2026-11-30-h200-round34
PY=$(command -v python3)
VARIANTS="${VARIANTS:-0 1 2}"
for o in $VARIANTS; do
  mkdir -p /tmp/v$o && tar --exclude=./build --exclude=./.fa3 --exclude=./.fa4 --exclude=./.main_csrc -cf - . | tar -xf - -C /tmp/v$o
  sed -i "s/^#define FLASHATTN_EXP_Q4 0$/#define FLASHATTN_EXP_Q4 $o/" /tmp/v$o/csrc/sm90/bwd_kernel.cuh
  grep -q "^#define FLASHATTN_EXP_Q4 $o$" /tmp/v$o/csrc/sm90/bwd_kernel.cuh || { echo "variant $o not set"; exit 1; }
  (cd /tmp/v$o && FLASHATTN_KERNELS_ONLY='sm90_bwd_bf16_hdim256,sm90_bwd_bf16_hdim256_local,sm90_fwd_bf16_hdim256,sm90_fwd_bf16_hdim256_local' MAX_JOBS=5 $PY setup.py build_ext --inplace > "/tmp/build_v$o.log" 2>&1
   echo "build v$o rc $? at ${SECONDS}s: $(grep -o 'flashattn build: compiled.*' "/tmp/build_v$o.log" | cut -c1-160)") &
done
wait
for round in 1 2; do
  for o in $VARIANTS; do
    flag=""; [ $round = 2 ] && flag=--no-check
    (cd /tmp && PYTHONPATH=/tmp/v$o timeout 100 $PY /tmp/v$o/$R/time_bwd.py v$o $flag 2>&1) | tee -a "$OUT/time.log" | grep -E "^(row|check)|Error" | grep -v " ok$" | cut -c1-240
  done
  echo "round $round done at ${SECONDS}s"
done
grep "^check" "$OUT/time.log" | grep -c " ok$" | sed "s/^/checks ok: /"
