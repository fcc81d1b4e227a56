"""Each tree's best TFLOP/s over a bisect.jsonl's passes, per shape, and its ratio to the tree "base"."""
import collections
import json
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
best = collections.defaultdict(dict)
for r in rows:
    key = (r["D"], r["S"], r["causal"])
    best[key][r["label"]] = max(best[key].get(r["label"], 0), r["ours_tflops"])
for key, v in sorted(best.items()):
    base = v.get("base", 1)
    print(key, " ".join(f"{k} {t} ({t / base:.3f})" for k, t in sorted(v.items())))
