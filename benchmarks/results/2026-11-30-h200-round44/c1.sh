#!/bin/bash
# Round 44, calls 1-2: probe44.py on a kernels-only bf16 d256 build of exp/energy-probe (main e8ef313 with
# energy_probe.patch applied: git apply benchmarks/results/2026-11-30-h200-round44/energy_probe.patch).
# (Call 1 lost its 400 s: the probe's first check raised, and its output sat in a pipe that nvidia-smi
# held open.)
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1 MAX_JOBS=16
SECONDS=0
PY=$(command -v python3)
ONLY='sm90_fwd_bf16_hdim256,sm90_fwd_bf16_hdim256_local,sm90_bwd_bf16_hdim256,sm90_bwd_bf16_hdim256_local'
ls flashattn/_C*.so > /dev/null 2>&1 || { FLASHATTN_KERNELS_ONLY=$ONLY $PY setup.py build_ext --inplace > /tmp/build.log 2>&1; echo "build rc $? at ${SECONDS}s"; }
PYTHONPATH=$PWD timeout -k 5 150 $PY benchmarks/results/2026-11-30-h200-round44/probe44.py > "$OUT/probe.log" 2>&1
echo "probe rc $? at ${SECONDS}s"
grep -v Warn "$OUT/probe.log" | grep -v WINDOW
echo "done at ${SECONDS}s"
