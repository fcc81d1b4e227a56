#!/bin/bash
# Round 32, call 4 (a fresh H200; carries bis_trees/c192): FP8 d128 key tiles of 192 under a mask too
# (branch exp/fp8-causal-192, b434e0f) against main (0c9df73): scripts/bisect_fwd.sh PASS=fp8 (each
# tree's FP8 d128 call against its bf16 call, S 2k/8k, causal and not, twice); then in the 192 tree
# the GPU FP8 kernel tests but d192/d256 (kernels-only: every FP8 kernel and the bf16 d128 forward)
# and memcheck over the sanitizer driver's FP8 calls.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
PY=$(command -v python3)
ONLY='sm90_fwd_fp8_*,sm90_fwd_bf16_hdim128,sm90_fwd_bf16_hdim128_local' PASS=fp8 JOBS=8 \
  OUT="$OUT" timeout 420 bash scripts/bisect_fwd.sh bis_trees/c192
echo "bisect rc $? at ${SECONDS}s"; cat "$OUT"/bisect.jsonl | cut -c1-200
grep -iE "spill|C75|error" "$OUT"/build_*.log | grep -v " 0 bytes spill" | head -8
tree=bis_trees/c192/b434e0f
cp -r tests "$tree/"
(cd "$tree" && timeout 200 $PY -m pytest tests/test_fp8.py -m gpu -k "kernel and not d192 and not d256" -q \
   -p no:cacheprovider -x -n 8 > "$OUT/tests192.log" 2>&1); echo "tests rc $? at ${SECONDS}s"
tail -4 "$OUT/tests192.log" | cut -c1-300
(cd "$tree" && PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 240 compute-sanitizer --tool memcheck $PY \
   ../../../benchmarks/results/2026-11-30-h200-round32/c4_sanitize_fp8.py "$PWD/../../../scripts" \
   > "$OUT/memcheck192.log" 2>&1); echo "memcheck rc $? at ${SECONDS}s"; tail -4 "$OUT/memcheck192.log"
