#!/bin/bash
# Round 34, call 1 (one H200; carries .fa3/lib): the d256 backward with P's barrier split from dS's
# (dV^T issued while dS is computed and stored), against main's (3808455) in one call: kernels-only build
# of the branch, c1_smoke.py, the d256 backward rows (flashattn, cuDNN, FA3), Nsight Compute on one d256
# 8k backward of the branch; then main's bwd_kernel.cuh copied in, rebuilt, the same rows.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
export FLASHATTN_KERNELS_ONLY='sm90_*hdim256*'
SECONDS=0
R=benchmarks/results/2026-11-30-h200-round34
R33=benchmarks/results/2026-11-30-h200-round33
mkdir -p /tmp/fa3 && cp .fa3/lib/libfa3.so /tmp/fa3/ && export FLASHATTN_FA3_LIB=/tmp/fa3/libfa3.so
build() {
  rm -f flashattn/_C*.so
  FLASHATTN_FORCE_BUILD=1 MAX_JOBS=16 source scripts/env.sh > "$OUT/build_$1.log" 2>&1 || { tail -30 "$OUT/build_$1.log"; exit 1; }
  echo "build $1 done at ${SECONDS}s: $FLASHATTN_BUILD"; grep -i "spill" "$OUT/build_$1.log" | tail -1
}
rows() {
  timeout 120 $PY -m benchmarks sweep --passes bwd --headdims 256 --seqlens 2048,8192 --dtypes bf16 \
    --backends "$2" --memory-seqlens '' --train-memory-seqlens '' --out "$OUT/sweep_$1" > "$OUT/sweep_$1.log" 2>&1
  echo "sweep $1 rc $? at ${SECONDS}s"; sed -n '/^### bf16/,/^Cells/p' "$OUT/sweep_$1/results.md" | cut -c1-200 | head -10
  grep -iE "mismatch|error|Traceback" "$OUT/sweep_$1.log" | head -5
}
build branch
PYTHONPATH=$PWD timeout 100 $PY $R33/c1_smoke.py > "$OUT/smoke.log" 2>&1
echo "smoke rc $? at ${SECONDS}s"; grep -v ": ok$" "$OUT/smoke.log" | cut -c1-300 | tail -8
rows branch flashattn,cudnn,fa3
OUT=$OUT/prof timeout 220 bash scripts/profile_bwd.sh 256 0 8192 > "$OUT/prof.log" 2>&1
echo "profile rc $? at ${SECONDS}s"; tail -5 "$OUT/prof.log"; rm -f "$OUT"/prof/*.ncu-rep "$OUT"/prof/*-source.csv
head -45 "$OUT"/prof/*-stalls.txt
cp $R/main_bwd_kernel.cuh csrc/sm90/bwd_kernel.cuh
build main
rows main flashattn,cudnn
