#!/bin/bash
# Round 30, call 8 (one H200; repository root, OUT set): the final decode_kernel.cuh (its 16-bit path
# back to 60a5bf6's code, SASS identical, after call 7 found paged 16-bit decoding 2% slower; the
# FP8 path's pointers in byte pairs by a shift) -- a kernels-only build of the sm80 KV-cache
# instantiations, the KV-cache tests (16-bit and FP8), decode-fp8 --quick.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
SECONDS=0
PY=python3
rm -f flashattn/_C*.so
FLASHATTN_KERNELS_ONLY='sm80_fwd_kvcache*' MAX_JOBS=16 $PY setup.py build_ext --inplace > "$OUT/build.log" 2>&1
echo "build rc $? at ${SECONDS}s"
timeout 150 $PY -m pytest tests/test_fp8_kvcache.py tests/test_kvcache.py tests/test_kvcache_faults.py \
  "tests/test_fp8.py" -k "kvcache or KVCACHE" -q -n 14 -p no:cacheprovider -ra > "$OUT/tests.log" 2>&1
echo "tests rc $? at ${SECONDS}s"; grep -E "passed|failed|FAILED|Error" "$OUT/tests.log" | tail -8 | cut -c1-300
timeout 60 $PY -m benchmarks decode-fp8 --quick --out "$OUT/decode_fp8" > "$OUT/bench.log" 2>&1
echo "bench rc $? at ${SECONDS}s"; grep -E "^\| [0-9]|FP8 cache over" "$OUT/bench.log" | cut -c1-200
