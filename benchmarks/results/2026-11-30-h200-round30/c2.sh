#!/bin/bash
# Round 30, call 2 (one H200; repository root, OUT set): after call 1 -- FP8 caches always decode on
# Dense blocks split to fill the SMs (kvcache.cu: plan_splits), the stride message names 16 elements
# for e4m3. Kernels-only build of the sm80 KV-cache instantiations; the KV-cache tests (16-bit and
# FP8; PYTHONPATH so that the tests' subprocesses import this tree); memcheck and initcheck over
# the driver's KV-cache calls; decode-fp8 (quick).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
SECONDS=0
PY=python3
FLASHATTN_KERNELS_ONLY='sm80_fwd_kvcache*' MAX_JOBS=16 $PY setup.py build_ext --inplace > "$OUT/build.log" 2>&1
echo "build rc $? at ${SECONDS}s"; grep -E "error|FLASHATTN_KERNELS_ONLY" "$OUT/build.log" | head -20
timeout 300 $PY -m pytest tests/test_fp8_kvcache.py tests/test_kvcache.py tests/test_kvcache_faults.py \
  "tests/test_fp8.py" -k "kvcache or KVCACHE" -q -n 12 -p no:cacheprovider -ra > "$OUT/tests.log" 2>&1
echo "tests rc $? at ${SECONDS}s"; tail -8 "$OUT/tests.log" | cut -c1-400
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck initcheck; do
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 200 $SAN --tool $tool $PY scripts/sanitize_driver.py --kvcache-only \
    > "$OUT/sanitize_$tool.log" 2>&1
  echo "$tool rc $? at ${SECONDS}s"; grep -E "ERROR SUMMARY|sanitize driver|Error" "$OUT/sanitize_$tool.log" | head -5
done
timeout 200 $PY -m benchmarks decode-fp8 --quick --out "$OUT/decode_fp8" > "$OUT/bench.log" 2>&1
echo "bench rc $? at ${SECONDS}s"; tail -30 "$OUT/bench.log" | cut -c1-250
