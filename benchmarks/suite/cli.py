"""`python -m benchmarks suite` (scripts/suite.sh): runs the chosen sections, writes the
report folder, prints the summary."""
import sys
import time
import traceback

from benchmarks import suite as package
from benchmarks.arguments import add_device, add_out, choice_list
from benchmarks.environment import cpu_header, dated_folder, gpu_header, pick_device, results_folder, slug
from benchmarks.speed import cpu_timers
from benchmarks.suite import launches, memory, plan, plots, regimes, report, speed
from benchmarks.timing import DEFAULT_SETTINGS, cuda_timers

PROG = "python -m benchmarks suite"
HELP = "the benchmark suite: speed, memory, regimes, kernel launches into report.md (scripts/suite.sh)"
SECTIONS = {"speed": speed, "memory": memory, "regimes": regimes, "profile": launches}


def add_arguments(p):
    p.description, p.epilog = package.__doc__, plan.__doc__
    p.add_argument("--quick", action="store_true",
                   help="the smaller plan: about 2.5 minutes on an H100 (instead of about 9), under a minute on a CPU")
    add_out(p, "benchmarks/results/<YYYY-MM-DD>-<gpu-slug>, or ...-cpu")
    p.add_argument("--sections", type=choice_list(tuple(SECTIONS)), default=list(SECTIONS),
                   help=f"comma list out of {','.join(SECTIONS)} (default: all), run in the order given")
    add_device(p)


def run(args):
    device, why_cpu = pick_device(args.device, PROG)
    chosen = plan.make_plan(device, args.quick)
    if device == "cuda":
        timers, timing = cuda_timers(DEFAULT_SETTINGS)
        header = gpu_header(timing)
        folder, machine = slug(header["GPU"]), header["GPU"]
    else:
        timers, header, folder = cpu_timers(chosen.cpu_budget_s), cpu_header(why_cpu), "cpu"
        machine = header["device"]
    header["command"] = f"`{args.command_line}`"
    out = results_folder(args.out, dated_folder(folder))
    machine += f", {header['date (UTC)']} UTC"
    ctx = report.Context(device, chosen, out, timers, plots.missing(), machine)
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

