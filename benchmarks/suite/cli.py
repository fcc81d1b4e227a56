"""The suite's command line: runs the chosen sections, writes the report folder, prints the summary."""
import argparse
import datetime as dt
import shlex
import sys
import time
import traceback
from pathlib import Path

from benchmarks import bench_attention as bench
from benchmarks import suite as package
from benchmarks.suite import launches, memory, plan, plots, regimes, report, speed

PROG = "python -m benchmarks.suite"
SECTIONS = {"speed": speed, "memory": memory, "regimes": regimes, "profile": launches}
# do_bench (warmup, rep) in ms per pass: bench_attention.py's defaults.
TIMING = {p: (bench.FWD_WARMUP_MS, bench.FWD_REP_MS) if p == "fwd" else (bench.GRAD_WARMUP_MS, bench.GRAD_REP_MS)
          for p in bench.PASSES}


def parse_args(argv):
    p = argparse.ArgumentParser(prog=PROG, description=package.__doc__,
                                epilog=plan.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="the smaller plan: about 2 minutes on an H100 (instead of about 6), under a minute on a CPU")
    p.add_argument("--out", type=Path, default=None,
                   help="report folder (default benchmarks/results/<YYYY-MM-DD>-<gpu-slug>, or ...-cpu)")
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help=f"comma list out of {','.join(SECTIONS)} (default: all), run in the order given")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="auto: cuda when a GPU and flashattn's kernels are there, else cpu")
    args = p.parse_args(argv)
    args.sections = bench.parse_list(args.sections)
    unknown = [s for s in args.sections if s not in SECTIONS]
    if unknown or not args.sections:
        p.error(f"--sections: got {unknown or 'none'}; accepted: one or more of {', '.join(SECTIONS)}")
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    device, why_cpu = bench.pick_device(args.device, prog=PROG)
    chosen = plan.make_plan(device, args.quick)
    if device == "cuda":
        timers, timing = bench.cuda_timers(TIMING)
        header = bench.gpu_header(timing)
        folder = bench.slug(header["GPU"])
    else:
        timers, header, folder = None, bench.cpu_header(why_cpu), "cpu"
    header["command"] = f"`{shlex.join(PROG.split() + argv)}`"
    out = args.out or bench.RESULTS_ROOT / f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d}-{folder}"
    out.mkdir(parents=True, exist_ok=True)
    ctx = report.Context(device, chosen, out, timers, plots.missing())
    not_run = [SECTIONS[key].NEEDS_GPU for key in args.sections] if device == "cpu" else []
    announce(ctx, args, why_cpu, not_run)

    sections = []
    for i, key in enumerate(args.sections, 1):
        print(f"== {PROG}: [{i}/{len(args.sections)}] {key} ==", file=sys.stderr, flush=True)
        started = time.perf_counter()
        section = run_section(key, ctx)
        section.seconds = time.perf_counter() - started
        sections.append(section)
    header["wall time"] = (f"{sum(s.seconds for s in sections):.0f} s ("
                           + ", ".join(f"{s.key} {s.seconds:.0f} s" for s in sections) + ")")

    title = f"flashattn benchmark suite: {header['GPU'] if device == 'cuda' else 'CPU run'}"
    text = report.render(title, header, not_run, ctx.plots_missing, sections)
    (out / "report.md").write_text(text + "\n")
    print("\nSummary:")
    for section in sections:
        for finding in section.summary:
            print(f"- {section.title}: {finding}")
    files = ["report.md"] + [name for section in sections for name in section.files]
    print(f"\nWrote {out}: {', '.join(files)}")
    failed = [section.title for section in sections if section.failed]
    if failed:
        print(f"WARNING: {', '.join(failed)}: flashattn failed or mismatched, or the section raised; see report.md.")
        return 1
    return 0


def run_section(key, ctx):
    """The section's result; where it raises, a section that shows the traceback, so
    that the sections before and after it still make the report (GPU time is scarce)."""
    try:
        return SECTIONS[key].run(ctx)
    except Exception:
        error = traceback.format_exc()
        print(error, file=sys.stderr, flush=True)
        return report.Section(key, SECTIONS[key].TITLE, lines=["**This section failed:**", "", "```", error, "```", ""],
                              summary=["failed, see its section"], failed=1)


def announce(ctx, args, why_cpu, not_run):
    mode = "quick" if args.quick else "full"
    where = "CUDA" if ctx.device == "cuda" else f"CPU ({why_cpu})"
    print(f"{PROG}: {where}; the {mode} plan, {ctx.plan.estimate}; sections {', '.join(args.sections)}; "
          f"report folder {ctx.out}", flush=True)
    if not_run:
        print("CPU run: flashattn's CPU path against the naive reference. Needs a GPU, not run:", flush=True)
        for item in not_run:
            print(f"  - {item}", flush=True)
    if ctx.plots_missing:
        print(f"Plots skipped: {ctx.plots_missing}.", flush=True)
