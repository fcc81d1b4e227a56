#!/bin/bash
# Round 22, call 7 (one H200; repository root, OUT set): branch next/det-split -- deterministic=True on
# the sm90 split backward (192, MLA's 192/128, 256). A kernels-only build of the forwards and backwards
# those tests need; the repeatability tests (50 runs bitwise equal) and the which-family tests of the new
# cases, test_backward_gpu at d256 (both modes, against the fp32 reference), det_split.py (gradients
# against the default mode and the reference; the time against the default), racecheck on one case.
set -uo pipefail
export CUDA_HOME=/usr/local/cuda TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 PYTHONUNBUFFERED=1
SECONDS=0
here=$PWD
export FLASHATTN_KERNELS_ONLY="sm90_fwd_*_hdim192*,sm90_fwd_*_hdim256*,sm90_bwd_*_hdim192*,sm90_bwd_*_hdim256*"
python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc $? at ${SECONDS}s"
grep "flashattn build: compiled\|KERNELS_ONLY" "$OUT/build.log" | cut -c1-200
export PYTHONPATH=$here
timeout 120 python3 -m pytest tests/test_repeatability.py tests/test_family.py -q -p no:cacheprovider \
  -k "(deterministic and (d256 or d200 or mla or d192)) or d192_deterministic or mla_deterministic or d256_varlen_deterministic" \
  > "$OUT/tests.log" 2>&1
echo "tests rc $? at ${SECONDS}s"; tail -4 "$OUT/tests.log"
timeout 90 python3 -m pytest tests/test_backward.py -q -p no:cacheprovider -k "test_backward_gpu and d256" \
  > "$OUT/backward.log" 2>&1
echo "backward rc $? at ${SECONDS}s"; tail -3 "$OUT/backward.log"
(cd / && timeout 100 python3 "$here/benchmarks/results/2026-11-29-h200-round22/det_split.py") 2>&1 | tee "$OUT/det_split.txt"
echo "det_split at ${SECONDS}s"
cat > /tmp/race.py <<'PYEOF'
import torch
from flashattn import flash_attn_func
torch.manual_seed(0)
for d, dv, causal in ((256, 256, True), (192, 128, False)):
    q = torch.randn(1, 333, 4, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, 301, 2, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, 301, 2, dv, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = flash_attn_func(q, k, v, causal=causal, deterministic=True)
    out.backward(torch.randn_like(out))
torch.cuda.synchronize()
print("race driver done")
PYEOF
left=$((330 - SECONDS)); [ $left -gt 20 ] && timeout $left compute-sanitizer --tool racecheck --racecheck-report all \
  python3 /tmp/race.py > "$OUT/racecheck.log" 2>&1; echo "racecheck rc $? at ${SECONDS}s"; tail -3 "$OUT/racecheck.log"
