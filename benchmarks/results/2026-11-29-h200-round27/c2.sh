#!/bin/bash
# Round 27, call 2 (one H200; repository root, OUT set): the in-kernel V transpose's variants against
# main (7fdd085), kernels-only trees in bis_trees/, each timed in one process in turn (PASS=fp8, d128,
# S 2k and 8k, causal and not, two passes). Variants (from the working tree after 63cc638, the
# macros fixed per tree): rRuU = R raw value stages (2: the output tile in the V^T stages), U units
# in flight per transposing warp; producer registers 56 (consumers 224) in all three.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
ONLY=sm90_fwd_fp8_bf16_hdim128,sm90_fwd_fp8_bf16_hdim128_local,sm90_fwd_bf16_hdim128,sm90_fwd_bf16_hdim128_local
for tree in bis_trees/*/; do
  name=$(basename "$tree")
  ( cd "$tree" && FLASHATTN_KERNELS_ONLY=$ONLY MAX_JOBS=4 python3 setup.py build_ext --inplace > "$OUT/build_$name.log" 2>&1
    echo "$name: build rc $? at ${SECONDS}s" ) &
done
wait
here=$PWD
for pass in 1 2; do
  for tree in bis_trees/*/; do
    (cd / && PYTHONPATH="$here/$tree" timeout 100 python3 "$here/scripts/bisect_fwd.py" "$(basename "$tree")" 128 fp8) >> "$OUT/bisect.jsonl" 2>> "$OUT/bisect_err.log"
  done
done
echo "timing done at ${SECONDS}s"
python3 - "$OUT/bisect.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
for r in sorted(rows, key=lambda r: (r["S"], r["causal"], r["label"])):
    print(f"{r['label']:8} S{r['S']:5} causal={r['causal']!s:5} fp8 {r['ours_tflops']:7.1f} bf16 {r['cudnn_tflops']:6.1f} ratio {r['ratio']:.3f} maxdiff {r['maxdiff']:.3g}")
PYEOF
grep -i "error\|Traceback" "$OUT/bisect_err.log" | head -5
echo "done at ${SECONDS}s"
