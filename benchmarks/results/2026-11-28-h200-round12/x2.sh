#!/bin/bash
# Round 12, second call (same machine, warm): the d128 backward A/B (main's kernel in .ab/main against
# this tree's, each process timing cuDNN too, twice in turn), compute-sanitizer over the new kernel,
# and the 1M-token ring step across both GPUs against one.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
here=benchmarks/results/2026-11-28-h200-round12
PY=${PY:-python3}
SECONDS=0
for pass in 1 2; do
  for tree in main wip; do
    echo "== $tree (pass $pass)"
    if [ $tree = main ]; then PYTHONPATH=$PWD/.ab/main $PY $here/bench_bwd.py 128; else $PY $here/bench_bwd.py 128; fi
  done
done 2>&1 | tee "$OUT/ab_bwd.log" | grep -v "^|---"
echo "a/b done at ${SECONDS}s"
for tool in memcheck synccheck racecheck; do
  compute-sanitizer --tool $tool --kernel-name kns=bwd_kernel $PY $here/san_bwd128.py > "$OUT/san_$tool.log" 2>&1
  echo "$tool rc $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|workload' "$OUT/san_$tool.log" | tr '\n' ' ')"
done
echo "sanitizer done at ${SECONDS}s"
$PY -m benchmarks parallel --nproc 2 --seqlens 1048576 --methods ring --reps 1 --out "$OUT/cp1m" 2>&1 | tail -12
echo "x2 done at ${SECONDS}s"
