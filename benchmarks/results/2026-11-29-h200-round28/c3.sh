#!/bin/bash
# Round 28, call 3 (the warm H200 of call 2, its build and /tmp/fa4 kept; repository root, OUT set;
# .fa4/b carried): FlashAttention-4 joined and installed (scripts/stage_fa4.sh part2), then
# `python -m benchmarks fp8` (d64, d128, d256; S 2k, 8k, 16k; FP8 beside FP8 dequantised, ours
# bf16, cuDNN bf16 and FA4 bf16 in one run), then memcheck over the FP8 calls of the sanitize driver.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
MAX_JOBS=16 source scripts/env.sh > "$OUT/env.log" 2>&1 || { tail -30 "$OUT/env.log"; exit 1; }
echo "env at ${SECONDS}s: $FLASHATTN_BUILD"
FLASHATTN_FA4_DIR=$(PY=$PY bash scripts/stage_fa4.sh part2) && export FLASHATTN_FA4_DIR
echo "FA4 ${FLASHATTN_FA4_DIR:-none} at ${SECONDS}s"
timeout 420 $PY -m benchmarks fp8 --head-dims 64,128,256 --seqlens 2048,8192,16384 --out "$OUT/fp8" > "$OUT/fp8.log" 2>&1
echo "fp8 rc $? at ${SECONDS}s"; tail -30 "$OUT/fp8.log"
cat > /tmp/fp8_calls.py <<'PYEOF'
import sys
import torch
sys.path.insert(0, "scripts")
import sanitize_driver
torch.manual_seed(0)
calls = sum(sanitize_driver.fp8_calls(dtype) for dtype in (torch.bfloat16, torch.float16))
torch.cuda.synchronize()
print(f"driver: {calls} FP8 calls done")
PYEOF
timeout $((590 - SECONDS)) compute-sanitizer --tool memcheck $PY /tmp/fp8_calls.py > "$OUT/memcheck_fp8.log" 2>&1
echo "memcheck rc $? at ${SECONDS}s"; tail -3 "$OUT/memcheck_fp8.log"
