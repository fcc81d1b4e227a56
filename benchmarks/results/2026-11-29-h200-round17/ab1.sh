#!/bin/bash
# Round 17, calls 1-2 (one H200; repository root, OUT set): the trees in .ab/ (scripts/bisect_fwd.sh), the
# sm90 bf16 forward; call 1: main, next/idle-warpgroups at d64, d128; call 2: + next/own-key-tiles at d64, d192, d256.
set -uo pipefail
SECONDS=0
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
ONLY='sm90_fwd_bf16_hdim64*,sm90_fwd_bf16_hdim192,sm90_fwd_bf16_hdim192_local,sm90_fwd_bf16_hdim256,sm90_fwd_bf16_hdim256_local' DIMS=${DIMS:-64,192,256} JOBS=5 OUT=$OUT bash scripts/bisect_fwd.sh .ab
grep -h "error\|flashattn build:" "$OUT"/build_*.log | tail -6
python3 - "$OUT/bisect.jsonl" <<'PY'
import json, sys, collections
rows = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    r = json.loads(line); key = (r["D"], r["S"], r["causal"])
    best = rows[key].get(r["label"])
    if best is None or r["ours_tflops"] > best["ours_tflops"]: rows[key][r["label"]] = r
for key, by in sorted(rows.items()):
    print(key, "  ".join(f'{l}: {r["ours_tflops"]} ({r["ratio"]} cuDNN {r["cudnn_tflops"]}, diff {r["maxdiff"]:.3g})' for l, r in sorted(by.items())))
PY
echo "done at ${SECONDS}s"
