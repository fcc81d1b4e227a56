#!/bin/bash
# Compares the sm90 forward (PASS=bwd: the backward) of several commits in one GPU run (a regression's
# bisect, or an A/B of a change against its base):
#
#   scripts/bisect_fwd.sh DIR REV...      # here: writes DIR/<rev>/ for each REV (git archive + this setup.py)
#   OUT=results bash scripts/bisect_fwd.sh DIR   # on the GPU machine: builds each tree, times them, twice
#
# Each tree is built in place with FLASHATTN_KERNELS_ONLY (default: the d128 bf16 forward, causal and
# not; ONLY=... for others), five trees in about 45 s on 16 cores, then scripts/bisect_fwd.py times
# each tree in turn (DIMS=64,128: the head dims, default 128), the whole sweep twice. Rows go to
# $OUT/bisect.jsonl. PASS=bwd times the backward; ONLY must then name the forward's instantiations
# too (the backward needs an output; causal runs the _local instantiations): e.g.
# ONLY=sm90_fwd_bf16_hdim128,sm90_fwd_bf16_hdim128_local,sm90_bwd_bf16_hdim128,sm90_bwd_bf16_hdim128_local.
# PASS=fp8 times the FP8 forward against the tree's bf16 forward: ONLY names both, e.g.
# ONLY=sm90_fwd_fp8_bf16_hdim128,sm90_fwd_fp8_bf16_hdim128_local,sm90_fwd_bf16_hdim128,sm90_fwd_bf16_hdim128_local.
set -o pipefail
dir=$1; shift
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ $# -gt 0 ]; then
  for rev in "$@"; do
    name=$(git -C "$here" rev-parse --short "$rev") || exit 1
    mkdir -p "$dir/$name" && git -C "$here" archive "$rev" csrc flashattn setup.py pyproject.toml | tar -x -C "$dir/$name" &&
      cp "$here/setup.py" "$dir/$name/" || exit 1
  done
  exit 0
fi
: "${OUT:?set OUT to the folder for the logs and rows}"
dir="$(cd "$dir" && pwd)" || exit 1
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=${JOBS:-4}
export FLASHATTN_KERNELS_ONLY="${ONLY:-sm90_fwd_bf16_hdim128,sm90_fwd_bf16_hdim128_local}"
started=$SECONDS
for tree in "$dir"/*/; do
  name=$(basename "$tree")
  ( cd "$tree" && python3 setup.py build_ext --inplace > "$OUT/build_$name.log" 2>&1
    echo "$name: build rc $?, $((SECONDS - started)) s" ) &
done
wait
for pass in 1 2; do
  for tree in "$dir"/*/; do
    (cd / && PYTHONPATH="$(cd "$tree" && pwd)" python3 "$here/scripts/bisect_fwd.py" "$(basename "$tree")" "${DIMS:-128}" "${PASS:-fwd}") >> "$OUT/bisect.jsonl"
  done
done
