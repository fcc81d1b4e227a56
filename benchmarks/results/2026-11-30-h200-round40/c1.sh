#!/bin/bash
# Round 40, call 1 (one H200; carries out/A.tar.gz and .fa4/a): FA4's first part staged for call 2;
# V8 (the working tree, dfb7719: round 39's landed form, never GPU-run) full 9.0a build; A (ba78fc5, main
# before round 39's change: out/A.tar.gz) kernels-only bf16 d128/d256 build in /tmp/A beside it; A and
# V8 in alternating processes (time37.py at d256, three processes each) and kernels.py (A, V8) at d256:
# whether round 39's d256 causal 8k drop is the machines or the change; then the full GPU suite on V8.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R37=benchmarks/results/2026-11-30-h200-round37
bash scripts/stage_fa4.sh part1 && echo "fa4 part 1 staged"
PY=$(command -v python3)
KALL='sm90_fwd_bf16_hdim128*,sm90_fwd_bf16_hdim256*,sm90_bwd_bf16_hdim128*,sm90_bwd_bf16_hdim256*'
rm -rf /tmp/A && mkdir -p /tmp/A && tar -xzf out/A.tar.gz -C /tmp/A && rm -f /tmp/A/flashattn/_C*.so
(cd /tmp/A && FLASHATTN_KERNELS_ONLY="$KALL" MAX_JOBS=4 $PY setup.py build_ext --inplace > /tmp/buildA.log 2>&1; echo "build A rc $? at ${SECONDS}s") &
rm -f flashattn/_C*.so
FLASHATTN_FORCE_BUILD=1 MAX_JOBS=14 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build V8 done at ${SECONDS}s"; grep "flashattn build:" "$OUT/build.log" | tail -1 | cut -c1-300
wait
tail -2 /tmp/buildA.log | cut -c1-200
grep -c "TailSplit" /tmp/A/csrc/sm90/schedule.h csrc/sm90/schedule.h
for i in 1 2 3; do
  for t in A B; do
    [ $SECONDS -gt 300 ] && { echo "skip time $t $i"; continue; }
    D=/tmp/A; [ $t = B ] && D=$PWD
    echo "== time $t $i at ${SECONDS}s"
    (cd /tmp && PYTHONPATH=$D:$OLDPWD timeout 60 $PY $OLDPWD/$R37/time37.py --hdims=256 --rounds=2 2>&1 | tee -a /tmp/time_$t.log | grep row | cut -c1-120)
  done
done
cat /tmp/time_A.log /tmp/time_B.log > "$OUT/time_all.log" 2>/dev/null
for t in A B; do
  [ $SECONDS -gt 330 ] && { echo "skip kernels $t"; continue; }
  D=/tmp/A; [ $t = B ] && D=$PWD
  (cd /tmp && PYTHONPATH=$D:$OLDPWD timeout 25 $PY $OLDPWD/$R37/kernels.py --hdims=256 --only=flashattn 2>&1 | grep -v Warn > "$OUT/kernels_$t.log"; echo "kernels $t at ${SECONDS}s")
  grep -h -E "^D=|bwd_kernel|bwd_dq_kernel" "$OUT/kernels_$t.log" | cut -c1-80
done
timeout $((590 - SECONDS)) $PY -m pytest tests -m "gpu and not slow" -n 12 -q -p no:cacheprovider -ra > "$OUT/tests.log" 2>&1
echo "tests rc $? at ${SECONDS}s"; tail -1 "$OUT/tests.log" | cut -c1-200; grep -E "^FAILED|^ERROR" "$OUT/tests.log" | head -20 | cut -c1-250
grep -c "last_wave" "$OUT/tests.log"
echo "done at ${SECONDS}s"
