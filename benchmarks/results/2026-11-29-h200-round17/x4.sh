#!/bin/bash
# Round 17, call 4 (the machine of call 3, warm): FlashAttention-4's wheels, part 2, joined and
# installed into /tmp/fa4site; the families benchmark, bf16 then fp16 (each its own table and run of
# its baselines), head dims 64/96/128/192/256, S 512/2k/8k/16k, with SDPA flash and FA4.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
if [ -f /tmp/fa4/cu13.part-aa ]; then
  cp .fa4/b/* /tmp/fa4/ && cat /tmp/fa4/cu13.part-aa /tmp/fa4/cu13.part-ab \
      > /tmp/fa4/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl && rm /tmp/fa4/cu13.part-*
else
  echo "no FA4 part 1 here (a fresh machine): FA4 rows will say n/a"
fi
MAX_JOBS=16 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build (skipped if unchanged): $FLASHATTN_BUILD at ${SECONDS}s"
ls /tmp/fa4/*.whl > /dev/null 2>&1 && $PY -m pip install --no-index --no-deps --target /tmp/fa4site /tmp/fa4/*.whl > "$OUT/fa4_install.log" 2>&1
echo "fa4 install rc $? at ${SECONDS}s"
export FLASHATTN_FA4_DIR=/tmp/fa4site
for dtype in bf16 fp16; do
  timeout ${FAMILIES_S:-270} $PY -m benchmarks families --dtype $dtype --head-dims 64,96,128,192,256 \
      --seqlens 512,2048,8192,16384 --out "$OUT/families-$dtype" > "$OUT/families-$dtype.log" 2>&1
  echo "families $dtype rc $? at ${SECONDS}s"; grep "^| " "$OUT/families-$dtype/families.md" 2>/dev/null | cut -d'|' -f2-6,7-12
  grep -v "^|" "$OUT/families-$dtype.log" | grep -i "error\|fail\|FlashAttention-4" | sort | uniq -c | head -5
done
echo "x4 done at ${SECONDS}s"
