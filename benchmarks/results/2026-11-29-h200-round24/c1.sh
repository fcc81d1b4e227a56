#!/bin/bash
# Round 24, call 1 (one H200; repository root, OUT set; carry build/ab25): the deterministic grid's
# run rule, three trees: main (3cca26e, whole pairs), rule (next/det-runs-rule f2cafb5: runs of 512
# keys without a mask where tiles x 4 <= SMs), quarter (next/det-quarter: runs of a quarter of the
# tiles without a mask). Set up here first:
#   rm -rf build/ab25 && for t in main:base next/det-runs-rule:rule next/det-quarter:quarter; do
#     mkdir -p build/ab25/${t#*:}; git archive ${t%:*} csrc flashattn setup.py pyproject.toml | tar -x -C build/ab25/${t#*:}; done
# Kernels-only builds; det_ab.py times both modes in each tree, alternated, twice; the digests must be
# equal across trees (the order of adds is the same). Then the quarter tree's repeatability tests.
set -uo pipefail
export CUDA_HOME=/usr/local/cuda TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=5 PYTHONUNBUFFERED=1
SECONDS=0
here=$PWD
trees="base rule quarter"
pats=""
for d in hdim64 hdim128 hdim192 hdim192_v128 hdim256; do
  pats="$pats,sm90_fwd_bf16_${d},sm90_fwd_bf16_${d}_local"
  for x in "" _det _local _local_det; do pats="$pats,sm90_bwd_bf16_${d}${x}"; done
done
export FLASHATTN_KERNELS_ONLY="${pats#,}"
for tree in $trees; do
  ( cd build/ab25/$tree && python3 setup.py build_ext --inplace > "$OUT/build_$tree.log" 2>&1; echo "$tree build rc $? at ${SECONDS}s" ) &
done
wait
for pass in 1 2; do
  for tree in $trees; do
    (cd / && PYTHONPATH="$here/build/ab25/$tree" timeout 150 python3 "$here/benchmarks/results/2026-11-29-h200-round24/det_ab.py" $tree) >> "$OUT/det_ab.jsonl" 2> "$OUT/det_ab_$tree.err"
    echo "$tree pass $pass at ${SECONDS}s"; tail -2 "$OUT/det_ab_$tree.err"
  done
done
python3 - "$OUT/det_ab.jsonl" $trees <<'PY'
import json, sys, collections
rows = [json.loads(l) for l in open(sys.argv[1])]
labels = sys.argv[2:]
sha = collections.defaultdict(set)
t = collections.defaultdict(list)
for r in rows:
    if "sha" in r: sha[r["digest"]].add(r["sha"])
    else: t[(r["d"], r["dv"], r["seqlen"], r["causal"], r["label"])].append(r)
print("digests equal across trees and passes:", all(len(v) == 1 for v in sha.values()), {k: len(v) for k, v in sha.items()})
for key in sorted({k[:4] for k in t}):
    cells = [lab + " " + "/".join(f"{r['det_over_default']:.3f}" for r in t[key + (lab,)]) for lab in labels]
    print(f"d{key[0]}/{key[1]} S{key[2]} c={int(key[3])} def {t[key + (labels[0],)][0]['default_tflops']:.0f}: " + " | ".join(cells))
PY
cp -r "$here/tests" "$here/build/ab25/quarter/" && cd "$here/build/ab25/quarter" && PYTHONPATH=$PWD timeout 120 python3 -m pytest tests/test_repeatability.py -q -p no:cacheprovider -k "deterministic and not fp16 and not window and not local" > "$OUT/tests.log" 2>&1
echo "tests rc $? at ${SECONDS}s"; tail -3 "$OUT/tests.log"
