#!/bin/bash
# Round 26, call 1 (one H200; repository root, OUT set): branch next/paged-runs -- the full 9.0a
# build; the paged benchmark with the new gather (auto: runs of 4 rows at pages of 16) against the
# row gather (gather-rows, main's) in one process; the GPU tests of the paged varlen forward, the
# family checks and the repeatability tests (the CUDA cyclic-garbage test's first run); memcheck
# over every kernel on this GPU's tiles.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s: $FLASHATTN_BUILD"; grep "flashattn build: compiled" "$OUT/build.log" | tail -1 | cut -c1-200
timeout 170 $PY -m benchmarks paged --out "$OUT/paged" --copy-modes auto,gather-rows > "$OUT/paged.log" 2>&1
echo "paged rc $? at ${SECONDS}s"; grep -E "^\| (128|64) " "$OUT/paged/results.md" | cut -d'|' -f2-5,9 | head -40
timeout 150 $PY -m pytest tests/test_paged_varlen.py tests/test_family.py tests/test_repeatability.py -m gpu -n 12 -q \
    -p no:cacheprovider -ra > "$OUT/tests.log" 2>&1
echo "tests rc $? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" "$OUT/tests.log" | tail -8
left=$((560 - SECONDS))
if [ $left -gt 60 ]; then
  timeout $left $PY scripts/sanitize.py "$OUT/san" --tiles gpu --tools memcheck 2>&1 | tail -4
fi
echo "done at ${SECONDS}s"
