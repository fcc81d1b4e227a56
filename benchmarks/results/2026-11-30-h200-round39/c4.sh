#!/bin/bash
# Round 39, call 4 (the warm H200 right after call 3, whose full 9.0a build of B it uses; carries
# .fa4/b and .fa3/lib): FlashAttention-4's second part; the parts test (revised: which gradients are
# bitwise reproducible, d256's shape); the full GPU suite; the sweep's backward rows with --rounds 5.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
FA4=$(PY=$(command -v python3) bash scripts/stage_fa4.sh part2) && export FLASHATTN_FA4_DIR=$FA4 && echo "fa4 at $FA4"
mkdir -p /tmp/fa3 && cp .fa3/lib/libfa3.so /tmp/fa3/ && export FLASHATTN_FA3_LIB=/tmp/fa3/libfa3.so
if ls flashattn/_C*.so > /dev/null 2>&1; then echo "build kept"; source scripts/env.sh > /tmp/env.log 2>&1; else
  FLASHATTN_FORCE_BUILD=1 MAX_JOBS=16 source scripts/env.sh > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
  echo "rebuilt at ${SECONDS}s"; fi
timeout 120 $PY -m pytest tests/test_family.py -k "last_wave" -q -p no:cacheprovider -ra > "$OUT/parts_test.log" 2>&1
echo "parts tests rc $? at ${SECONDS}s: $(tail -1 "$OUT/parts_test.log" | cut -c1-200)"; grep -E "^FAILED|^E  " "$OUT/parts_test.log" | head -8 | cut -c1-300
timeout 290 $PY -m pytest tests -m "gpu and not slow" -n 12 -q -p no:cacheprovider -ra > "$OUT/tests.log" 2>&1
echo "tests rc $? at ${SECONDS}s"; tail -1 "$OUT/tests.log" | cut -c1-200; grep -E "^FAILED|^ERROR" "$OUT/tests.log" | head -20 | cut -c1-250
timeout $((590 - SECONDS)) $PY -m benchmarks sweep --passes bwd --headdims 64,128,256 --seqlens 2048,8192 --dtypes bf16 \
  --backends flashattn,flashattn_det,cudnn,fa4,fa3 --rounds 5 --memory-seqlens '' --train-memory-seqlens '' \
  --out "$OUT/sweep" > "$OUT/sweep.log" 2>&1
echo "sweep rc $? at ${SECONDS}s"
sed -n '/^### bf16/,$p' "$OUT/sweep/results.md" | cut -c1-330 | head -18
grep -iE "mismatch|error|Traceback" "$OUT/sweep.log" | head -8
