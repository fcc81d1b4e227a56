#!/bin/bash
# Round 16, call 2 (one H200; from the repository root, OUT set): a kernels-only build of the bf16
# d64/d256 forwards; the per-tile cost (tile_cost.py); ncu source-level warp-state sampling of one
# d256 S 2048 causal call and one d64 S 2048 causal call (fwd_one.py).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R=benchmarks/results/2026-11-28-h200-round16
FLASHATTN_KERNELS_ONLY="${KONLY}" MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 \
  || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s"; grep "flashattn build:" "$OUT/build.log" | tail -2
$PY $R/tile_cost.py 2>&1 | tee "$OUT/tile_cost.log"
echo "tile cost done at ${SECONDS}s"
for spec in "256 2048 1" "64 2048 1" ; do
  set -- $spec; tag=d$1-s$2-c$3
  ncu --kernel-name regex:fwd_kernel --launch-skip 1 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section SourceCounters --section SchedulerStats \
      -o "$OUT/$tag" -f $PY $R/fwd_one.py $1 $2 $3 > "$OUT/ncu-$tag.log" 2>&1
  echo "ncu $tag rc $? at ${SECONDS}s"; tail -2 "$OUT/ncu-$tag.log"
  ncu --import "$OUT/$tag.ncu-rep" --page details > "$OUT/details-$tag.txt" 2>&1
  ncu --import "$OUT/$tag.ncu-rep" --page source --csv --print-source sass > "$OUT/source-$tag.csv" 2>&1
  rm -f "$OUT/$tag.ncu-rep"
done
ls -la "$OUT"; echo "done at ${SECONDS}s"
