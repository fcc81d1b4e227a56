#!/bin/bash
# Round 36, call 2 (one H200): where the deterministic d256 backward's time goes, and three ways of issuing
# the dQ kernel's GEMMs. Trees in /tmp: v0 = main (de3bb2f); v1, v2 = bwd_dq_kernel_exp.cuh (kept as
# dq_issue_orders.patch against de3bb2f's csrc/sm90/bwd_dq_kernel.cuh) with
# FLASHATTN_EXP_DQ 1 (dQ of the last step issued with the next S and dP) and 2 (those turns in ping-pong
# between the warpgroups). Kernels-only builds of the d256 bf16 instantiations, in parallel. v0:
# kernels.py (flashattn default and deterministic, FA3, cuDNN); v1, v2: c1_det256.py (bf16) and kernels.py
# of the deterministic mode.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R=benchmarks/results/2026-11-30-h200-round36
PY=$(command -v python3)
mkdir -p /tmp/fa3 && cp .fa3/lib/libfa3.so /tmp/fa3/ && export FLASHATTN_FA3_LIB=/tmp/fa3/libfa3.so
K='sm90_fwd_bf16_hdim256,sm90_fwd_bf16_hdim256_local,sm90_bwd_bf16_hdim256,sm90_bwd_bf16_hdim256_local,sm90_bwd_bf16_hdim256_det,sm90_bwd_bf16_hdim256_local_det'
for v in 0 1 2; do
  rm -rf /tmp/v$v && mkdir -p /tmp/v$v && cp -r csrc flashattn setup.py /tmp/v$v/ && rm -f /tmp/v$v/flashattn/_C*.so
  if [ $v -gt 0 ]; then sed "s/^#define FLASHATTN_EXP_DQ 0$/#define FLASHATTN_EXP_DQ $v/" $R/bwd_dq_kernel_exp.cuh > /tmp/v$v/csrc/sm90/bwd_dq_kernel.cuh; fi
  (cd /tmp/v$v && FLASHATTN_KERNELS_ONLY="$K" MAX_JOBS=5 $PY setup.py build_ext --inplace > /tmp/build$v.log 2>&1; echo "build v$v rc $? at ${SECONDS}s") &
done
wait
grep -c "FLASHATTN_EXP_DQ 2" /tmp/v2/csrc/sm90/bwd_dq_kernel.cuh
for v in 1 2; do
  (cd /tmp && PYTHONPATH=/tmp/v$v:$OLDPWD timeout 60 $PY $OLDPWD/$R/c1_det256.py --bf16-only > "$OUT/det256_v$v.log" 2>&1; echo "v$v det256 rc $?: $(tail -1 "$OUT/det256_v$v.log")")
done
(cd /tmp && PYTHONPATH=/tmp/v0:$OLDPWD timeout 200 $PY $OLDPWD/$R/kernels.py --hdims=256 2>&1 | grep -v Warn | tee "$OUT/kernels_v0.log" | cut -c1-110)
for v in 1 2; do
  (cd /tmp && PYTHONPATH=/tmp/v$v:$OLDPWD timeout 100 $PY $OLDPWD/$R/kernels.py --hdims=256 --only=flashattn_det 2>&1 | grep -v Warn | tee "$OUT/kernels_v$v.log" | cut -c1-110)
done
echo "done at ${SECONDS}s"
