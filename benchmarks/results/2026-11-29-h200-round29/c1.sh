#!/bin/bash
# Round 29, call 1 (one H200; repository root, OUT set): main 7ae4571 (round 28's dequantize_fp8
# kernel merged) -- the full 9.0a build, the full GPU suite, memcheck over the sanitize driver's FP8
# calls (which now call dequantize_fp8 too), then the dequantising route against the kernel.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s: $FLASHATTN_BUILD"
timeout 300 $PY -m pytest tests -m "gpu and not slow" -n 12 -q -p no:cacheprovider -ra > "$OUT/suite.log" 2>&1
echo "suite rc $? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" "$OUT/suite.log" | tail -8
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
for tool in memcheck initcheck; do
  timeout $((560 - SECONDS)) compute-sanitizer --tool $tool $PY /tmp/fp8_calls.py > "$OUT/${tool}_fp8.log" 2>&1
  echo "$tool rc $? at ${SECONDS}s"; tail -3 "$OUT/${tool}_fp8.log"
done
