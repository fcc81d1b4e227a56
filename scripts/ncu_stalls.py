"""Where a kernel's warps wait, from Nsight Compute's SASS source page exported as CSV
(scripts/profile_bwd.sh writes it: `ncu --import R --page source --csv --print-source sass`).

    python scripts/ncu_stalls.py SOURCE.csv [TOP]

For each kernel in the file: its warp-state samples by stall reason (the samples no reason
column claims are the HGMMA's own wait, which this ncu reports under no reason), the shared
memory wavefronts by instruction class (HGMMA operand reads, STS, LDS, STSM: what the L1/TEX
throughput is made of), and the TOP instructions (default 25) by samples with their three
largest reasons.
"""

import collections
import csv
import sys


def kernels(path: str):
    """(name, header, rows) per kernel: each kernel's block starts with a "Kernel Name" row."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    i = 0
    while i < len(rows):
        if rows[i] and rows[i][0] == "Kernel Name":
            name, header, body = rows[i][1], rows[i + 1], []
            i += 2
            while i < len(rows) and not (rows[i] and rows[i][0] == "Kernel Name"):
                body.append(rows[i])
                i += 1
            yield name, header, body
        else:
            i += 1


def number(text: str) -> float:
    try:
        return float(text.replace(",", "")) if text else 0.0
    except ValueError:
        return 0.0


def opcode(source: str) -> str:
    words = source.split()
    if words and words[0].startswith("@"):  # a predicate
        words = words[1:]
    return words[0] if words else ""


def main(path: str, top: int) -> None:
    for name, header, body in kernels(path):
        col = {h: j for j, h in enumerate(header)}
        reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
        by_reason, smem, total = collections.Counter(), collections.defaultdict(lambda: [0, 0.0]), 0
        for r in body:
            samples = int(number(r[col["Warp Stall Sampling (All Samples)"]]))
            total += samples
            claimed = 0
            for h in reasons:
                v = int(number(r[col[h]]))
                by_reason[h[len("stall_"):]] += v
                claimed += v
            by_reason["(unclaimed: HGMMA)"] += samples - claimed
            op = opcode(r[col["Source"]])
            wavefronts = number(r[col["L1 Wavefronts Shared"]]) if "L1 Wavefronts Shared" in col else 0.0
            if wavefronts:
                cls = op.split(".")[0] if not op.startswith("HGMMA") else op.split(".")[0] + "." + op.split(".")[1]
                smem[cls][0] += int(number(r[col["Instructions Executed"]]))
                smem[cls][1] += wavefronts
        print(f"{name[:140]}\n  samples {total}")
        for reason, v in by_reason.most_common(12):
            print(f"    {reason:24s} {v:10d} {100 * v / max(total, 1):5.1f}%")
        all_wavefronts = sum(w for _, w in smem.values())
        print(f"  shared-memory wavefronts {all_wavefronts:.4g}")
        for cls, (executed, w) in sorted(smem.items(), key=lambda kv: -kv[1][1]):
            print(f"    {cls:24s} {w:12.4g} ({100 * w / all_wavefronts:4.1f}%), {w / max(executed, 1):.1f} per warp instruction")
        print(f"  top {top} instructions by samples")
        ranked = sorted(body, key=lambda r: -number(r[col["Warp Stall Sampling (All Samples)"]]))[:top]
        for r in ranked:
            samples = int(number(r[col["Warp Stall Sampling (All Samples)"]]))
            three = sorted(((int(number(r[col[h]])), h[len("stall_"):]) for h in reasons), reverse=True)[:3]
            print(f"    {r[0]:>16s} {100 * samples / max(total, 1):5.1f}%  {r[col['Source']].strip()[:64]:64s} "
                  + ", ".join(f"{n} {v}" for v, n in three))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 25)
