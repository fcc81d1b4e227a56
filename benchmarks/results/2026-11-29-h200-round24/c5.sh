#!/bin/bash
# Round 24, call 5 (a fresh H200; repository root, OUT set): main's backward against cuDNN with
# round 13's bench_bwd.py (three interleaved do_bench medians a backend, best kept), since call 4's
# single quick pass read d128 8k causal at 0.98x cuDNN (round 21's bench: 1.06x). Kernels-only build
# of the bf16 sm90 kernels at head dims 64, 128 and 256 (the default mode's); FA4 not staged.
set -uo pipefail
export CUDA_HOME=/usr/local/cuda TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 PYTHONUNBUFFERED=1
SECONDS=0
pats=""
for d in hdim64 hdim128 hdim256; do
  for x in "" _local; do pats="$pats,sm90_fwd_bf16_${d}${x},sm90_bwd_bf16_${d}${x}"; done
done
FLASHATTN_KERNELS_ONLY="${pats#,}" python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1
echo "build rc $? at ${SECONDS}s"
PYTHONPATH=$PWD timeout 150 python3 benchmarks/results/2026-11-28-h200-round13/bench_bwd.py 64 128 256 2> "$OUT/bwd.err" | tee "$OUT/bwd.md"
echo "bench at ${SECONDS}s"; tail -3 "$OUT/bwd.err"
