#!/bin/bash
# Round 12, last call, on 2 (or 4) H200s of one host (run from the repository root, OUT set): a kernels-only
# build (the sm80 d32 kernels the tests' small head dims run on, the sm90 d128 ones the benchmark runs),
# tests/test_parallel.py's GPU cases (NCCL over 2 and 4 GPUs, 2 processes on one GPU over gloo), then
# the context-parallel benchmark at 128k on 2 GPUs and, where there are 4, 128k-512k on 4 (this round:
# no 4-GPU machine was lent when it ran, so it ran on 2).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda MAX_JOBS=$(nproc)
export FLASHATTN_KERNELS_ONLY='sm80_fwd_*hdim32*,sm80_bwd_*hdim32*,sm90_fwd_bf16_hdim128*,sm90_bwd_bf16_hdim128*'
SECONDS=0
nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c
source scripts/env.sh > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build done at ${SECONDS}s"
$PY -m pytest tests/test_parallel.py -m gpu -q -p no:cacheprovider -ra 2>&1 | tee "$OUT/cp_tests.log" | tail -6
echo "tests done at ${SECONDS}s"
$PY -m benchmarks parallel --nproc 2 --seqlens 131072 --reps 2 --out "$OUT/cp2" 2>&1 | grep "^|"
echo "2-GPU bench done at ${SECONDS}s"
[ "$($PY -c "import torch; print(torch.cuda.device_count())")" -ge 4 ] && $PY -m benchmarks parallel --nproc 4 --seqlens 131072,262144,524288 --reps 2 --out "$OUT/cp4" 2>&1 | grep "^|"
echo "x3 done at ${SECONDS}s"
