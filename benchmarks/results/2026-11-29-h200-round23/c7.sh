#!/bin/bash
# Round 23, call 7 (one H200; repository root, OUT set; carry build/ab24): branch next/det-runs-rule
# (be462c0 then: the deterministic grid in runs of 512 keys without a mask where four or more whole
# pairs start together) against main (5f9ad8c). Also the next session's first call, with the branch's
# head (f2cafb5: the tile worked out once a block) as the new tree. Set up here first:
#   rm -rf build/ab24 && mkdir -p build/ab24/base build/ab24/new
#   git archive main csrc flashattn setup.py pyproject.toml | tar -x -C build/ab24/base
#   git archive next/det-runs-rule csrc flashattn setup.py pyproject.toml | tar -x -C build/ab24/new
# Each tree built with the kernels below only; det_ab.py times both modes in each tree, alternated,
# twice; its digests must be equal across trees (the order of adds is the same). Then the new tree's
# deterministic repeatability tests. About 3 minutes. If it wins, merge the branch and run c5.sh
# (full build, suite, sanitizer, racecheck: about 7.5 minutes).
set -uo pipefail
export CUDA_HOME=/usr/local/cuda TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=8 PYTHONUNBUFFERED=1
SECONDS=0
here=$PWD
pats=""
for d in hdim64 hdim128 hdim192 hdim192_v128 hdim256; do
  pats="$pats,sm90_fwd_bf16_${d},sm90_fwd_bf16_${d}_local"
  for x in "" _det _local _local_det; do pats="$pats,sm90_bwd_bf16_${d}${x}"; done
done
export FLASHATTN_KERNELS_ONLY="${pats#,}"
for tree in base new; do
  ( cd build/ab24/$tree && python3 setup.py build_ext --inplace > "$OUT/build_$tree.log" 2>&1; echo "$tree build rc $? at ${SECONDS}s" ) &
done
wait
grep -h "flashattn build: compiled" "$OUT"/build_*.log | cut -c1-120
for pass in 1 2; do
  for tree in base new; do
    (cd / && PYTHONPATH="$here/build/ab24/$tree" timeout 120 python3 "$here/benchmarks/results/2026-11-29-h200-round23/det_ab.py" $tree) >> "$OUT/det_ab.jsonl" 2> "$OUT/det_ab_$tree.err"
    echo "$tree pass $pass at ${SECONDS}s"; tail -2 "$OUT/det_ab_$tree.err"
  done
done
python3 - "$OUT/det_ab.jsonl" <<'PY'
import json, sys, collections
rows = [json.loads(l) for l in open(sys.argv[1])]
sha = collections.defaultdict(set)
t = collections.defaultdict(list)
for r in rows:
    if "sha" in r: sha[r["digest"]].add(r["sha"])
    else: t[(r["d"], r["dv"], r["seqlen"], r["causal"], r["label"])].append(r)
print("digests equal across trees and passes:", all(len(v) == 1 for v in sha.values()), {k: len(v) for k, v in sha.items()})
for key in sorted({k[:4] for k in t}):
    cells = []
    for lab in ("base", "new"):
        rs = t[key + (lab,)]
        cells.append(f"{lab} det/def " + "/".join(f"{r['det_over_default']:.3f}" for r in rs) + " def " + "/".join(f"{r['default_tflops']:.0f}" for r in rs))
    print(f"d{key[0]}/{key[1]} S{key[2]} causal={int(key[3])}: " + " | ".join(cells))
PY
cp -r "$here/tests" "$here/build/ab24/new/" && cd "$here/build/ab24/new" && PYTHONPATH=$PWD timeout 120 python3 -m pytest tests/test_repeatability.py -q -p no:cacheprovider -k "deterministic and not fp16 and not window and not local" > "$OUT/tests.log" 2>&1
echo "tests rc $? at ${SECONDS}s"; tail -3 "$OUT/tests.log"
