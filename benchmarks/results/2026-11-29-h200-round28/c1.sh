#!/bin/bash
# Round 28, call 1 (one H200; repository root, OUT set): part of the softmax's exponentials by a
# polynomial on the FMA pipe (exp2_poly) instead of the special-function unit, against main
# (be75e19), kernels-only trees in bis_trees/, each timed in one process in turn, two passes:
# PASS=fp8 at d128 (the FP8 kernel, whose exponentials match the tensor cores' rate) and PASS=fwd at
# d64 (bf16 d64, the same ratio). Variants pNdD: N of every 16 exponentials by the polynomial of
# degree D (main: none).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
ONLY=sm90_fwd_fp8_bf16_hdim128,sm90_fwd_fp8_bf16_hdim128_local,sm90_fwd_bf16_hdim128,sm90_fwd_bf16_hdim128_local,sm90_fwd_bf16_hdim64,sm90_fwd_bf16_hdim64_local
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
    (cd / && PYTHONPATH="$here/$tree" timeout 100 python3 "$here/scripts/bisect_fwd.py" "$(basename "$tree")" 64 fwd) >> "$OUT/bisect.jsonl" 2>> "$OUT/bisect_err.log"
  done
  echo "pass $pass done at ${SECONDS}s"
done
python3 - "$OUT/bisect.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
for r in sorted(rows, key=lambda r: (r["pass"], r["D"], r["S"], r["causal"], r["label"])):
    print(f"{r['pass']} D{r['D']} {r['label']:6} S{r['S']:5} causal={r['causal']!s:5} ours {r['ours_tflops']:7.1f} other {r['cudnn_tflops']:6.1f} ratio {r['ratio']:.3f} maxdiff {r['maxdiff']:.3g}")
PYEOF
grep -i "error\|Traceback" "$OUT/bisect_err.log" | head -5
echo "done at ${SECONDS}s"
