#!/bin/bash
# Round 37, call 4 (one H200): the d256 dK/dV kernel at N = 80: B (n80.patch), D (the working tree:
# n80_sfirst.patch, B with dP issued only once S is: named barrier 3), E (D at 64 keys a block with two
# dO stages: sed on kernel_traits.h), against main (A). (Call 3's C, S a step ahead, serialised its wgmma:
# ptxas C7515.) Kernels-only builds of the d256 instantiations, in parallel. D and E: smoke37.py (bf16);
# D: racecheck and synccheck. Then kernels.py (A: flashattn, cuDNN; B, D, E: flashattn) and time37.py twice.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R=benchmarks/results/2026-11-30-h200-round37
PY=$(command -v python3)
K='sm90_fwd_bf16_hdim256*,sm90_bwd_bf16_hdim256,sm90_bwd_bf16_hdim256_local,sm90_bwd_bf16_hdim256_softcap,sm90_bwd_bf16_hdim256_local_softcap'
for t in A B D E; do
  rm -rf /tmp/$t && mkdir -p /tmp/$t && cp -r csrc flashattn setup.py /tmp/$t/ && rm -f /tmp/$t/flashattn/_C*.so
  if [ $t = A ]; then (cd /tmp/A && patch -s -R -p1 < $OLDPWD/$R/n80_sfirst.patch) || echo "patch -R A failed"; fi
  if [ $t = B ]; then (cd /tmp/B && patch -s -R -p1 < $OLDPWD/$R/n80_sfirst.patch && patch -s -p1 < $OLDPWD/$R/n80.patch) || echo "patch B failed"; fi
  if [ $t = E ]; then sed -i 's/    static constexpr int kBlockN = 80;  \/\/ keys per block: N of dV^T and dK^T/    static constexpr int kBlockN = 64;  \/\/ keys per block: N of dV^T and dK^T/; s/    static constexpr int kDoStages = 1;  \/\/ dO tiles (and their D): a ring of their own/    static constexpr int kDoStages = 2;  \/\/ dO tiles (and their D): a ring of their own/' /tmp/E/csrc/sm90/kernel_traits.h; fi
  (cd /tmp/$t && FLASHATTN_KERNELS_ONLY="$K" MAX_JOBS=4 $PY setup.py build_ext --inplace > /tmp/build$t.log 2>&1; echo "build $t rc $? at ${SECONDS}s"; grep "ptxas" /tmp/build$t.log | head -2) &
done
wait
grep -c "kSBarrier" /tmp/[ABDE]/csrc/sm90/bwd_kernel.cuh; grep -c "kBlockN = 64;  // keys per block: N of dV" /tmp/[ABDE]/csrc/sm90/kernel_traits.h
for t in D E; do
  (cd /tmp && PYTHONPATH=/tmp/$t:$OLDPWD timeout 100 $PY $OLDPWD/$R/smoke37.py --hdims=256 --dtypes=bf16 > "$OUT/smoke_$t.log" 2>&1; echo "$t smoke rc $? at ${SECONDS}s: $(tail -1 "$OUT/smoke_$t.log")")
done
grep FAIL "$OUT"/smoke_*.log | head -5 | cut -c1-300
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in racecheck synccheck; do
  (cd /tmp && PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=/tmp/D:$OLDPWD timeout 90 $CS --tool $tool $PY $OLDPWD/benchmarks/results/2026-11-30-h200-round36/sanitize_det256.py > /tmp/sanitize_$tool.log 2>&1
   echo "$tool rc $? at ${SECONDS}s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|calls completed' /tmp/sanitize_$tool.log | tr '\n' ' ')")
done
(cd /tmp && PYTHONPATH=/tmp/A:$OLDPWD timeout 150 $PY $OLDPWD/$R/kernels.py --hdims=256 --only=flashattn,cudnn 2>&1 | grep -v Warn > "$OUT/kernels_A.log"; echo "kernels A at ${SECONDS}s")
for t in B D E; do
  (cd /tmp && PYTHONPATH=/tmp/$t:$OLDPWD timeout 100 $PY $OLDPWD/$R/kernels.py --hdims=256 --only=flashattn 2>&1 | grep -v Warn > "$OUT/kernels_$t.log"; echo "kernels $t at ${SECONDS}s")
done
for t in A B D E; do echo "-- $t"; grep -h -E "^D=|bwd_kernel|bwd_dq_kernel" "$OUT/kernels_$t.log" | cut -c1-75; done
for t in A B D E A B D E; do
  echo "== tree $t at ${SECONDS}s"
  (cd /tmp && PYTHONPATH=/tmp/$t:$OLDPWD timeout 100 $PY $OLDPWD/$R/time37.py --hdims=256 --rounds=2 2>&1 | tee -a /tmp/time_$t.log | grep row)
done
cat /tmp/time_[ABDE].log > "$OUT/time_all.log"
echo "done at ${SECONDS}s"
