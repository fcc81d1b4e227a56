#!/bin/bash
# Round 15: A/B of the FP8 kernel's experiment switches (csrc/sm90/experiment.h), each variant a
# copy of this tree built in place (kernels-only), timed in turn in separate processes, 3 rounds.
# VARIANTS: "name:-DA=1,-DB=2 name2:..." (the defines rewrite experiment.h's defaults).
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R=benchmarks/results/2026-11-28-h200-round15
ONLY="${KONLY:-sm90_fwd_fp8_bf16_hdim128*,sm90_fwd_fp8_bf16_hdim256*}"
PY=$(command -v python3)
names=()
for spec in $VARIANTS; do
  name=${spec%%:*}; defs=${spec#*:}; names+=("$name")
  rm -rf /tmp/v/$name && mkdir -p /tmp/v/$name
  git ls-files -z | xargs -0 -I{} cp --parents {} /tmp/v/$name/ 2>/dev/null
  cp csrc/sm90/experiment.h /tmp/v/$name/csrc/sm90/ 2>/dev/null
  for d in ${defs//,/ }; do
    [ "$d" = "-" ] && continue
    k=${d#-D}; k=${k%%=*}; val=${d#*=}
    sed -i "s/^#define $k .*/#define $k $val/" /tmp/v/$name/csrc/sm90/experiment.h
  done
  ( cd /tmp/v/$name && FLASHATTN_KERNELS_ONLY="$ONLY" MAX_JOBS=4 $PY setup.py build_ext --inplace > build.log 2>&1; echo "$name build rc $?" ) &
done
wait
echo "builds done at ${SECONDS}s"
for n in "${names[@]}"; do grep -h "flashattn build: compiled" /tmp/v/$n/build.log | sed "s/^/$n: /"; done
for round in 1 2 3; do
  for n in "${names[@]}"; do
    out=$(AB_BF16=${AB_BF16:-0} AB_CHECK=$([ $round = 1 ] && echo 1 || echo 0) PYTHONPATH=/tmp/v/$n $PY $R/ab_fp8.py 2>&1)
    if [ $round = 1 ]; then echo "== $n"; echo "$out" | grep -E "flashattn from|check|Error|error" | cut -c1-230; fi
    echo "$n round $round: $(echo "$out" | grep RATES)"
  done
done
echo "done at ${SECONDS}s"
