#!/bin/bash
# Round 30, call 6 (one H200, warm after call 5: its full build in place; repository root, OUT set):
# python -m benchmarks decode-fp8 (every row) and python -m benchmarks decode --quick (the 16-bit
# decoding kernel, whose code the FP8 variant shares).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
MAX_JOBS=16 source scripts/env.sh > "$OUT/env.log" 2>&1 || { tail -30 "$OUT/env.log"; exit 1; }
echo "env at ${SECONDS}s: $FLASHATTN_BUILD"
timeout 330 $PY -m benchmarks decode-fp8 --out "$OUT/decode_fp8" > "$OUT/decode_fp8.log" 2>&1
echo "decode-fp8 rc $? at ${SECONDS}s"; grep -E "^\| [0-9]|FP8 cache over" "$OUT/decode_fp8.log" | cut -c1-200
timeout 200 $PY -m benchmarks decode --quick --out "$OUT/decode" > "$OUT/decode.log" 2>&1
echo "decode rc $? at ${SECONDS}s"; grep -E "^\| [0-9]|Target" "$OUT/decode.log" | cut -c1-200
