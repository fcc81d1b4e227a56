#!/bin/bash
# Round 25, call 2 (one H200; repository root, OUT set; carry build/ab25f): what FP8 d128's row sums and
# its V^T copy cost, measured by taking them away (diagnostics: the variants' out and LSE are wrong by
# design; branch exp/fp8-diag, FLASHATTN_DIAG_FP8 in common/softmax.cuh). Trees, set up here first:
#   rm -rf build/ab25f && for t in a5d1f25:base 1e6bcc4:f1nosum 212b7ab:f2nocopy; do
#     mkdir -p build/ab25f/${t#*:}; git archive ${t%:*} csrc flashattn setup.py pyproject.toml | tar -x -C build/ab25f/${t#*:}; done
#   base      main
#   f1nosum   FP8's row-sum FADDs gone (the upper bound of summing the rows on the tensor cores)
#   f2nocopy  f1 and no V^T copy kernel (the upper bound of transposing V inside the kernel)
# Each tree's FP8 and bf16 d128 forwards built alone, timed in one process, twice (scripts/bisect_fwd.sh).
set -uo pipefail
export PYTHONUNBUFFERED=1
SECONDS=0
PASS=fp8 JOBS=5 ONLY=sm90_fwd_fp8_bf16_hdim128,sm90_fwd_fp8_bf16_hdim128_local,sm90_fwd_bf16_hdim128,sm90_fwd_bf16_hdim128_local \
  bash scripts/bisect_fwd.sh build/ab25f
echo "done at ${SECONDS}s"
python3 - "$OUT/bisect.jsonl" <<'PY'
import json, sys, collections
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
best = collections.defaultdict(dict)
for r in rows:
    key = (r["S"], r["causal"])
    best[key][r["label"]] = max(best[key].get(r["label"], 0), r["ours_tflops"])
for key, v in sorted(best.items()):
    base = v.get("base", 1)
    print(key, " ".join(f"{k} {t} ({t / base:.3f})" for k, t in sorted(v.items())))
PY
