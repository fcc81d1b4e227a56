#!/bin/bash
# Round 37, call 3 (one H200): the d256 dK/dV kernel at N = 80 (B: n80.patch) and the same with S issued
# ahead of dP and a step ahead, behind the dK^T GEMMs (C: the working tree, n80.patch + pipe.patch),
# against main (A: n80_pipe.patch reversed). Kernels-only builds of the d256 instantiations, in parallel.
# C: smoke37.py (both dtypes; bf16 deterministic), memcheck, racecheck and synccheck over round 36's
# sanitize_det256.py. Then kernels.py (A: flashattn, FA3, cuDNN; B, C: flashattn) and time37.py on A, B, C twice.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R=benchmarks/results/2026-11-30-h200-round37
PY=$(command -v python3)
mkdir -p /tmp/fa3 && cp .fa3/lib/libfa3.so /tmp/fa3/ && export FLASHATTN_FA3_LIB=/tmp/fa3/libfa3.so
K='sm90_fwd_bf16_hdim256*,sm90_fwd_fp16_hdim256*,sm90_bwd_bf16_hdim256*,sm90_bwd_fp16_hdim256*'
for t in A B C; do
  rm -rf /tmp/$t && mkdir -p /tmp/$t && cp -r csrc flashattn setup.py /tmp/$t/ && rm -f /tmp/$t/flashattn/_C*.so
  if [ $t = A ]; then (cd /tmp/A && patch -s -R -p1 < $OLDPWD/$R/n80_pipe.patch) || echo "patch -R A failed"; fi
  if [ $t = B ]; then (cd /tmp/B && patch -s -R -p1 < $OLDPWD/$R/pipe.patch) || echo "patch -R B failed"; fi
  (cd /tmp/$t && FLASHATTN_KERNELS_ONLY="$K" MAX_JOBS=5 $PY setup.py build_ext --inplace > /tmp/build$t.log 2>&1; echo "build $t rc $? at ${SECONDS}s"; grep "ptxas" /tmp/build$t.log | head -2) &
done
wait
grep -c "kDsBarrier\|kSBarrier" /tmp/A/csrc/sm90/bwd_kernel.cuh /tmp/B/csrc/sm90/bwd_kernel.cuh /tmp/C/csrc/sm90/bwd_kernel.cuh
(cd /tmp && PYTHONPATH=/tmp/C:$OLDPWD timeout 150 $PY $OLDPWD/$R/smoke37.py --hdims=256 > "$OUT/smoke_C.log" 2>&1; echo "C smoke rc $? at ${SECONDS}s: $(tail -1 "$OUT/smoke_C.log")")
(cd /tmp && PYTHONPATH=/tmp/C:$OLDPWD timeout 100 $PY $OLDPWD/$R/smoke37.py --hdims=256 --dtypes=bf16 --det > "$OUT/smoke_C_det.log" 2>&1; echo "C smoke det rc $? at ${SECONDS}s: $(tail -1 "$OUT/smoke_C_det.log")")
grep FAIL "$OUT"/smoke_C*.log | head -5 | cut -c1-300
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck synccheck; do
  (cd /tmp && PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=/tmp/C:$OLDPWD timeout 90 $CS --tool $tool $PY $OLDPWD/benchmarks/results/2026-11-30-h200-round36/sanitize_det256.py > /tmp/sanitize_$tool.log 2>&1
   echo "$tool rc $? at ${SECONDS}s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|calls completed' /tmp/sanitize_$tool.log | tr '\n' ' ')")
done
tail -c 3000 /tmp/sanitize_synccheck.log > "$OUT/sanitize.log"; grep -h "SUMMARY" /tmp/sanitize_*.log >> "$OUT/sanitize.log"
(cd /tmp && PYTHONPATH=/tmp/A:$OLDPWD timeout 150 $PY $OLDPWD/$R/kernels.py --hdims=256 --only=flashattn,fa3,cudnn 2>&1 | grep -v Warn > "$OUT/kernels_A.log"; echo "kernels A at ${SECONDS}s")
for t in B C; do
  (cd /tmp && PYTHONPATH=/tmp/$t:$OLDPWD timeout 100 $PY $OLDPWD/$R/kernels.py --hdims=256 --only=flashattn 2>&1 | grep -v Warn > "$OUT/kernels_$t.log"; echo "kernels $t at ${SECONDS}s")
done
grep -h -E "^D=|bwd_kernel|bwd_dq_kernel|flash_bwd|cudnn_gen" "$OUT"/kernels_[ABC].log | cut -c1-90
for t in A B C A B C; do
  echo "== tree $t at ${SECONDS}s"
  (cd /tmp && PYTHONPATH=/tmp/$t:$OLDPWD timeout 100 $PY $OLDPWD/$R/time37.py --hdims=256 --rounds=2 2>&1 | tee -a "$OUT/time_$t.log" | grep row)
done
echo "done at ${SECONDS}s"
