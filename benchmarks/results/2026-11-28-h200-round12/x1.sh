#!/bin/bash
# Round 12, first call on 2 H200s (run from the repository root, OUT set): the full 9.0a build of this
# tree and, beside it, main's d128 backward (.ab/main, a `git archive` of HEAD before the 80-query
# kernel, kernels only); the context-parallel GPU tests; the context-parallel benchmark at 256k and 512k.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda
here=benchmarks/results/2026-11-28-h200-round12
SECONDS=0
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv
(cd .ab/main && FLASHATTN_KERNELS_ONLY='sm90_fwd_bf16_hdim128*,sm90_bwd_bf16_hdim128*' MAX_JOBS=8 \
    python3 setup.py build_ext --inplace > "$OUT/ab_build.log" 2>&1; echo "main-tree build rc $? at ${SECONDS}s") &
MAX_JOBS=24 source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s"; grep "flashattn build: compiled" "$OUT/build.log"
wait
$PY -m pytest tests/test_parallel.py -m gpu -q -p no:cacheprovider -ra 2>&1 | tee "$OUT/cp_tests.log" | tail -12
echo "cp tests done at ${SECONDS}s"
$PY -m benchmarks parallel --nproc 2 --seqlens 262144,524288 --reps 2 --out "$OUT/cp" 2>&1 | tail -25
echo "x1 done at ${SECONDS}s"
