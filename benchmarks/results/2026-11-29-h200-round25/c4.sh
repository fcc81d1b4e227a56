#!/bin/bash
# Round 25, call 4 (one H200; repository root, OUT set; carry build/ab25): the d128 backward without
# the LSE and D loads of its scores and dS (20 LDS.64 a warp a step; diagnostic: P and dS wrong), against
# main and v4tenth (call 1). Trees:
#   rm -rf build/ab25 && for t in a5d1f25:base 2671d6b:v4tenth 3c801a5:v6nostats; do
#     mkdir -p build/ab25/${t#*:}; git archive ${t%:*} csrc flashattn setup.py pyproject.toml | tar -x -C build/ab25/${t#*:}; done
set -uo pipefail
export PYTHONUNBUFFERED=1
SECONDS=0
PASS=bwd JOBS=5 ONLY=sm90_fwd_bf16_hdim128,sm90_fwd_bf16_hdim128_local,sm90_bwd_bf16_hdim128,sm90_bwd_bf16_hdim128_local \
  bash scripts/bisect_fwd.sh build/ab25
echo "done at ${SECONDS}s"
python3 benchmarks/results/2026-11-29-h200-round25/best.py "$OUT/bisect.jsonl"
