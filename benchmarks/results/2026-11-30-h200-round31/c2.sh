#!/bin/bash
# Round 31, call 2 (the same warm H200 right after call 1; carries .fa4/b): FlashAttention-4 joined
# and installed (scripts/stage_fa4.sh part2); `python -m benchmarks paged` on main (d128 and d64, copy
# modes auto and tma) with FlashAttention-4's own paged and contiguous calls in the same rounds; then
# a kernels-only build of bis_trees/stages4 (main with four K and V stages at d64, 16-bit: the d64
# causal forward and sm80's d64 extras kernel for the benchmark's ALiBi column) and the same
# benchmark at d64 from it, its own process.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
PY=$(command -v python3)
FA4=$(PY=$PY bash scripts/stage_fa4.sh part2) && export FLASHATTN_FA4_DIR=$FA4 && echo "fa4 at $FA4"
timeout 330 $PY -m benchmarks paged --out "$OUT/paged" --copy-modes auto,tma > "$OUT/paged.log" 2>&1
echo "paged rc $? at ${SECONDS}s"; grep -E "^\| (128|64) " "$OUT/paged/results.md" | cut -d'|' -f2-5,9,14 | head -40
grep -iE "FlashAttention-4|error" "$OUT/paged.log" | head -5
(cd bis_trees/stages4 && FLASHATTN_KERNELS_ONLY="sm90_fwd_bf16_hdim64_local,sm80_fwd_bf16_hdim64_local_extras" \
   MAX_JOBS=16 $PY setup.py build_ext --inplace > "$OUT/stages4-build.log" 2>&1)
echo "stages4 build rc $? at ${SECONDS}s"; grep -iE "spill|error" "$OUT/stages4-build.log" | grep -v " 0 bytes spill" | head -5
(cd bis_trees/stages4 && PYTHONPATH=$PWD timeout 150 $PY -m benchmarks paged --out "$OUT/paged-stages4" \
   --head-dims 64 --copy-modes auto,tma > "$OUT/paged-stages4.log" 2>&1)
echo "stages4 paged rc $? at ${SECONDS}s"; grep -E "^\| 64 " "$OUT/paged-stages4/results.md" | cut -d'|' -f2-9 | head -20
tail -3 "$OUT/paged-stages4.log"
