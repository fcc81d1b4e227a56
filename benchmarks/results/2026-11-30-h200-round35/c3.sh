#!/bin/bash
# Round 35, call 3 (one H200): the d256 dQ conversion staged through shared memory (16-byte stores of whole
# rows) in place of 4-byte stores from the tile's slots. Kernels-only build of the d256 and d128 bf16
# instantiations in place; round 33's c1_smoke.py (d256/255/224/193, softcap, packed) and compute-sanitizer
# memcheck and racecheck on c4_sanitize_d256.py; then kernels.py (kernel by kernel, with FA3 and cuDNN) at
# d256 and d128.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R=benchmarks/results/2026-11-30-h200-round35
R33=benchmarks/results/2026-11-30-h200-round33
PY=$(command -v python3)
mkdir -p /tmp/fa3 && cp .fa3/lib/libfa3.so /tmp/fa3/ && export FLASHATTN_FA3_LIB=/tmp/fa3/libfa3.so
rm -f flashattn/_C*.so
K=""; for d in 256 128; do for p in fwd bwd; do for l in "" _local; do K="$K,sm90_${p}_bf16_hdim$d$l"; done; done; done
FLASHATTN_KERNELS_ONLY="${K#,}" MAX_JOBS=16 $PY setup.py build_ext --inplace > /tmp/build.log 2>&1
echo "build rc $? at ${SECONDS}s: $(grep -o 'flashattn build: compiled.*' /tmp/build.log | cut -c1-120)"
timeout 120 $PY $R33/c1_smoke.py > "$OUT/smoke.log" 2>&1
echo "smoke rc $? at ${SECONDS}s: $(grep -c ': ok$' "$OUT/smoke.log") ok"; grep -v ": ok$" "$OUT/smoke.log" | cut -c1-300 | tail -6
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck; do
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 90 $CS --tool $tool $PY $R33/c4_sanitize_d256.py > "$OUT/sanitize_$tool.log" 2>&1
  echo "$tool rc $? at ${SECONDS}s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|calls completed' "$OUT/sanitize_$tool.log" | tr '\n' ' ')"
done
timeout 200 $PY $R/kernels.py --hdims=256,128 2>&1 | tee "$OUT/kernels.log" | grep -v Warn | cut -c1-120
echo "done at ${SECONDS}s"
