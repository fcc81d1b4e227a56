#!/bin/bash
# Round 38, call 1 (one H200): A main (2651755), B A + s_ahead.patch (the d256 dK/dV kernel issues the next
# step's S behind the step's dK^T, waited within the step: round 37's branch exp/d256-s-ahead), C the working
# tree (grid.patch: the default backward grid (batch, key tile, KV head), d256's dQ grid (batch, query tile,
# head)). Kernels-only bf16 builds in parallel (B: d256 only). time37.py (A, B, C interleaved, twice),
# kernels.py, smoke37.py on B and C, racecheck and synccheck on B.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R=benchmarks/results/2026-11-30-h200-round38
R37=benchmarks/results/2026-11-30-h200-round37
PY=$(command -v python3)
mkdir -p /tmp/fa3 && cp .fa3/lib/libfa3.so /tmp/fa3/ && export FLASHATTN_FA3_LIB=/tmp/fa3/libfa3.so
KALL='sm90_fwd_bf16_hdim64*,sm90_fwd_bf16_hdim128*,sm90_fwd_bf16_hdim256*,sm90_bwd_bf16_hdim64*,sm90_bwd_bf16_hdim128*,sm90_bwd_bf16_hdim256*'
K256='sm90_fwd_bf16_hdim256*,sm90_bwd_bf16_hdim256*'
for t in A B C; do
  rm -rf /tmp/$t && mkdir -p /tmp/$t && cp -r csrc flashattn setup.py /tmp/$t/ && rm -f /tmp/$t/flashattn/_C*.so
  if [ $t != C ]; then (cd /tmp/$t && patch -s -R -p1 < $OLDPWD/$R/grid.patch) || echo "patch -R $t failed"; fi
  if [ $t = B ]; then (cd /tmp/B && patch -s -p1 < $OLDPWD/$R/s_ahead.patch) || echo "patch B failed"; fi
  K=$KALL; J=6; if [ $t = B ]; then K=$K256; J=4; fi
  (cd /tmp/$t && FLASHATTN_KERNELS_ONLY="$K" MAX_JOBS=$J $PY setup.py build_ext --inplace > /tmp/build$t.log 2>&1; echo "build $t rc $? at ${SECONDS}s"; grep -E "ptxas|error" /tmp/build$t.log | head -3) &
done
wait
grep -c "blockIdx.y;" /tmp/[ABC]/csrc/sm90/bwd_kernel.cuh; grep -c "next step's S" /tmp/[ABC]/csrc/sm90/bwd_kernel.cuh
hd() { [ $1 = B ] && echo 256 || echo 64,128,256; }
for t in A B C A B C; do
  echo "== time $t at ${SECONDS}s"
  (cd /tmp && PYTHONPATH=/tmp/$t:$OLDPWD timeout 120 $PY $OLDPWD/$R37/time37.py --hdims=$(hd $t) --rounds=2 2>&1 | tee -a /tmp/time_$t.log | grep row)
done
cat /tmp/time_[ABC].log > "$OUT/time_all.log"
for t in A C B; do
  O=flashattn; [ $t = A ] && O=flashattn,fa3,cudnn
  H=128,256; [ $t = B ] && H=256
  (cd /tmp && PYTHONPATH=/tmp/$t:$OLDPWD timeout 100 $PY $OLDPWD/$R37/kernels.py --hdims=$H --only=$O 2>&1 | grep -v Warn > "$OUT/kernels_$t.log"; echo "kernels $t at ${SECONDS}s")
  grep -h -E "^D=|bwd_kernel|bwd_dq_kernel|FlashAttnBwdSm90" "$OUT/kernels_$t.log" | cut -c1-80
done
for spec in "C --hdims=128" "C --hdims=128 --det" "C --hdims=256" "C --hdims=64" "B --hdims=256" "B --hdims=256 --det"; do
  set -- $spec; t=$1; shift
  [ $SECONDS -gt 500 ] && { echo "skip smoke $spec"; continue; }
  (cd /tmp && PYTHONPATH=/tmp/$t:$OLDPWD timeout 80 $PY $OLDPWD/$R37/smoke37.py --dtypes=bf16 "$@" >> "$OUT/smoke_$t.log" 2>&1; echo "smoke $spec rc $? at ${SECONDS}s: $(tail -1 "$OUT/smoke_$t.log")")
done
grep FAIL "$OUT"/smoke_*.log | head -5 | cut -c1-300
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in racecheck synccheck; do
  [ $SECONDS -gt 520 ] && { echo "skip $tool"; continue; }
  (cd /tmp && PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=/tmp/B:$OLDPWD timeout $((590 - SECONDS)) $CS --tool $tool $PY $OLDPWD/benchmarks/results/2026-11-30-h200-round36/sanitize_det256.py > /tmp/sanitize_$tool.log 2>&1
   echo "$tool rc $? at ${SECONDS}s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|calls completed' /tmp/sanitize_$tool.log | tr '\n' ' ')")
done
echo "done at ${SECONDS}s"
