#!/bin/bash
# FlashAttention-3 (Dao-AILab/flash-attention's hopper/, C++ and CUTLASS) as a same-run baseline for
# the FP8 forward (issue 20: FlashAttention-4's sm90 code has no FP8) and the bf16 backward. No
# dependency and no copy of its code in this repository: its sources sit in the ignored .fa3/src
# (hopper/ and CUTLASS's include/ at the commit its submodule names; FA3_COMMIT and CUTLASS_COMMIT
# there say which), and this script compiles a handful of its kernel instantiations with
# benchmarks/fa3_driver.cu, our C entry points that fill its parameter struct, into .fa3/lib/libfa3.so.
# That library links no torch (the GPU machine's torch differs from this one's), so it is built
# here, without a GPU, and carried to the GPU machine, where benchmarks/backends.py:flash_attention_3
# loads it with ctypes (FLASHATTN_FA3_LIB names it).
#
#   bash scripts/stage_fa3.sh            # build .fa3/lib/libfa3.so (about 8 minutes on 2 cores)
#   FA3_UNITS="flash_fwd_hdim256_bf16_sm90 flash_bwd_hdim256_bf16_sm90" bash scripts/stage_fa3.sh
#                                        # only those (a minute or two); other calls are refused
#
# The sources, on a machine with the network (round 32 used these commits):
#   git clone https://github.com/Dao-AILab/flash-attention fa && git -C fa checkout 0251105a
#   git clone https://github.com/NVIDIA/cutlass && git -C cutlass checkout 71275920
#   mkdir -p .fa3/src/cutlass && cp -r fa/hopper .fa3/src/ && cp -r cutlass/include .fa3/src/cutlass/
# An object already in .fa3/build is kept: delete the folder after changing the flags below.
#
# Only the dense, non-varlen, non-split calls are compiled (FA3's own switches turn the others off;
# they do not change which kernel a dense call runs). ptxas is CUDA 13.0's, the one our kernels use
# (FA3's setup.py prefers ptxas 12.8).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SRC=$ROOT/.fa3/src
OUT=$ROOT/.fa3/build
LIB=$ROOT/.fa3/lib
NVCC=${CUDA_HOME:-/usr/local/cuda}/bin/nvcc
[ -d "$SRC/hopper" ] && [ -d "$SRC/cutlass/include" ] ||
  { echo "stage_fa3: no FA3 sources in $SRC (hopper/ and cutlass/include/)" >&2; exit 1; }
mkdir -p "$OUT" "$LIB"
# FA3's nvcc flags, with the ones torch's extension builder adds to every CUDA file.
FLAGS=(-std=c++17 -O3 --use_fast_math -DNDEBUG -Xcompiler -fPIC --expt-relaxed-constexpr
       -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ -D__CUDA_NO_BFLOAT16_CONVERSIONS__
       -D__CUDA_NO_HALF2_OPERATORS__
       -gencode=arch=compute_90a,code=sm_90a
       -DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED -DCUTLASS_ENABLE_GDC_FOR_SM90 -DCUTLASS_DEBUG_TRACE_LEVEL=0
       -DFLASHATTENTION_DISABLE_VARLEN -DFLASHATTENTION_DISABLE_LOCAL -DFLASHATTENTION_DISABLE_APPENDKV
       -DFLASHATTENTION_DISABLE_SOFTCAP -DFLASHATTENTION_DISABLE_PAGEDKV -DFLASHATTENTION_DISABLE_SPLIT
       -DFLASHATTENTION_DISABLE_PACKGQA -DFLASHATTENTION_DISABLE_SM8x
       -DFLASHATTENTION_DISABLE_HDIMDIFF64 -DFLASHATTENTION_DISABLE_HDIMDIFF192
       -I"$SRC/hopper" -I"$SRC/cutlass/include")
UNITS=${FA3_UNITS:-"flash_fwd_hdim64_e4m3_sm90 flash_fwd_hdim128_e4m3_sm90 flash_fwd_hdim256_e4m3_sm90
  flash_fwd_hdim64_bf16_sm90 flash_fwd_hdim128_bf16_sm90 flash_fwd_hdim256_bf16_sm90
  flash_bwd_hdim64_bf16_sm90 flash_bwd_hdim128_bf16_sm90 flash_bwd_hdim256_bf16_sm90"}
objects=()
for unit in $UNITS; do
  obj=$OUT/$unit.o
  objects+=("$obj")
  [ -f "$obj" ] && continue
  echo "stage_fa3: $unit" >&2
  "$NVCC" "${FLAGS[@]}" -c "$SRC/hopper/instantiations/$unit.cu" -o "$obj" &
  while [ "$(jobs -rp | wc -l)" -ge "${MAX_JOBS:-2}" ]; do wait -n; done
done
wait
for obj in "${objects[@]}"; do  # a unit that failed in the last batch: wait alone does not say
  [ -f "$obj" ] || { echo "stage_fa3: $(basename "$obj" .o) did not compile" >&2; exit 1; }
done
# The driver calls only the units linked here (FA3_HAVE_<unit>); for another head dim or dtype it
# returns cudaErrorNotSupported, which benchmarks/backends.py raises as a RuntimeError.
have=()
for unit in $UNITS; do have+=("-DFA3_HAVE_$unit"); done
"$NVCC" "${FLAGS[@]}" "${have[@]}" -c "$ROOT/benchmarks/fa3_driver.cu" -o "$OUT/fa3_driver.o"
"$NVCC" -shared -gencode=arch=compute_90a,code=sm_90a -o "$LIB/libfa3.so" "$OUT/fa3_driver.o" "${objects[@]}"
echo "$LIB/libfa3.so"
