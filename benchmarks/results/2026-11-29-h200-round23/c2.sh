#!/bin/bash
# Round 23, call 2 (one H200; repository root, OUT set): deterministic=True's grid in runs across the
# (KV head, batch) pairs (BwdWork, det_run), with the A/B-only FLASHATTN_AB_DET_RUN override in the
# launcher. A kernels-only build (bf16 forward and backward, d64/128/192/MLA/256, no
# softcap; causal is the local kernels); det_runs.py (time by run length, bitwise equality across run lengths); the deterministic
# repeatability and which-family tests; test_backward_gpu's deterministic cases at d128 and d192.
set -uo pipefail
export CUDA_HOME=/usr/local/cuda TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 PYTHONUNBUFFERED=1
SECONDS=0
here=$PWD
export FLASHATTN_KERNELS_ONLY="sm90_fwd_bf16_hdim64,sm90_fwd_bf16_hdim64_local,sm90_fwd_bf16_hdim128,sm90_fwd_bf16_hdim128_local,sm90_fwd_bf16_hdim192,sm90_fwd_bf16_hdim192_local,sm90_fwd_bf16_hdim192_v128,sm90_fwd_bf16_hdim192_v128_local,sm90_fwd_bf16_hdim256,sm90_fwd_bf16_hdim256_local,sm90_bwd_bf16_hdim64,sm90_bwd_bf16_hdim64_det,sm90_bwd_bf16_hdim64_local,sm90_bwd_bf16_hdim64_local_det,sm90_bwd_bf16_hdim128,sm90_bwd_bf16_hdim128_det,sm90_bwd_bf16_hdim128_local,sm90_bwd_bf16_hdim128_local_det,sm90_bwd_bf16_hdim192,sm90_bwd_bf16_hdim192_det,sm90_bwd_bf16_hdim192_local,sm90_bwd_bf16_hdim192_local_det,sm90_bwd_bf16_hdim192_v128,sm90_bwd_bf16_hdim192_v128_det,sm90_bwd_bf16_hdim192_v128_local,sm90_bwd_bf16_hdim192_v128_local_det,sm90_bwd_bf16_hdim256,sm90_bwd_bf16_hdim256_det,sm90_bwd_bf16_hdim256_local,sm90_bwd_bf16_hdim256_local_det"
python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build rc $? at ${SECONDS}s"
grep "flashattn build: compiled\|KERNELS_ONLY" "$OUT/build.log" | cut -c1-200
export PYTHONPATH=$here
(cd / && timeout 200 python3 "$here/benchmarks/results/2026-11-29-h200-round23/det_runs.py") 2>&1 | tee "$OUT/det_runs.txt"
echo "det_runs at ${SECONDS}s"
timeout 150 python3 -m pytest tests/test_repeatability.py tests/test_family.py tests/test_backward.py -q -p no:cacheprovider \
  -k "(deterministic and not local and not softcap and not window and not fp16 and not float16) and (test_repeat or test_family or d128 or d192 or mla or d64)" \
  > "$OUT/tests.log" 2>&1
echo "tests rc $? at ${SECONDS}s"; tail -4 "$OUT/tests.log"
