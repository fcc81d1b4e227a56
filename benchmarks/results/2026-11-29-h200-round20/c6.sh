#!/bin/bash
# Round 20, call 6 (one H200; repository root, OUT set; carry .fa4/a): FA4 part 1 staged into /tmp; the full
# 9.0a build of main (2e3ba1d: the d128 split backward in FlashAttention-3's order); the full GPU suite;
# memcheck, initcheck and synccheck (this GPU's tiles); racecheck on the changed kernel (d128 split
# backward: plain, causal, local, softcap, varlen, GQA, both dtypes).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
bash scripts/stage_fa4.sh part1 && echo "fa4 part1 staged"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s: $FLASHATTN_BUILD"; grep "flashattn build:" "$OUT/build.log" | tail -1 | cut -c1-200
timeout 290 $PY -m pytest tests -m "gpu and not slow" -n 12 -q -p no:cacheprovider -ra > "$OUT/suite.log" 2>&1
echo "suite rc $? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" "$OUT/suite.log" | tail -15
timeout 100 $PY scripts/sanitize.py "$OUT/san" --tiles gpu --tools memcheck,initcheck,synccheck 2>&1 | tail -6
echo "memcheck+initcheck+synccheck done at ${SECONDS}s"
cat > /tmp/race.py <<'PYEOF'
import torch
from flashattn import flash_attn_func, flash_attn_varlen_func
torch.manual_seed(0)
for dtype in (torch.bfloat16, torch.float16):
    for kw in (dict(), dict(causal=True), dict(window_size=(70, 33)), dict(softcap=20.0), dict(causal=True, softcap=5.0)):
        q = torch.randn(1, 333, 4, 128, device="cuda", dtype=dtype, requires_grad=True)
        k, v = (torch.randn(1, 301, 2, 128, device="cuda", dtype=dtype, requires_grad=True) for _ in range(2))
        out = flash_attn_func(q, k, v, **kw)
        out.backward(torch.randn_like(out))
    cu = torch.tensor([0, 97, 260, 411], device="cuda", dtype=torch.int32)
    q, k, v = (torch.randn(411, 2, 112, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
    out = flash_attn_varlen_func(q, k, v, cu, cu, 163, 163, causal=True)
    out.backward(torch.randn_like(out))
torch.cuda.synchronize()
print("race driver done")
PYEOF
timeout 150 compute-sanitizer --tool racecheck --racecheck-report all $PY /tmp/race.py > "$OUT/racecheck.log" 2>&1
echo "racecheck rc $? at ${SECONDS}s"; tail -4 "$OUT/racecheck.log"
