#!/bin/bash
# Round 30, call 1 (one H200; repository root, OUT set): the FP8 KV-cache kernel's first GPU run --
# a kernels-only build of every sm80 KV-cache instantiation (16-bit and FP8: decode_kernel.cuh
# changed for both), then the KV-cache tests (16-bit and FP8), memcheck and initcheck over the
# driver's KV-cache calls, and the decode-fp8 benchmark (quick).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
PY=python3
FLASHATTN_KERNELS_ONLY='sm80_fwd_kvcache*' MAX_JOBS=16 $PY setup.py build_ext --inplace > "$OUT/build.log" 2>&1
echo "build rc $? at ${SECONDS}s"; grep -E "error|FLASHATTN_KERNELS_ONLY" "$OUT/build.log" | head -20
timeout 300 $PY -m pytest tests/test_fp8_kvcache.py tests/test_kvcache.py tests/test_kvcache_faults.py \
  "tests/test_fp8.py" -k "kvcache or KVCACHE" -q -n 12 -p no:cacheprovider -ra > "$OUT/tests.log" 2>&1
echo "tests rc $? at ${SECONDS}s"; tail -25 "$OUT/tests.log" | cut -c1-400
timeout 100 $PY -m pytest tests/test_ops.py -k "schema" -q -p no:cacheprovider > "$OUT/ops.log" 2>&1
echo "ops rc $? at ${SECONDS}s"; tail -3 "$OUT/ops.log"
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck initcheck; do
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 200 $SAN --tool $tool $PY scripts/sanitize_driver.py --kvcache-only \
    > "$OUT/sanitize_$tool.log" 2>&1
  echo "$tool rc $? at ${SECONDS}s"; grep -E "ERROR SUMMARY|sanitize driver" "$OUT/sanitize_$tool.log" | head -3
done
timeout 200 $PY -m benchmarks decode-fp8 --quick --out "$OUT/decode_fp8" > "$OUT/bench.log" 2>&1
echo "bench rc $? at ${SECONDS}s"; tail -32 "$OUT/bench.log" | cut -c1-250
