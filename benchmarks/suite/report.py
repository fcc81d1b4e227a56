"""What the sections share: the run's context, a section's result, and report.md."""
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.environment import header_lines
from benchmarks.suite.plan import Plan


@dataclass
class Context:
    device: str                 # "cuda" or "cpu"
    plan: Plan
    out: Path                   # the report folder
    timers: dict                # {pass: fn -> median ms}: benchmarks.timing.cuda_timers, or speed.cpu_timers
    plots_missing: str | None   # why there are no plots, or None
    machine: str                # the GPU (or CPU) and the date, for the plots' titles


@dataclass
class Section:
    key: str                                      # its name in --sections
    title: str
    lines: list = field(default_factory=list)    # the Markdown body
    summary: list = field(default_factory=list)  # its findings, one line each, for the report's summary
    files: list = field(default_factory=list)    # what it wrote into the report folder
    failed: int = 0                               # flashattn's errors and mismatches; 1 where the section raised
    seconds: float = 0.0


def ratio_range(ratios):
    """'0.91x to 1.20x (median 1.03x, 36 configs)' of a list of ratios."""
    if not ratios:
        return "no config where both ran"
    low, high = min(ratios), max(ratios)
    spread = f"{low:.2f}x" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}x to {high:.2f}x"
    return f"{spread} (median {statistics.median(ratios):.2f}x, {len(ratios)} config{'s' * (len(ratios) > 1)})"


def image(path, alt):
    return f"![{alt}]({path.name})"


def render(title, header, not_run, plots_missing, sections):
    """report.md: title, header, what did not run, the summary, then each section."""
    lines = [f"# {title}", ""]
    lines += header_lines(header) + [""]
    if not_run:
        lines += ["**Not run on the CPU (needs a GPU with flashattn's CUDA kernels built):**", ""]
        lines += [f"- {item}" for item in not_run] + [""]
    if plots_missing:
        lines += [f"**Plots skipped: {plots_missing}.**", ""]
    lines += ["## Summary", ""]
    lines += [f"- {section.title}: {finding}" for section in sections for finding in section.summary]
    lines.append("")
    for section in sections:
        lines += [f"## {section.title}", ""] + section.lines
        if section.files:
            lines += ["Files: " + ", ".join(f"[{name}]({name})" for name in section.files), ""]
    return "\n".join(lines)
