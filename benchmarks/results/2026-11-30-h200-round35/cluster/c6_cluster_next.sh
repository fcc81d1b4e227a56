#!/bin/bash
# Prepared in round 34 for the next session's first device call (not run in round 34): the clustered d256
# backward (this branch, exp/d256-cluster-multicast) against main (`git show main:...` copies of csrc/ written
# to .main_csrc before the call: `mkdir .main_csrc && git archive main csrc | tar -x -C .main_csrc`, then
# run with carry [".main_csrc"]), one call:
# both trees built in parallel in /tmp (main: d256 bf16 only; branch: every d256 instantiation), the branch
# under round 33's c1_smoke.py and compute-sanitizer memcheck and racecheck (c4_sanitize_d256.py), then
# time_bwd.py on both, twice round robin, with cuDNN in each process.
set -uo pipefail
export TORCH_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
SECONDS=0
R=benchmarks/results/2026-11-30-h200-round34
R33=benchmarks/results/2026-11-30-h200-round33
PY=$(command -v python3)
[ -d .main_csrc/csrc ] || { echo "no .main_csrc/csrc: write main's csrc there first"; exit 1; }
for t in c m; do
  mkdir -p /tmp/$t && tar --exclude=./build --exclude=./.fa3 --exclude=./.main_csrc -cf - . | tar -xf - -C /tmp/$t
done
rm -rf /tmp/m/csrc && cp -r .main_csrc/csrc /tmp/m/csrc
(cd /tmp/c && FLASHATTN_KERNELS_ONLY='sm90_*hdim256*' MAX_JOBS=10 $PY setup.py build_ext --inplace > /tmp/build_c.log 2>&1
 echo "build c rc $? at ${SECONDS}s: $(grep -o 'flashattn build: compiled.*' /tmp/build_c.log | cut -c1-160)") &
(cd /tmp/m && FLASHATTN_KERNELS_ONLY='sm90_bwd_bf16_hdim256,sm90_bwd_bf16_hdim256_local,sm90_fwd_bf16_hdim256,sm90_fwd_bf16_hdim256_local' MAX_JOBS=6 $PY setup.py build_ext --inplace > /tmp/build_m.log 2>&1
 echo "build m rc $? at ${SECONDS}s: $(grep -o 'flashattn build: compiled.*' /tmp/build_m.log | cut -c1-160)") &
wait
PYTHONPATH=/tmp/c timeout 120 $PY $R33/c1_smoke.py > "$OUT/smoke.log" 2>&1
echo "smoke rc $? at ${SECONDS}s"; grep -v ": ok$" "$OUT/smoke.log" | cut -c1-300 | tail -8
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck; do
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=/tmp/c timeout 90 $CS --tool $tool $PY $R33/c4_sanitize_d256.py > "$OUT/sanitize_$tool.log" 2>&1
  echo "$tool rc $? at ${SECONDS}s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|calls completed' "$OUT/sanitize_$tool.log" | tr '\n' ' ')"
done
for round in 1 2; do
  for t in c m; do
    flag=""; [ $round = 2 ] && flag=--no-check
    PYTHONPATH=/tmp/$t timeout 100 $PY $R/time_bwd.py $t $flag 2>&1 | tee -a "$OUT/time.log" | grep -E "^(row|check)|Error" | grep -v " ok$" | cut -c1-240
  done
  echo "round $round done at ${SECONDS}s"
done
grep "^check" "$OUT/time.log" | grep -c " ok$" | sed "s/^/checks ok: /"
