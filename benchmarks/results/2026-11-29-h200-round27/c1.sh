#!/bin/bash
# Round 27, call 1 (one H200; repository root, OUT set): branch next/fp8-vt-in-kernel (63cc638) --
# the FP8 d128 kernel transposing v itself against main (7fdd085, the V^T copy kernel), both as
# kernels-only trees in bis_trees/ (scripts/bisect_fwd.sh's layout), timed in one process each in
# turn (PASS=fp8: FP8 against the same tree's bf16 forward, d128, S 2k and 8k, causal and not, two
# passes); meanwhile the full 9.0a build of the working tree (63cc638), then tests/test_fp8.py on it.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
( MAX_JOBS=10 source scripts/env.sh > "$OUT/build.log" 2>&1; echo "full build rc $? at ${SECONDS}s" ) &
full=$!
ONLY=sm90_fwd_fp8_bf16_hdim128,sm90_fwd_fp8_bf16_hdim128_local,sm90_fwd_bf16_hdim128,sm90_fwd_bf16_hdim128_local
for tree in bis_trees/*/; do
  name=$(basename "$tree")
  ( cd "$tree" && FLASHATTN_KERNELS_ONLY=$ONLY MAX_JOBS=4 python3 setup.py build_ext --inplace > "$OUT/build_$name.log" 2>&1
    echo "$name: build rc $? at ${SECONDS}s" ) &
done
wait $full
wait
PY=$(command -v python3)
here=$PWD
for pass in 1 2; do
  for tree in bis_trees/*/; do
    (cd / && PYTHONPATH="$here/$tree" timeout 120 python3 "$here/scripts/bisect_fwd.py" "$(basename "$tree")" 128 fp8) >> "$OUT/bisect.jsonl" 2> "$OUT/bisect_err_$pass.log"
  done
done
echo "timing done at ${SECONDS}s"
python3 - "$OUT/bisect.jsonl" <<'PYEOF'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"{r['label']:8} S{r['S']:5} causal={r['causal']!s:5} fp8 {r['ours_tflops']:7.1f} bf16 {r['cudnn_tflops']:6.1f} ratio {r['ratio']:.3f} maxdiff {r['maxdiff']:.3g}")
PYEOF
tail -3 "$OUT/bisect_err_1.log"
timeout 150 python3 -m pytest tests/test_fp8.py -m gpu -n 12 -q -p no:cacheprovider -ra > "$OUT/tests.log" 2>&1
echo "tests rc $? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR|Timeout" "$OUT/tests.log" | tail -12
echo "done at ${SECONDS}s"
