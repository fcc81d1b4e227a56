#!/bin/bash
# Round 27, call 5 (the warm H200 of call 4, its build kept; repository root, OUT set): 81e3d19 --
# memcheck, initcheck and synccheck over every kernel on this GPU's tiles (the driver now with FP8
# calls), racecheck of the FP8 calls alone (sanitize_driver.fp8_calls: the d128 kernel's transposing
# warps), then `python -m benchmarks fp8` (d64, d128, d256; S 2k, 8k, 16k; no FlashAttention-4 staged).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
MAX_JOBS=16 source scripts/env.sh > "$OUT/env.log" 2>&1 || { tail -30 "$OUT/env.log"; exit 1; }
echo "env at ${SECONDS}s: $FLASHATTN_BUILD"
timeout 200 $PY scripts/sanitize.py "$OUT/san" --tiles gpu --tools memcheck,initcheck,synccheck 2>&1 | tail -6
echo "sanitize done at ${SECONDS}s"
cat > /tmp/race_fp8.py <<'PYEOF'
import sys
import torch
sys.path.insert(0, "scripts")
import sanitize_driver
torch.manual_seed(0)
calls = sum(sanitize_driver.fp8_calls(dtype) for dtype in (torch.bfloat16, torch.float16))
torch.cuda.synchronize()
print(f"race driver: {calls} FP8 calls done")
PYEOF
timeout 150 compute-sanitizer --tool racecheck --racecheck-report all $PY /tmp/race_fp8.py > "$OUT/racecheck.log" 2>&1
echo "racecheck rc $? at ${SECONDS}s"; tail -3 "$OUT/racecheck.log"
left=$((585 - SECONDS))
timeout $left $PY -m benchmarks fp8 --head-dims 64,128,256 --seqlens 2048,8192,16384 --out "$OUT/fp8" > "$OUT/fp8.log" 2>&1
echo "fp8 rc $? at ${SECONDS}s"; tail -22 "$OUT/fp8.log"
