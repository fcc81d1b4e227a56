"""Results as files: the CSV of Rows (written, and read back for plots) and their Markdown tables."""
import csv
import re
from dataclasses import fields

import torch

from benchmarks.shapes import CPU_BACKENDS, DTYPES, GPU_BACKENDS, PASS_TITLES, PASSES, Row
from flashattn.testing import PASS_FLOP_FACTORS

MEMORY_MEASURED = {
    "cuda": "torch.cuda.max_memory_allocated after a reset",
    "cpu": "the high-water mark of torch's CPU allocator, from the allocations and frees that "
           "torch.profiler records with profile_memory=True",
}

_NAMES = ["kind"] + [f.name for f in fields(Row) if f.name != "kind"]  # the committed CSVs' column order
_COLUMNS = {n: n.rstrip("_") for n in _NAMES}  # Row.pass_ is the column "pass"


def write_csv(rows, path):
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(_COLUMNS.values()))
        writer.writeheader()
        for row in rows:
            record = {n: getattr(row, n) for n in _NAMES}
            for key in ("median_ms", "tflops", "call_ms"):
                if record[key] is not None:
                    record[key] = f"{record[key]:.4f}"
            if record["max_abs_diff"] is not None:
                record["max_abs_diff"] = f"{record['max_abs_diff']:.3e}"
            writer.writerow({_COLUMNS[n]: value for n, value in record.items()})


def read_csv(path):
    """The Rows of a CSV that write_csv wrote."""
    types = {f.name: f.type for f in fields(Row)}

    def value(name, text):
        if text == "" and name not in ("notes", "status"):
            return None
        if types[name] == "bool":
            return text == "True"
        if "int" in types[name]:
            return int(text)
        return float(text) if "float" in types[name] else text

    with open(path, newline="") as fh:
        return [Row(**{n: value(n, record[_COLUMNS[n]]) for n in _NAMES}) for record in csv.DictReader(fh)]


def fmt_num(value, digits=1):
    return "" if value is None else f"{value:.{digits}f}"


def fmt_bytes(n):
    if n is None:
        return "-"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def table_lines(head):
    """A Markdown table's head and rule."""
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]


def speed_cell(row, unit_scale=1.0):
    if row is None:
        return "-"
    return fmt_num(row.tflops * unit_scale) if row.status == "ok" else row.status


def ratio_cell(num, den):
    if num is None or den is None or num.status != "ok" or den.status != "ok":
        return "-"
    return f"{num.tflops / den.tflops:.2f}"


def speed_tables(rows, device):
    """One table per (dtype, pass); a run of the forward alone keeps its titles
    unmarked, others say each pass's FLOP multiplier."""
    speed = [r for r in rows if r.kind == "speed"]
    lines = []
    backends = GPU_BACKENDS if device == "cuda" else CPU_BACKENDS
    present = [b for b in backends if any(r.backend == b for r in speed)]
    passes = [p for p in PASSES if any(r.pass_ == p for r in speed)]
    unit, scale = ("TFLOP/s", 1.0) if device == "cuda" else ("GFLOP/s", 1e3)
    tables = [(dtype, pass_) for dtype in dict.fromkeys(r.dtype for r in speed) for pass_ in passes]
    for dtype, pass_ in tables:
        by_config = {}
        for r in speed:
            if r.dtype == dtype and r.pass_ == pass_:
                by_config.setdefault((r.causal, r.headdim, r.seqlen), {})[r.backend] = r
        if not by_config:
            continue
        head = ["causal", "D", "S", "B x H"] + present
        # FlashAttention-4 and -3 get a ratio column where they ran at least once.
        others = [b for b in ("fa4", "fa3") if any(r.backend == b and r.tflops for r in speed)]
        head += (["flashattn/flash", "flashattn/cudnn"] + [f"flashattn/{b}" for b in others]
                 if device == "cuda" else ["flashattn ms", "naive ms"])
        title = PASS_TITLES[pass_]
        if passes != ["fwd"]:
            title += f" (FLOPs x{PASS_FLOP_FACTORS[pass_]:g})"
        lines += [f"### {dtype} {title}, {unit}", ""] + table_lines(head)
        for (causal, d, s), cells in sorted(by_config.items()):
            any_row = next(iter(cells.values()))
            line = [str(causal).lower(), str(d), str(s), f"{any_row.batch} x {any_row.heads}"]
            line += [speed_cell(cells.get(b), scale) for b in present]
            if device == "cuda":
                fa = cells.get("flashattn")
                line += [ratio_cell(fa, cells.get("flash")), ratio_cell(fa, cells.get("cudnn"))]
                line += [ratio_cell(fa, cells.get(b)) for b in others]
            else:
                line += [fmt_num(cells[b].median_ms, 2) if b in cells and cells[b].median_ms else "-"
                         for b in ("flashattn", "naive")]
            lines.append("| " + " | ".join(line) + " |")
        lines.append("")
    return lines


def memory_table(rows, pass_):
    """The peak-memory table of one forward (pass_ "fwd") or of a training step
    ("fwdbwd"): a row per S, an 'extra' and a 'peak' column per backend."""
    mem = [r for r in rows if r.kind == "memory" and r.pass_ == pass_]
    if not mem:
        return []
    backends = [b for b in GPU_BACKENDS if any(r.backend == b for r in mem)]
    by_seqlen = {}
    for r in mem:
        by_seqlen.setdefault(r.seqlen, {})[r.backend] = r
    first = mem[0]
    what, tensors = (("one forward", ["q", "k", "v"]) if pass_ == "fwd" else
                     ("a training step, out = fn(); torch.autograd.grad(out, (q, k, v), dout)",
                      ["q", "k", "v", "dout"]))
    head = ["S", "inputs " + "+".join(tensors)]
    for b in backends:
        head += [f"{b} extra", f"{b} peak"] + (["flashattn peak / previous"] if b == "flashattn" else [])
    lines = [f"### Peak memory of {what} (B={first.batch}, H={first.heads}, D={first.headdim}, {first.dtype}, "
             f"{'causal' if first.causal else 'non-causal'})", "",
             f"Measured: {MEMORY_MEASURED[first.device]}. 'extra' is the call's peak above what was allocated "
             f"before it; 'peak' adds the inputs {', '.join(tensors)}. Memory grows linearly where "
             "'peak / previous' equals the ratio of the S.", ""] + table_lines(head)
    itemsize = torch.finfo(DTYPES[first.dtype]).bits // 8
    previous = None  # (S, flashattn's peak) of the row above
    for s, cells in sorted(by_seqlen.items()):
        line = [str(s), fmt_bytes(len(tensors) * first.batch * first.heads * s * first.headdim * itemsize)]
        for b in backends:
            r = cells.get(b)
            if r is None:
                line += ["-", "-"]
            elif r.status != "ok":
                line += [r.status, r.status]
            else:
                line += [fmt_bytes(r.extra_mem_bytes), fmt_bytes(r.peak_mem_bytes)]
            if b == "flashattn":
                peak = r.peak_mem_bytes if r is not None and r.status == "ok" else None
                line.append(f"{peak / previous[1]:.2f} (S x{s / previous[0]:g})"
                            if peak and previous and previous[1] else "-")
                previous = (s, peak)
        lines.append("| " + " | ".join(line) + " |")
    return lines + [""]


def notes_lines(rows):
    """Distinct reasons for n/a, errors and mismatches, so the tables stay narrow."""
    seen = {}
    for r in rows:
        if r.status in ("n/a", "error", "mismatch") and r.notes:
            # Group notes that differ only in their numbers; show the first one.
            key = (r.backend, r.status, re.sub(r"[-+.\deE]*\d", "#", r.notes))
            pass_ = "" if r.pass_ == "fwd" else f" {PASS_TITLES[r.pass_]}"
            where = f"{r.dtype}{pass_} causal={str(r.causal).lower()} D={r.headdim} S={r.seqlen}"
            seen.setdefault(key, (r.notes, []))[1].append(where)
    if not seen:
        return []
    lines = ["### Notes", ""]
    for (backend, status, _), (note, where) in seen.items():
        shown = ", ".join(where[:4]) + (f" and {len(where) - 4} more" if len(where) > 4 else "")
        lines.append(f"- {backend} {status} ({shown}): {note}")
    return lines + [""]
