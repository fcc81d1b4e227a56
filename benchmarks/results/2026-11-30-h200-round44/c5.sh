#!/bin/bash
# Round 44, call 5: compute-sanitizer (memcheck, racecheck, synccheck) over round 36's sanitize_det256.py
# (the d256 backward: d256 and d200, more steps than stages, GQA, causal, window + softcap, a cut packed
# batch) on a kernels-only build of main's d256 bf16 instantiations (the kernels are round 42's).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1 MAX_JOBS=16
SECONDS=0
PY=$(command -v python3)
rm -f flashattn/_C*.so
FLASHATTN_KERNELS_ONLY='sm90_fwd_bf16_hdim256*,sm90_bwd_bf16_hdim256*' $PY setup.py build_ext --inplace > /tmp/build.log 2>&1
echo "build rc $? at ${SECONDS}s"
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
DRV=benchmarks/results/2026-11-30-h200-round36/sanitize_det256.py
for tool in memcheck racecheck synccheck; do
  [ $SECONDS -gt 420 ] && { echo "skip $tool"; continue; }
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=$PWD timeout -k 5 $((470 - SECONDS)) $CS --tool $tool $PY $DRV > "$OUT/$tool.log" 2>&1
  echo "$tool rc $? at ${SECONDS}s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|calls completed' "$OUT/$tool.log" | tr '\n' ' ')"
done
