"""Memory: peak memory against sequence length, of one forward and of a training step,
for naive attention, SDPA's flash backend and flashattn; where naive attention runs out
of memory; and on the GPU the longest sequence flashattn runs on the card at B=1 (the
probe: flashattn alone, doubling S past the sweep)."""
import sys

import torch

from benchmarks.peak_memory import memory_rows, peak_memory_row
from benchmarks.tables import fmt_bytes, memory_table, write_csv
from benchmarks.suite import plots
from benchmarks.suite.report import Section, image

TITLE = "Memory"
NEEDS_GPU = ("memory: peak CUDA memory (SDPA flash's included), the sequence length where naive attention "
             "runs out of GPU memory, and the longest sequence flashattn runs on the card (the probe)")
BACKENDS = {"cuda": ("flashattn", "flash", "naive"), "cpu": ("flashattn", "naive")}
PASSES = {"fwd": "one forward", "fwdbwd": "a training step"}


def run(ctx):
    plan = ctx.plan.memory
    capacity = torch.cuda.get_device_properties(0).total_memory if ctx.device == "cuda" else None
    section = Section("memory", TITLE, lines=[describe(plan), ""])
    rows = []
    for pass_, what in PASSES.items():
        training = pass_ == "fwdbwd"
        shapes = [plan.model.shape(1, seqlen) for seqlen in plan.seqlens]
        measured = memory_rows(shapes, BACKENDS[ctx.device], training, desc=f"memory, {what}")
        stop = None
        if plan.probe_budget_s:
            probed, stop = probe(plan, measured, training)
            measured += probed
        rows += measured
        found = findings(measured, stop, capacity)
        section.summary.append(f"{what}: " + "; ".join(found[:3]))
        section.lines += [f"{what.capitalize()}:", ""] + [f"- {line}" for line in found] + [""]
    write_csv(rows, ctx.out / "memory.csv")
    section.files.append("memory.csv")
    section.failed = sum(r.backend == "flashattn" and r.status == "error" for r in rows)
    if not ctx.plots_missing:
        path, title = draw_plot(rows, capacity, ctx)
        section.lines += [image(path, title), ""]
        section.files.append(path.name)
    section.lines += memory_table(rows, "fwd") + memory_table(rows, "fwdbwd")
    return section


def draw_plot(rows, capacity, ctx):
    """memory.png of the rows (capacity: the card's bytes, or None); returns its (path, title)."""
    path, first = ctx.out / "memory.png", rows[0]
    title = (f"Peak memory, B=1 H={first.heads} D={first.headdim} {first.dtype} "
             f"{'causal' if first.causal else 'non-causal'} (log-log)")
    plots.memory(rows, path, f"{title}\n{ctx.machine}", capacity)
    return path, title


def describe(plan):
    model = plan.model
    text = (f"B=1, H={model.heads}, D={model.headdim}, {model.dtype}, {'causal' if model.causal else 'non-causal'}; "
            f"S = {', '.join(map(str, plan.seqlens))} for every backend (one that runs out of memory is not run "
            "at longer S). Each point is one call on fresh inputs; the tables say how its peak is measured.")
    if plan.probe_budget_s:
        text += (f" Then the probe: flashattn alone, doubling S until it runs out of memory, reaches the cap "
                 f"(S = {plan.probe_max_seqlen:,}), or the next call, predicted at 4x the last one, would pass "
                 f"a budget of {plan.probe_budget_s:.0f} s of calls per pass. The probe shows that a call runs "
                 "and what it allocates; scripts/long_context.py checks the outputs at such lengths.")
    return text


def probe(plan, measured, training):
    """flashattn alone at 2x, 4x, ... the sweep's longest S: (its rows, why it stopped)."""
    last = [r for r in measured if r.backend == "flashattn"][-1]
    if last.status != "ok":
        return [], f"the probe did not start: flashattn did not run at S = {last.seqlen:,} ({last.status})"
    rows, spent = [], 0.0
    while True:
        seqlen, predicted = 2 * last.seqlen, 4 * last.call_ms / 1e3  # attention's time grows as S^2
        if seqlen > plan.probe_max_seqlen:
            return rows, f"the probe stopped at its cap, S = {plan.probe_max_seqlen:,}"
        if spent + predicted > plan.probe_budget_s:
            return rows, (f"the probe stopped before S = {seqlen:,}: about {predicted:.0f} s (4x the last call) "
                          f"is more than the {plan.probe_budget_s - spent:.0f} s left of its "
                          f"{plan.probe_budget_s:.0f} s budget")
        print(f"[memory probe] flashattn, {PASSES['fwdbwd' if training else 'fwd']}, S={seqlen}",
              file=sys.stderr, flush=True)
        last = peak_memory_row(plan.model.shape(1, seqlen), "flashattn", training)
        rows.append(last)
        if last.status != "ok":
            return rows, f"the probe stopped: {last.status} at S = {seqlen:,}"
        spent += last.call_ms / 1e3


def findings(rows, stop, capacity):
    """What the rows of one pass show, one line each: naive's limit and flashattn's
    longest run, then their ratio (the summary takes those three), then the extrapolation."""
    ran = {b: [r for r in rows if r.backend == b and r.status == "ok"] for b in ("naive", "flashattn")}
    lines = [naive_limit(rows, ran["naive"]), flashattn_longest(ran["flashattn"], stop)]
    both = sorted({r.seqlen for r in ran["naive"]} & {r.seqlen for r in ran["flashattn"]})
    if both:
        peak = {r.backend: r.peak_mem_bytes for r in ran["naive"] + ran["flashattn"] if r.seqlen == both[-1]}
        lines.append(f"at S = {both[-1]:,}, the longest both ran, naive's peak is "
                     f"{peak['naive'] / peak['flashattn']:.1f}x flashattn's")
    if capacity and len(ran["flashattn"]) >= 2:
        lines.append(extrapolation(ran["flashattn"][-2:], capacity))
    return lines


def naive_limit(rows, ran):
    oom = next((r for r in rows if r.backend == "naive" and r.status == "OOM"), None)
    longest = f"S = {ran[-1].seqlen:,} with a {fmt_bytes(ran[-1].peak_mem_bytes)} peak" if ran else None
    if oom:
        return f"naive attention runs out of memory at S = {oom.seqlen:,}" + (f" (it ran at {longest})" if ran else "")
    return f"naive attention ran at every S, up to {longest}" if ran else "naive attention did not run: see memory.csv"


def flashattn_longest(ran, stop):
    if not ran:
        return "flashattn did not run: see memory.csv"
    longest = ran[-1]
    took = f", the call took {longest.call_ms / 1e3:.2f} s" if longest.device == "cuda" else ""
    return (f"flashattn's longest run is S = {longest.seqlen:,} ({fmt_bytes(longest.peak_mem_bytes)} peak{took})"
            + (f"; {stop}" if stop else ""))


def extrapolation(last_two, capacity):
    """Where a line through flashattn's two longest runs meets the card's memory."""
    (s1, p1), (s2, p2) = [(r.seqlen, r.peak_mem_bytes) for r in last_two]
    per_token = (p2 - p1) / (s2 - s1)
    if per_token <= 0:
        return "flashattn's peak did not grow between its two longest runs: no extrapolation"
    reach = s2 + (capacity - p2) / per_token
    return (f"flashattn's peak grows by {fmt_bytes(per_token * 1024)} per 1k tokens between its two "
            f"longest runs; that line meets the card's {fmt_bytes(capacity)} ({capacity / 2**30:.1f} GiB) at "
            f"S ≈ {reach / 2**20:.1f}M tokens (an extrapolation, not a run)")
