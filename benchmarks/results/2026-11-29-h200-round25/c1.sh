#!/bin/bash
# Round 25, call 1 (one H200; repository root, OUT set; carry build/ab25): what the d128 backward's dQ
# staging costs, measured by taking parts away (diagnostics: the variants' dQ is wrong by design; branch
# exp/dq-diag, FLASHATTN_DIAG_DQ in bwd_kernel.cuh). Trees, set up here first:
#   rm -rf build/ab25 && for t in a5d1f25:base 1101ba2:v1vec 43e671b:v2bulk 3e0c23a:v3nobar 2671d6b:v4tenth; do
#     mkdir -p build/ab25/${t#*:}; git archive ${t%:*} csrc flashattn setup.py pyproject.toml | tar -x -C build/ab25/${t#*:}; done
#   base     main: 40 STS.32 a thread a step into the reduce boxes' swizzled rows, bar.sync, 2 tiled reduces
#   v1vec    10 STS.128 a thread in register order (wrong places), the same tiled reduces
#   v2bulk   v1 + one 1-D bulk reduce of the warpgroup's 20 KB (FlashAttention-3's form) instead of the tiled ones
#   v3nobar  v2 without the warpgroup's bar.sync before the reduce (races: timing only)
#   v4tenth  one STS.128 a thread of the ten, the tiled reduces: the staging's stores nearly gone
# Each tree's d128 kernels built alone, timed against cuDNN in one process, twice (scripts/bisect_fwd.sh).
set -uo pipefail
export PYTHONUNBUFFERED=1
SECONDS=0
PASS=bwd JOBS=3 ONLY=sm90_fwd_bf16_hdim128,sm90_fwd_bf16_hdim128_local,sm90_bwd_bf16_hdim128,sm90_bwd_bf16_hdim128_local \
  bash scripts/bisect_fwd.sh build/ab25
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
