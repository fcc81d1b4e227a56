#!/bin/bash
# Round 16, the landing call (one H200; from the repository root, OUT set): the full 9.0a build, the
# full GPU suite, the families benchmark (bf16, d64/128/192/256, S 2k/8k), then compute-sanitizer
# memcheck on forward cases that put O in the V stages (d192, d256; varlen and paged among them).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s"; grep "flashattn build:" "$OUT/build.log" | tail -2
timeout 240 $PY -m pytest tests -m "gpu and not slow" -n 12 -q -p no:cacheprovider -ra > "$OUT/suite.log" 2>&1
echo "suite rc $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/suite.log" | tail -15
echo "suite done at ${SECONDS}s"
timeout 110 $PY -m benchmarks families --head-dims 64,128,192,256 --seqlens 2048,8192 --out "$OUT/families" \
    > "$OUT/families.log" 2>&1
echo "families rc $? at ${SECONDS}s"; grep "^| " "$OUT"/families/*.md 2>/dev/null
timeout 45 compute-sanitizer --tool memcheck $PY -m pytest tests/test_forward.py tests/test_paged_varlen.py -q \
    -p no:cacheprovider -x -k "(d192 or d256 or 192 or 256) and not slow" --maxfail=1 > "$OUT/san_memcheck.log" 2>&1
echo "memcheck rc $?: $(grep -cE "^=+ (Invalid|Program hit)" "$OUT/san_memcheck.log") faults; $(grep -E "ERROR SUMMARY|passed|failed" "$OUT/san_memcheck.log" | tr "\n" " ")"
echo "x1 done at ${SECONDS}s"
