"""Regimes: a training step over batch x sequence length, flashattn's speedup over naive
attention and SDPA's flash backend next to the peak memory of each, in one table."""
from benchmarks.peak_memory import peak_memory_row
from benchmarks.shapes import BACKEND_LABELS
from benchmarks.speed import config_rows
from benchmarks.tables import MEMORY_MEASURED, fmt_bytes, fmt_num, notes_lines, write_csv
from benchmarks.timing import progress
from benchmarks.suite.report import Section, ratio_range

TITLE = "Regimes"
NEEDS_GPU = "regimes: the comparison with SDPA flash, and the GPU's times and memory"
BACKENDS = {"cuda": ("flashattn", "flash", "naive"), "cpu": ("flashattn", "naive")}


def run(ctx):
    plan = ctx.plan.regimes
    backends = BACKENDS[ctx.device]
    configs = [(f"B={b} S={s}", plan.model.shape(b, s)) for b in plan.batches for s in plan.seqlens]
    rows = []
    for _, shape in progress(configs, "regimes"):
        rows += config_rows(shape, backends, ("fwdbwd",), ctx.timers)
        rows += [peak_memory_row(shape, backend, training=True) for backend in backends]
    write_csv(rows, ctx.out / "regimes.csv")
    cells = {(r.batch, r.seqlen, r.kind, r.backend): r for r in rows}
    section = Section("regimes", TITLE, files=["regimes.csv"])
    section.failed = sum(r.backend == "flashattn" and r.status in ("error", "mismatch") for r in rows)
    section.lines = [describe(plan, ctx.device), ""] + table(plan, backends, cells) + notes_lines(rows)
    section.summary = summary(plan, backends, cells)
    return section


def describe(plan, device):
    model = plan.model
    timer = ("the forward + backward pass's timer (see the header)" if device == "cuda" else
             "time.perf_counter over 3 calls or more")
    how = f"the median of {timer}, after the gradients are checked against the reference with the tests' bound"
    return (f"A training step, out = fn(); torch.autograd.grad(out, (q, k, v), dout), H={model.heads}, "
            f"D={model.headdim}, {model.dtype}, {'causal' if model.causal else 'non-causal'}. Time: {how}. "
            "Speedup over a backend: its time / flashattn's. Peak: the inputs q, k, v, dout plus the step's peak "
            f"allocation above what was allocated before it ({MEMORY_MEASURED[model.device]}), "
            "measured on a separate step.")


def table(plan, backends, cells):
    others = [b for b in backends if b != "flashattn"]
    names = {b: BACKEND_LABELS[b] for b in backends}
    head = (["B", "S"] + [f"{names[b]} ms" for b in backends] + [f"speedup over {names[b]}" for b in others]
            + [f"{names[b]} peak" for b in backends] + ["naive / flashattn memory"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for batch in plan.batches:
        for seqlen in plan.seqlens:
            speed = {b: cells[batch, seqlen, "speed", b] for b in backends}
            memory = {b: cells[batch, seqlen, "memory", b] for b in backends}
            line = [str(batch), str(seqlen)]
            line += [fmt_num(r.median_ms, 2) if r.status == "ok" else r.status for r in speed.values()]
            line += [ratio_cell(speed[b], speed["flashattn"], "median_ms") for b in others]
            line += [fmt_bytes(r.peak_mem_bytes) if r.status == "ok" else r.status for r in memory.values()]
            line.append(ratio_cell(memory["naive"], memory["flashattn"], "peak_mem_bytes"))
            lines.append("| " + " | ".join(line) + " |")
    return lines + [""]


def ratio_cell(num, den, attr):
    ratio = ratio_of(num, den, attr)
    return "-" if ratio is None else f"{ratio:.2f}x"


def ratio_of(num, den, attr):
    if num.status != "ok" or den.status != "ok":
        return None
    return getattr(num, attr) / getattr(den, attr)


def summary(plan, backends, cells):
    keys = [(b, s) for b in plan.batches for s in plan.seqlens]
    lines = []
    for other in backends[1:]:
        ratios = [ratio_of(cells[b, s, "speed", other], cells[b, s, "speed", "flashattn"], "median_ms")
                  for b, s in keys]
        lines.append(f"a training step, flashattn's speedup over {BACKEND_LABELS[other]}: "
                     f"{ratio_range([r for r in ratios if r is not None])}")
    ratios = [ratio_of(cells[b, s, "memory", "naive"], cells[b, s, "memory", "flashattn"], "peak_mem_bytes")
              for b, s in keys]
    lines.append(f"naive's peak memory over flashattn's: {ratio_range([r for r in ratios if r is not None])}")
    oom = [f"B={b} S={s}" for b, s in keys if cells[b, s, "memory", "naive"].status == "OOM"]
    if oom:
        lines[-1] += f"; naive ran out of memory at {', '.join(oom)}"
    return lines
