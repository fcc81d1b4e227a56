#!/bin/bash
# Round 43, call 2: probe43.py on a kernels-only bf16 d256 build of main, with nvidia-smi sampling the SM
# clock, power, temperature and clock-event reasons every 50 ms.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1 MAX_JOBS=16
SECONDS=0
PY=$(command -v python3)
ONLY='sm90_fwd_bf16_hdim256,sm90_fwd_bf16_hdim256_local,sm90_bwd_bf16_hdim256,sm90_bwd_bf16_hdim256_local'
ls flashattn/_C*.so > /dev/null 2>&1 || { FLASHATTN_KERNELS_ONLY=$ONLY $PY setup.py build_ext --inplace > /tmp/build.log 2>&1; echo "build rc $? at ${SECONDS}s"; }
nvidia-smi --query-gpu=clocks.max.sm,power.limit,enforced.power.limit --format=csv
nvidia-smi --query-gpu=clocks_event_reasons.active --format=csv > /dev/null 2>&1 && WHY=clocks_event_reasons.active || WHY=clocks_throttle_reasons.active
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,$WHY --format=csv,noheader -lms 50 > "$OUT/smi.csv" 2>&1 &
SMI=$!
PYTHONPATH=$PWD timeout 150 $PY benchmarks/results/2026-11-30-h200-round43/probe43.py 2>&1 | grep -v Warn | tee "$OUT/probe.log"
kill $SMI
echo "smi samples $(wc -l < "$OUT/smi.csv")"; head -3 "$OUT/smi.csv"
echo "done at ${SECONDS}s"
