#!/bin/bash
# Round 22, call 2 (one H200; repository root, OUT set, build/ab01 carried): where the FP8 d128 forward
# lost its speed since round 15 -- kernels-only trees of 1377189 (round 15's final), a675463, 44b7c3a,
# 16be34f and 25ca602 (main), each the FP8 and bf16 d128 forwards, timed in turn (PASS=fp8), twice.
set -uo pipefail
SECONDS=0
JOBS=16 PASS=fp8 DIMS=128 \
  ONLY=sm90_fwd_fp8_bf16_hdim128,sm90_fwd_fp8_bf16_hdim128_local,sm90_fwd_bf16_hdim128,sm90_fwd_bf16_hdim128_local \
  bash scripts/bisect_fwd.sh build/ab01
echo "done at ${SECONDS}s"
python3 - "$OUT/bisect.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
for r in rows:
    print(f"{r['label']:8} S{r['S']:5} causal={r['causal']!s:5} fp8 {r['ours_tflops']:6.0f} bf16 {r['cudnn_tflops']:6.0f} "
          f"ratio {r['ratio']:.3f} diff {r['maxdiff']:.3g}")
PY
