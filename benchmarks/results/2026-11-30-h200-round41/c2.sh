#!/bin/bash
# Round 41, call 2: Nsight Compute on both d256 backward kernels of main (kernels-only bf16 d256 build),
# 8k, 8k causal and 2k; per-instruction stall samples summed by scripts/ncu_stalls.py.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1 MAX_JOBS=16
export FLASHATTN_KERNELS_ONLY='sm90_fwd_bf16_hdim256*,sm90_bwd_bf16_hdim256*'
SECONDS=0
R=$OUT
for args in "256 0 8192" "256 1 8192" "256 0 2048"; do
  set -- $args
  tag=d$1-c$2-s$3
  OUT=/tmp/prof COUNT=2 timeout 240 bash scripts/profile_bwd.sh $args > "$R/$tag-details.txt" 2>&1
  echo "profile $tag rc $? at ${SECONDS}s"
  cat /tmp/prof/bwd-d$1-c$2-details.txt >> "$R/$tag-details.txt"
  cp /tmp/prof/bwd-d$1-c$2-stalls.txt "$R/$tag-stalls.txt"
  [ "$tag" = d256-c0-s8192 ] && gzip -c /tmp/prof/bwd-d$1-c$2-source.csv > "$R/$tag-source.csv.gz"
  head -40 "$R/$tag-stalls.txt"
done
echo "done at ${SECONDS}s"
