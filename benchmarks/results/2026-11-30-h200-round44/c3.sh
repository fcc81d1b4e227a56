#!/bin/bash
# Round 44, call 3: probe44b.py on a kernels-only bf16 d256 build of 7ab480f (round 36: the reds path in
# the default mode, the two kernels in the deterministic one), extracted into old36/ by git archive.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1 MAX_JOBS=16
SECONDS=0
PY=$(command -v python3)
ONLY='sm90_fwd_bf16_hdim256,sm90_fwd_bf16_hdim256_local,sm90_bwd_bf16_hdim256,sm90_bwd_bf16_hdim256_local,sm90_bwd_bf16_hdim256_det,sm90_bwd_bf16_hdim256_local_det'
cd old36
FLASHATTN_KERNELS_ONLY=$ONLY $PY setup.py build_ext --inplace > /tmp/build.log 2>&1; echo "build rc $? at ${SECONDS}s"
PYTHONPATH=$PWD timeout -k 5 150 $PY ../benchmarks/results/2026-11-30-h200-round44/probe44b.py > "$OUT/probe.log" 2>&1
echo "probe rc $? at ${SECONDS}s"
grep -v Warn "$OUT/probe.log" | grep -v WINDOW | tail -30
echo "done at ${SECONDS}s"
