#!/bin/bash
# Round 29, call 2 (one H200; repository root, OUT set): FP8 forward variants against main, kernels-only
# trees in bis_trees/ (the FP8 and bf16 d128/d256 forwards), each timed in one process in turn, two
# passes, scripts/bisect_fwd.py PASS=fp8 at d128 and d256. Variants (csrc/sm90/fwd_kernel.cuh's two
# switches): main (both off: SASS identical to 7ae4571's), pin (every FP8 step's exponentials before
# the wait for O += P V), split (unmasked FP8 steps with S = Q K^T in two halves, each folded in turn,
# the offsets kept by a vote without shuffles), splitpin (both).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
ONLY=sm90_fwd_fp8_bf16_hdim128,sm90_fwd_fp8_bf16_hdim128_local,sm90_fwd_fp8_bf16_hdim256,sm90_fwd_fp8_bf16_hdim256_local,sm90_fwd_bf16_hdim128,sm90_fwd_bf16_hdim128_local,sm90_fwd_bf16_hdim256,sm90_fwd_bf16_hdim256_local
for tree in bis_trees/*/; do
  name=$(basename "$tree")
  ( cd "$tree" && FLASHATTN_KERNELS_ONLY=$ONLY MAX_JOBS=4 python3 setup.py build_ext --inplace > "$OUT/build_$name.log" 2>&1
    echo "$name: build rc $? at ${SECONDS}s" ) &
done
wait
here=$PWD
for pass in 1 2; do
  for tree in bis_trees/*/; do
    (cd / && PYTHONPATH="$here/$tree" timeout 120 python3 "$here/scripts/bisect_fwd.py" "$(basename "$tree")" 128,256 fp8) >> "$OUT/bisect.jsonl" 2>> "$OUT/bisect_err.log"
  done
  echo "pass $pass done at ${SECONDS}s"
done
python3 - "$OUT/bisect.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
for r in sorted(rows, key=lambda r: (r["D"], r["S"], r["causal"], r["label"], r["pass"])):
    print(f"D{r['D']} S{r['S']:5} causal={r['causal']!s:5} {r['label']:8} ours {r['ours_tflops']:7.1f} bf16 {r['cudnn_tflops']:6.1f} ratio {r['ratio']:.3f} maxdiff {r['maxdiff']:.3g}")
PYEOF
grep -i "error\|Traceback" "$OUT/bisect_err.log" | head -5
echo "done at ${SECONDS}s"
