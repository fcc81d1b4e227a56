#!/bin/bash
# Round 39, call 3 (one H200; carries .fa4/a, staged first for call 4): A main (ba78fc5: the working tree
# with split.patch reversed, kernels-only bf16 build of d64/d128/d256), B the working tree (split.patch:
# without a mask the default backward grids' last wave runs in parts, schedule.h: TailSplit; full 9.0a
# build in the repository, kept for call 4). The new parts test; smoke37.py on B (d256, d128);
# time37.py A, B; kernels.py (A with cuDNN and FA3, B).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R=benchmarks/results/2026-11-30-h200-round39
R37=benchmarks/results/2026-11-30-h200-round37
bash scripts/stage_fa4.sh part1 && echo "fa4 part 1 staged"
PY=$(command -v python3)
mkdir -p /tmp/fa3 && cp .fa3/lib/libfa3.so /tmp/fa3/ && export FLASHATTN_FA3_LIB=/tmp/fa3/libfa3.so
KALL='sm90_fwd_bf16_hdim64*,sm90_fwd_bf16_hdim128*,sm90_fwd_bf16_hdim256*,sm90_bwd_bf16_hdim64*,sm90_bwd_bf16_hdim128*,sm90_bwd_bf16_hdim256*'
rm -rf /tmp/A && mkdir -p /tmp/A && cp -r csrc flashattn setup.py /tmp/A/ && rm -f /tmp/A/flashattn/_C*.so
(cd /tmp/A && patch -s -R -p1 < $OLDPWD/$R/split.patch) || echo "patch -R A failed"
(cd /tmp/A && FLASHATTN_KERNELS_ONLY="$KALL" MAX_JOBS=4 $PY setup.py build_ext --inplace > /tmp/buildA.log 2>&1; echo "build A rc $? at ${SECONDS}s") &
rm -f flashattn/_C*.so
FLASHATTN_FORCE_BUILD=1 MAX_JOBS=14 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build B done at ${SECONDS}s"; grep "flashattn build:" "$OUT/build.log" | tail -1 | cut -c1-300
wait
grep -c "TailSplit" /tmp/A/csrc/sm90/schedule.h csrc/sm90/schedule.h
timeout 120 $PY -m pytest tests/test_family.py -k "last_wave or grid_holds and not query" -q -p no:cacheprovider -ra > "$OUT/parts_test.log" 2>&1
echo "parts tests rc $? at ${SECONDS}s: $(tail -1 "$OUT/parts_test.log" | cut -c1-200)"; grep -E "^FAILED|Error" "$OUT/parts_test.log" | head -5 | cut -c1-300
for spec in "--hdims=256" "--hdims=128"; do
  timeout 70 $PY $R37/smoke37.py --dtypes=bf16 $spec >> "$OUT/smoke.log" 2>&1; echo "smoke $spec rc $? at ${SECONDS}s: $(tail -1 "$OUT/smoke.log")"
done
grep FAIL "$OUT/smoke.log" | head -5 | cut -c1-300
for t in A B; do
  [ $SECONDS -gt 450 ] && { echo "skip time $t"; continue; }
  D=/tmp/A; [ $t = B ] && D=$PWD
  echo "== time $t at ${SECONDS}s"
  (cd /tmp && PYTHONPATH=$D:$OLDPWD timeout 100 $PY $OLDPWD/$R37/time37.py --hdims=64,128,256 --rounds=2 2>&1 | tee -a /tmp/time_$t.log | grep row)
done
cat /tmp/time_A.log /tmp/time_B.log > "$OUT/time_all.log" 2>/dev/null
for t in A B; do
  [ $SECONDS -gt 530 ] && { echo "skip kernels $t"; continue; }
  D=/tmp/A; O=flashattn,fa3,cudnn; [ $t = B ] && D=$PWD && O=flashattn
  (cd /tmp && PYTHONPATH=$D:$OLDPWD timeout 60 $PY $OLDPWD/$R37/kernels.py --hdims=128,256 --only=$O 2>&1 | grep -v Warn > "$OUT/kernels_$t.log"; echo "kernels $t at ${SECONDS}s")
  grep -h -E "^D=|bwd_kernel|bwd_dq_kernel|FlashAttnBwdSm90" "$OUT/kernels_$t.log" | cut -c1-80
done
echo "done at ${SECONDS}s"
