#!/bin/bash
# Round 22, call 3 (one H200; repository root, OUT set, build/ab02 carried): FP8 d128 key tiles --
# kernels-only trees of bcf48eb (main's configs: 192 keys, two consumer warpgroups), 3e302a2 (three
# warpgroups, 96-key tiles, 3 stages), f70f028 (the same, 4 stages) and e43d077 (224-key tiles, two
# warpgroups), each the FP8 and bf16 d128 forwards, timed in turn (PASS=fp8), twice; the SM clock and
# power sampled beside them.
set -uo pipefail
SECONDS=0
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 250 \
  > "$OUT/clocks.csv" 2>&1 &
smi=$!
JOBS=16 PASS=fp8 DIMS=128 \
  ONLY=sm90_fwd_fp8_bf16_hdim128,sm90_fwd_fp8_bf16_hdim128_local,sm90_fwd_bf16_hdim128,sm90_fwd_bf16_hdim128_local \
  bash scripts/bisect_fwd.sh build/ab02
kill $smi
echo "done at ${SECONDS}s"
grep -h "rc [^0]" "$OUT"/build_*.log; grep -h "spill\|error" "$OUT"/build_*.log | grep -v " 0 bytes spill" | head
python3 - "$OUT/bisect.jsonl" "$OUT/clocks.csv" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
for r in rows:
    print(f"{r['label']:8} S{r['S']:5} causal={r['causal']!s:5} fp8 {r['ours_tflops']:6.0f} bf16 {r['cudnn_tflops']:6.0f} "
          f"ratio {r['ratio']:.3f} diff {r['maxdiff']:.3g}")
samples = [l.split(", ") for l in open(sys.argv[2]) if l.count(",") == 3]
clk = sorted(int(s[1].split()[0]) for s in samples if s[1].split()[0].isdigit())
pw = sorted(float(s[2].split()[0]) for s in samples if s[2].split()[0].replace(".", "").isdigit())
if clk:
    print(f"SM clock MHz: min {clk[0]} p10 {clk[len(clk)//10]} median {clk[len(clk)//2]} max {clk[-1]}; "
          f"power W: median {pw[len(pw)//2]:.0f} p90 {pw[9*len(pw)//10]:.0f} max {pw[-1]:.0f}")
PY
