#!/bin/bash
# Round 27, call 6 (one H200; repository root, OUT set): can the NaN-in-values test fail? A copy of
# be379d0 in /tmp/mut whose d128 transposing warps do not zero the keys past the sequence (the mask
# dropped), built kernels-only (the FP8 d128 kernels), and
# tests/test_fp8.py::test_fp8_kernel_a_nan_in_one_sequences_values_stays_there run on it: its d128
# cases must fail, its d256 ones (the copy kernel's zeros; not built here, so they error) are not read.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
mkdir -p /tmp/mut && cp -r csrc flashattn tests setup.py pyproject.toml /tmp/mut/
sed -i 's/for (int r = 0; r < 4; ++r) w\[r\] &= keep;/for (int r = 0; r < 4; ++r) w[r] \&= keep | 0xffffffffu;/' /tmp/mut/csrc/sm90/fwd_kernel.cuh
grep -c "keep | 0xffffffffu" /tmp/mut/csrc/sm90/fwd_kernel.cuh
cd /tmp/mut && FLASHATTN_KERNELS_ONLY=sm90_fwd_fp8_bf16_hdim128,sm90_fwd_fp8_bf16_hdim128_local MAX_JOBS=16 \
  python3 setup.py build_ext --inplace > "$OUT/build_mut.log" 2>&1
echo "mutant build rc $? at ${SECONDS}s"
PYTHONPATH=/tmp/mut timeout 120 python3 -m pytest "tests/test_fp8.py::test_fp8_kernel_a_nan_in_one_sequences_values_stays_there" \
  -q -p no:cacheprovider -k d128 > "$OUT/mutant_tests.log" 2>&1
echo "mutant tests rc $? at ${SECONDS}s"; grep -E "passed|failed|Error|assert" "$OUT/mutant_tests.log" | head -12
