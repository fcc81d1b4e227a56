#!/bin/bash
# Round 26, call 2 (one H200; repository root, OUT set): main with the dQ reduce helper and the
# cyclic-garbage test's allocator reading -- the full 9.0a build, the full GPU suite,
# memcheck/initcheck/synccheck over every kernel on this GPU's tiles, racecheck of the backward
# (d128 default and deterministic, the split kernel's d192 and MLA, d256).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s: $FLASHATTN_BUILD"; grep "flashattn build: compiled" "$OUT/build.log" | tail -1 | cut -c1-160
timeout 270 $PY -m pytest tests -m "gpu and not slow" -n 12 -q -p no:cacheprovider -ra > "$OUT/suite.log" 2>&1
echo "suite rc $? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" "$OUT/suite.log" | tail -8
timeout 110 $PY scripts/sanitize.py "$OUT/san" --tiles gpu --tools memcheck,initcheck,synccheck 2>&1 | tail -6
echo "sanitize done at ${SECONDS}s"
cat > /tmp/race.py <<'PYEOF'
import torch
from flashattn import flash_attn_func
torch.manual_seed(0)
for d, dv, causal, det in ((128, 128, False, False), (128, 128, True, True), (192, 128, False, False),
                           (192, 192, True, False), (256, 256, False, True)):
    q = torch.randn(2, 333, 4, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 301, 2, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(2, 301, 2, dv, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = flash_attn_func(q, k, v, causal=causal, deterministic=det)
    out.backward(torch.randn_like(out))
torch.cuda.synchronize()
print("race driver done")
PYEOF
left=$((585 - SECONDS))
if [ $left -gt 30 ]; then
  timeout $left compute-sanitizer --tool racecheck --racecheck-report all $PY /tmp/race.py > "$OUT/racecheck.log" 2>&1
  echo "racecheck rc $? at ${SECONDS}s"; tail -3 "$OUT/racecheck.log"
fi
