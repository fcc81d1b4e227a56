#!/bin/bash
# Round 31, call 1 (one H200; repository root, OUT set; carries .fa4/a): FlashAttention-4's first
# wheel part into /tmp/fa4 (scripts/stage_fa4.sh part1); main's full 9.0a build (forced) and the full
# GPU suite (round 30's last kernel edit, c8fab44, had not run as one binary). (.fa4/a holds the first
# cu13 part and the small wheels but the three nvidia_cutlass_dsl ones, which travel in .fa4/b: each
# call within the 64 MB a call carries.)
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
bash scripts/stage_fa4.sh part1 && echo "fa4 part1 staged"
rm -f flashattn/_C*.so
FLASHATTN_FORCE_BUILD=1 MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s: $FLASHATTN_BUILD"; echo "$FLASHATTN_BUILD_SUMMARY" | cut -c1-300
timeout 330 $PY -m pytest tests -m "gpu and not slow" -n 12 -q -p no:cacheprovider -ra > "$OUT/suite.log" 2>&1
echo "suite rc $? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" "$OUT/suite.log" | tail -12 | cut -c1-300
grep -E "fp8_q_is_its_dequantised" "$OUT/suite.log" | head -3
