#!/bin/bash
# Round 37, call 1 (one H200): d128's default backward at 64 queries a step (the dQ owner, as the
# deterministic kernel; FlashAttention-3 takes 64 under a causal mask, 80 without) against main's 80
# (the split dQ^T). Trees in /tmp: A = main, B = BwdTraitsOf<128> at 64 in both modes. Kernels-only
# builds of the bf16 d128 instantiations, in parallel. B: smoke37.py (d128, bf16, default mode).
# Then time37.py (d128, default, deterministic, cuDNN) on A, B, A, B.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R=benchmarks/results/2026-11-30-h200-round37
PY=$(command -v python3)
K='sm90_fwd_bf16_hdim128*,sm90_bwd_bf16_hdim128*'
for t in A B; do
  rm -rf /tmp/$t && mkdir -p /tmp/$t && cp -r csrc flashattn setup.py /tmp/$t/ && rm -f /tmp/$t/flashattn/_C*.so
  if [ $t = B ]; then
    sed -i 's/using type = BwdTraits<128, Is_deterministic ? 64 : 80, Element>;/using type = BwdTraits<128, 64, Element>;/;s/BwdTraitsFor<128, void>::kDqOwnerRegs == 240 \&\& BwdTraitsFor<128, void>::kKeyRegs == 240 \&\&//' /tmp/B/csrc/sm90/kernel_traits.h
    grep -c "BwdTraits<128, 64, Element>" /tmp/B/csrc/sm90/kernel_traits.h
  fi
  (cd /tmp/$t && FLASHATTN_KERNELS_ONLY="$K" MAX_JOBS=8 $PY setup.py build_ext --inplace > /tmp/build$t.log 2>&1; echo "build $t rc $? at ${SECONDS}s"; grep -i "spill" /tmp/build$t.log | grep -v " 0 bytes spill" | head -3) &
done
wait
(cd /tmp && PYTHONPATH=/tmp/B:$OLDPWD timeout 120 $PY $OLDPWD/$R/smoke37.py --hdims=128 --dtypes=bf16 > "$OUT/smoke_B.log" 2>&1; echo "B smoke rc $?: $(tail -1 "$OUT/smoke_B.log")")
grep FAIL "$OUT/smoke_B.log" | head -5 | cut -c1-250
for t in A B A B; do
  echo "== tree $t at ${SECONDS}s"
  (cd /tmp && PYTHONPATH=/tmp/$t:$OLDPWD timeout 100 $PY $OLDPWD/$R/time37.py --hdims=128 --rounds=2 2>&1 | tee -a "$OUT/time_$t.log" | grep row)
done
echo "done at ${SECONDS}s"
