#!/bin/bash
# Round 13, third call (two H200s, MAX_JOBS=24): the tree with the 4-lane gather as the default and the
# probabilities' rounding floor in the tests: the full build; the GPU tests of the paged forward,
# the family checks and the property tests; the paged benchmark (auto, gather8).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
MAX_JOBS=${MAX_JOBS:-16} source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s"
$PY -m pytest tests/test_paged_varlen.py tests/test_family.py tests/test_property.py tests/test_numerics.py -m gpu \
    -n 12 -q -p no:cacheprovider -ra > "$OUT/tests.log" 2>&1
echo "tests rc $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/tests.log" | tail -8
echo "tests done at ${SECONDS}s"
$PY -m benchmarks paged --copy-modes auto,gather8 --out "$OUT/paged" 2>&1 | grep "page\|worst"
echo "x3 done at ${SECONDS}s"
