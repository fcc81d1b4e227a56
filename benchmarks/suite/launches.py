"""Kernel launches: what one training step of naive attention and of flashattn runs on
the GPU, from torch.profiler: how many kernels, their summed time, the top kernels."""
import csv
import math
import re
from dataclasses import dataclass, field

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from benchmarks.backends import backend_fns, free_cuda_memory, grad_leaves, grad_step
from benchmarks.shapes import BACKEND_LABELS
from benchmarks.timing import progress
from benchmarks.suite.report import Section

TITLE = "Kernel launches"
NEEDS_GPU = "profile: CUDA kernel launches and time per kernel of a training step (torch.profiler)"
BACKENDS = ("naive", "flashattn")
WARMUP_STEPS = 2  # first calls load modules, create cuBLAS handles and grow the allocator's pool
TOP_KERNELS = 5


@dataclass
class GpuWork:
    """What a profiled call ran on the GPU, per name: {name: [calls, total microseconds]}."""
    kernels: dict = field(default_factory=dict)
    copies: dict = field(default_factory=dict)  # memcpy and memset

    def add(self, name, microseconds):
        table = self.copies if name.startswith(("Memcpy", "Memset")) else self.kernels
        calls_and_time = table.setdefault(name, [0, 0.0])
        calls_and_time[0] += 1
        calls_and_time[1] += microseconds


def calls(table):
    return sum(n for n, _ in table.values())


def milliseconds(table):
    return sum(us for _, us in table.values()) / 1e3


def run(ctx):
    section = Section("profile", TITLE)
    shape = ctx.plan.profile
    if shape is None:
        section.lines = ["Not run: it profiles CUDA kernels, and needs a GPU.", ""]
        section.summary = ["not run: needs a GPU"]
        return section
    work = {backend: profile_training_step(shape, backend) for _, backend in
            progress([(BACKEND_LABELS[b], b) for b in BACKENDS], "profile")}
    write_csv(work, ctx.out / "launches.csv")
    section.files.append("launches.csv")
    section.lines = [describe(shape), ""] + totals_table(work) + top_kernels_table(work)
    section.summary = [f"a training step ({shape.label}): " + "; ".join(
        f"{BACKEND_LABELS[b]} launches {calls(w.kernels)} kernels, {milliseconds(w.kernels):.2f} ms "
        "of kernel time" for b, w in work.items())]
    return section


def profile_training_step(shape, backend):
    """The GPU work of one out = fn(); torch.autograd.grad(out, (q, k, v), dout), after warm-up steps."""
    q, k, v, dout = shape.inputs(count=4)
    inputs = grad_leaves((q, k, v))
    fns, contexts = backend_fns(*inputs, shape.causal, 1.0 / math.sqrt(shape.headdim))
    step = grad_step(fns[backend], inputs, dout, "fwdbwd")
    with contexts[backend]():
        for _ in range(WARMUP_STEPS):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
    work = GpuWork()
    for event in prof.events():
        if event.device_type == DeviceType.CUDA and not event.is_user_annotation:
            work.add(event.name, event.time_range.elapsed_us())
    free_cuda_memory()
    return work


def describe(shape):
    return (f"One training step, out = fn(); torch.autograd.grad(out, (q, k, v), dout), at {shape.label}, "
            f"profiled with torch.profiler (CPU and CUDA activities) after {WARMUP_STEPS} warm-up steps. "
            "Kernels: the GPU kernels the step ran, one launch each; kernel time: the sum of their durations "
            "on the GPU (not the step's wall time); memcpy/memset are counted apart. All kernels: launches.csv.")


def totals_table(work):
    names = [BACKEND_LABELS[b] for b in work]
    lines = ["| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    rows = (("kernels launched", lambda w: str(calls(w.kernels))),
            ("kernel time, ms", lambda w: f"{milliseconds(w.kernels):.3f}"),
            ("memcpy + memset", lambda w: f"{calls(w.copies)} ({milliseconds(w.copies):.3f} ms)"),
            ("distinct kernels", lambda w: str(len(w.kernels))))
    for title, cell in rows:
        lines.append(f"| {title} | " + " | ".join(cell(w) for w in work.values()) + " |")
    return lines + [""]


def top_kernels_table(work):
    lines = [f"Top {TOP_KERNELS} kernels by time:", "", "| backend | kernel | calls | ms | share of kernel time |",
             "|---|---|---|---|---|"]
    for backend, w in work.items():
        total_ms = milliseconds(w.kernels) or 1.0
        top = sorted(w.kernels.items(), key=lambda item: -item[1][1])[:TOP_KERNELS]
        for name, (n, us) in top:
            lines.append(f"| {BACKEND_LABELS[backend]} | `{short_kernel_name(name)}` | {n} | "
                         f"{us / 1e3:.3f} | {100 * us / 1e3 / total_ms:.0f}% |")
    return lines + [""]


def short_kernel_name(name, limit=100):
    """A kernel's demangled name without its return type, namespaces and parameter list,
    cut at limit characters (launches.csv has the full names)."""
    name = re.sub(r"^void ", "", name).replace("(anonymous namespace)::", "")
    name = re.sub(r"\b\w+::", "", name)
    if name.endswith(")"):  # the parameter list: from the "(" that matches the last ")"
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    return name if len(name) <= limit else name[: limit - 1] + "…"


def write_csv(work, path):
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["backend", "kind", "name", "calls", "total_us"])
        for backend, w in work.items():
            for kind, table in (("kernel", w.kernels), ("memcpy/memset", w.copies)):
                for name, (n, us) in sorted(table.items(), key=lambda item: -item[1][1]):
                    writer.writerow([backend, kind, name, n, f"{us:.3f}"])
