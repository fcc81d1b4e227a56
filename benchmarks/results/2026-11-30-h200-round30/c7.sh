#!/bin/bash
# Round 30, call 7 (one H200; repository root, OUT set): the 16-bit decoding kernel before and after
# this round's change to decode_kernel.cuh (its cache pointers now in 16-bit units of the element's
# bytes, the merge's output scale, the FP8 branches) -- kernels-only builds of the bf16 d128 KV-cache
# instantiation in this tree and in bis_trees/base (60a5bf6), timed alternately, two passes.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
PY=python3
rm -f flashattn/_C*.so
for tree in . bis_trees/base; do
  name=$(basename "$(cd $tree && pwd)")
  ( cd $tree && FLASHATTN_KERNELS_ONLY='sm80_fwd_kvcache_bf16_hdim128' MAX_JOBS=8 $PY setup.py build_ext --inplace \
      > "$OUT/build_$name.log" 2>&1; echo "$name: build rc $? at ${SECONDS}s" ) &
done
wait
here=$PWD
AB=$here/benchmarks/results/2026-11-30-h200-round30/ab_decode16.py
for pass in 1 2; do
  for tree in . bis_trees/base; do
    name=$(basename "$(cd $tree && pwd)")
    (cd / && PYTHONPATH="$here/$tree" timeout 120 $PY $AB "$name" 2>&1 | tail -6)
  done
done
echo "done at ${SECONDS}s"
