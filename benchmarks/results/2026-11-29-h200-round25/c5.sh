#!/bin/bash
# Round 25, call 5 (one H200; repository root = branch next/dq-writer at 96ef7e4, OUT set; carry build/ab25):
# (1) A/B of the d128 backward, main (a5d1f25) against the dQ writer warps (96ef7e4), kernels-only builds,
#     timed against cuDNN in one process, two passes (scripts/bisect_fwd.sh). Trees, set up here first:
#   rm -rf build/ab25 && for t in a5d1f25:base 96ef7e4:writer; do
#     mkdir -p build/ab25/${t#*:}; git archive ${t%:*} csrc flashattn setup.py pyproject.toml | tar -x -C build/ab25/${t#*:}; done
# (2) the branch's full 9.0a build and the full GPU suite; (3) memcheck over every kernel and racecheck on the
#     d128 backward (plain, causal, window, softcap, fp16, GQA, varlen with head dim 112).
set -uo pipefail
export PYTHONUNBUFFERED=1
SECONDS=0
PASS=bwd JOBS=8 ONLY=sm90_fwd_bf16_hdim128,sm90_fwd_bf16_hdim128_local,sm90_bwd_bf16_hdim128,sm90_bwd_bf16_hdim128_local \
  bash scripts/bisect_fwd.sh build/ab25 > "$OUT/ab.log" 2>&1
echo "A/B done at ${SECONDS}s"
python3 benchmarks/results/2026-11-29-h200-round25/best.py "$OUT/bisect.jsonl"
(cd "$OUT" && tar czf build-logs.tgz build_*.log && rm -f build_*.log)
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda
MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s"; grep "flashattn build: compiled" "$OUT/build.log" | tail -1 | cut -c1-120
timeout 240 $PY -m pytest tests -m "gpu and not slow" -n 12 -q -p no:cacheprovider -ra > "$OUT/suite.log" 2>&1
echo "suite rc $? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" "$OUT/suite.log" | tail -6
cat > /tmp/race.py <<'PYEOF'
import torch
from flashattn import flash_attn_func, flash_attn_varlen_func
torch.manual_seed(0)
cases = [dict(), dict(causal=True), dict(window_size=(70, 33)), dict(softcap=20.0)]
for dtype in (torch.bfloat16, torch.float16):
    for kw in cases:
        q = torch.randn(2, 333, 4, 128, device="cuda", dtype=dtype, requires_grad=True)
        k = torch.randn(2, 301, 2, 128, device="cuda", dtype=dtype, requires_grad=True)
        v = torch.randn(2, 301, 2, 128, device="cuda", dtype=dtype, requires_grad=True)
        out = flash_attn_func(q, k, v, **kw)
        out.backward(torch.randn_like(out))
cu = torch.tensor([0, 190, 333, 500], device="cuda", dtype=torch.int32)
q = torch.randn(500, 4, 112, device="cuda", dtype=torch.bfloat16, requires_grad=True)
k = torch.randn(500, 4, 112, device="cuda", dtype=torch.bfloat16, requires_grad=True)
v = torch.randn(500, 4, 112, device="cuda", dtype=torch.bfloat16, requires_grad=True)
out = flash_attn_varlen_func(q, k, v, cu, cu, 190, 190, causal=True)
out.backward(torch.randn_like(out))
torch.cuda.synchronize()
print("race driver done")
PYEOF
timeout 60 compute-sanitizer --tool racecheck --racecheck-report all $PY /tmp/race.py > "$OUT/racecheck.log" 2>&1
echo "racecheck rc $? at ${SECONDS}s"; tail -2 "$OUT/racecheck.log"
if [ $SECONDS -lt 500 ]; then
  timeout $((540 - SECONDS)) $PY scripts/sanitize.py "$OUT/san" --tiles gpu --tools memcheck 2>&1 | tail -3
  echo "memcheck done at ${SECONDS}s"
fi
