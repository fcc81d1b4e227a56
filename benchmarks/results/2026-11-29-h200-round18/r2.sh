#!/bin/bash
# Round 18, call 2 (the machine of call 1, warm): FlashAttention-4's wheels, part 2, joined and
# installed into /tmp/fa4site; the families benchmark, bf16 then fp16 (each its own table and run of
# its baselines), head dims 64/96/128/192/256, S 512/2k/8k/16k, with SDPA flash and FA4.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build (skipped if unchanged): $FLASHATTN_BUILD at ${SECONDS}s"
FLASHATTN_FA4_DIR=$(PY=$PY bash scripts/stage_fa4.sh part2) && export FLASHATTN_FA4_DIR
echo "fa4: ${FLASHATTN_FA4_DIR:-not staged} at ${SECONDS}s"
for dtype in bf16 fp16; do
  timeout ${FAMILIES_S:-270} $PY -m benchmarks families --dtype $dtype --head-dims 64,96,128,192,256 \
      --seqlens 512,2048,8192,16384 --out "$OUT/families-$dtype" > "$OUT/families-$dtype.log" 2>&1
  echo "families $dtype rc $? at ${SECONDS}s"; grep "^| " "$OUT/families-$dtype/families.md" 2>/dev/null | cut -d'|' -f2-6,7-12
  grep -v "^|" "$OUT/families-$dtype.log" | grep -i "error\|fail\|FlashAttention-4" | sort | uniq -c | head -5
done
echo "r2 done at ${SECONDS}s"
