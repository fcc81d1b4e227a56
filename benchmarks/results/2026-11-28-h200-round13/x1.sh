#!/bin/bash
# Round 13, first call (one H200; run from the repository root, OUT set): FlashAttention-4's wheels,
# part 1, into /tmp; the full 9.0a build; the paged benchmark with every copy mode; memcheck over the
# 4- and 2-lane gathers; the full GPU suite.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
mkdir -p /tmp/fa4 && cp .fa4/a/* /tmp/fa4/
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s"; grep "flashattn build:" "$OUT/build.log" | tail -2
$PY -m benchmarks paged --copy-modes tma,gather,gather4,gather2 --out "$OUT/paged" 2>&1 | grep "page\|worst"
echo "paged done at ${SECONDS}s"
compute-sanitizer --tool memcheck $PY -m pytest tests/test_paged_varlen.py -q -p no:cacheprovider \
    -k "copy_modes and (gather2 or gather4) and (128 or 64)" > "$OUT/san_memcheck.log" 2>&1
echo "memcheck rc $?: $(grep -E 'ERROR SUMMARY|passed|failed' "$OUT/san_memcheck.log" | tr '\n' ' ')"
echo "sanitizer done at ${SECONDS}s"
$PY -m pytest tests -m "gpu and not slow" -n 12 -q -p no:cacheprovider -ra > "$OUT/suite.log" 2>&1
echo "suite rc $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/suite.log" | tail -15
echo "x1 done at ${SECONDS}s"
