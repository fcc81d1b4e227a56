#!/bin/bash
# Prepared in round 22 for the next session's first GPU call (one H200; repository root, OUT set):
# main as round 22 left it (a9cd990: deterministic=True on the sm90 split backward, 59adb67, never
# through the full suite) -- the full 9.0a build, the full GPU suite, memcheck/initcheck/synccheck
# over every kernel (scripts/sanitize.py: its driver runs both backward modes at every head dim, the
# new deterministic split kernels among them), then dsmem_probe.py (the d256 pair design's gate).
# About 8-9 minutes.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s: $FLASHATTN_BUILD"; grep "flashattn build: compiled" "$OUT/build.log" | tail -1 | cut -c1-160
timeout 280 $PY -m pytest tests -m "gpu and not slow" -n 12 -q -p no:cacheprovider -ra > "$OUT/suite.log" 2>&1
echo "suite rc $? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" "$OUT/suite.log" | tail -8
timeout 120 $PY scripts/sanitize.py "$OUT/san" --tiles gpu --tools memcheck,initcheck,synccheck 2>&1 | tail -5
echo "sanitize done at ${SECONDS}s"
timeout 90 $PY benchmarks/results/2026-11-29-h200-round22/dsmem_probe.py 2>&1 | tail -8 | tee "$OUT/dsmem.txt"
echo "all done at ${SECONDS}s"
