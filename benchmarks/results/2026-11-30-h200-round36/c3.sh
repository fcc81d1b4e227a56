#!/bin/bash
# Round 36, call 3 (one H200): the deterministic d256 backward's dQ kernel launched behind the main kernel
# with programmatic stream serialization (pdl.patch) against main's sequential launches (de3bb2f).
# Trees in /tmp: A = the working tree (with the patch), C = the patch reversed. Kernels-only builds of
# every bf16 d256 instantiation, in parallel. A: c1_det256.py (bf16), memcheck, racecheck and synccheck
# over sanitize_det256.py. Then time36.py on C and A (wall-clock, default and deterministic, cuDNN).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R=benchmarks/results/2026-11-30-h200-round36
PY=$(command -v python3)
K='sm90_fwd_bf16_hdim256*,sm90_bwd_bf16_hdim256*'
for t in A C; do
  rm -rf /tmp/$t && mkdir -p /tmp/$t && cp -r csrc flashattn setup.py /tmp/$t/ && rm -f /tmp/$t/flashattn/_C*.so
  if [ $t = C ]; then (cd /tmp/C && patch -s -R -p1 < $OLDPWD/$R/pdl.patch) || echo "patch -R failed"; fi
  (cd /tmp/$t && FLASHATTN_KERNELS_ONLY="$K" MAX_JOBS=8 $PY setup.py build_ext --inplace > /tmp/build$t.log 2>&1; echo "build $t rc $? at ${SECONDS}s") &
done
wait
grep -c griddepcontrol /tmp/A/csrc/sm90/ptx.cuh /tmp/C/csrc/sm90/ptx.cuh
(cd /tmp && PYTHONPATH=/tmp/A:$OLDPWD timeout 60 $PY $OLDPWD/$R/c1_det256.py --bf16-only > "$OUT/det256_A.log" 2>&1; echo "A det256 rc $?: $(tail -1 "$OUT/det256_A.log")")
grep FAIL "$OUT/det256_A.log" | head -5 | cut -c1-250
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck synccheck; do
  (cd /tmp && PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=/tmp/A:$OLDPWD timeout 60 $CS --tool $tool $PY $OLDPWD/$R/sanitize_det256.py > "$OUT/sanitize_$tool.log" 2>&1
   echo "$tool rc $? at ${SECONDS}s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|calls completed' "$OUT/sanitize_$tool.log" | tr '\n' ' ')")
done
for t in C A; do
  echo "== tree $t"
  (cd /tmp && PYTHONPATH=/tmp/$t:$OLDPWD timeout 150 $PY $OLDPWD/$R/time36.py 2>&1 | tee "$OUT/time_$t.log" | grep row)
done
echo "done at ${SECONDS}s"
