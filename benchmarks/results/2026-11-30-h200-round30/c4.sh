#!/bin/bash
# Round 30, call 4 (one H200; repository root, OUT set): the FP8 KV-cache kernel multiplying in fp16
# (no half-precision multiply a pair; a bf16 q stored times a power of two per row; P taken 2^12
# larger) -- kernels-only builds of this tree (every sm80 KV-cache instantiation) and of bis_trees/v1
# (calls 1-2's kernel: bf16 mma, a multiply a pair); the KV-cache tests on this tree; memcheck and
# initcheck over the driver's KV-cache calls; the A/B timing of both trees, two passes.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
PY=python3
(FLASHATTN_KERNELS_ONLY='sm80_fwd_kvcache*' MAX_JOBS=12 $PY setup.py build_ext --inplace > "$OUT/build_main.log" 2>&1
 echo "main build rc $? at ${SECONDS}s") &
(cd bis_trees/v1 && FLASHATTN_KERNELS_ONLY='sm80_fwd_kvcache_fp8_bf16_hdim128' MAX_JOBS=4 $PY setup.py build_ext --inplace \
   > "$OUT/build_v1.log" 2>&1; echo "v1 build rc $? at ${SECONDS}s") &
wait
here=$PWD
export PYTHONPATH=$here
timeout 300 $PY -m pytest tests/test_fp8_kvcache.py tests/test_kvcache.py tests/test_kvcache_faults.py \
  "tests/test_fp8.py" -k "kvcache or KVCACHE" -q -n 12 -p no:cacheprovider -ra > "$OUT/tests.log" 2>&1
echo "tests rc $? at ${SECONDS}s"; grep -E "passed|failed|FAILED|Error" "$OUT/tests.log" | tail -12 | cut -c1-300
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck initcheck; do
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 200 $SAN --tool $tool $PY scripts/sanitize_driver.py --kvcache-only \
    > "$OUT/sanitize_$tool.log" 2>&1
  echo "$tool rc $? at ${SECONDS}s"; grep -E "ERROR SUMMARY|sanitize driver|Error" "$OUT/sanitize_$tool.log" | head -5
done
AB=$here/benchmarks/results/2026-11-30-h200-round30/ab_decode_fp8.py
for pass in 1 2; do
  for tree in . bis_trees/v1; do
    name=$(basename "$(cd $tree && pwd)")
    (cd / && PYTHONPATH="$here/$tree" timeout 120 $PY $AB "$name" 2>&1 | tail -6)
  done
done
