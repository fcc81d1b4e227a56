#!/bin/bash
# Round 16: A/B of the sm90 forward's experiment switches (csrc/sm90/experiment.h, a temporary
# header), each variant a copy of this tree built in place (kernels-only), timed in turn in
# separate processes, 3 rounds. VARIANTS: "name:-DA=1,-DB=2 name2:-" ; SCRIPTS: the timing scripts.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R=benchmarks/results/2026-11-28-h200-round16
ONLY="${KONLY:?}"
PY=$(command -v python3)
names=()
for spec in $VARIANTS; do
  name=${spec%%:*}; defs=${spec#*:}; names+=("$name")
  rm -rf /tmp/v/$name && mkdir -p /tmp/v/$name
  { git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 -I{} cp --parents {} /tmp/v/$name/ 2>/dev/null
  cp csrc/sm90/experiment.h /tmp/v/$name/csrc/sm90/
  for d in ${defs//,/ }; do
    [ "$d" = "-" ] && continue
    k=${d#-D}; k=${k%%=*}; val=${d#*=}
    sed -i "s/^#define $k .*/#define $k $val/" /tmp/v/$name/csrc/sm90/experiment.h
  done
  ( cd /tmp/v/$name && FLASHATTN_KERNELS_ONLY="$ONLY" MAX_JOBS=${JOBS:-3} $PY setup.py build_ext --inplace > build.log 2>&1; echo "$name build rc $?" ) &
done
wait
echo "builds done at ${SECONDS}s"
for n in "${names[@]}"; do grep -h "flashattn build: compiled\|spill" /tmp/v/$n/build.log | grep -v " 0 bytes spill" | sed "s/^/$n: /" | head -5; done
for round in 1 2 3; do
  for n in "${names[@]}"; do
    for script in ${SCRIPTS:-ab_fwd.py}; do
      out=$(AB_CHECK=$([ $round = 1 ] && echo 1 || echo 0) PYTHONPATH=/tmp/v/$n $PY $R/$script 2>&1)
      if [ $round = 1 ]; then echo "== $n $script"; echo "$out" | grep -E "flashattn from|check|Error|error" | cut -c1-230; fi
      echo "$n $script round $round: $(echo "$out" | grep RATES)"
    done
  done
done
echo "done at ${SECONDS}s"
