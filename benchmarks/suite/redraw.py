"""`python -m benchmarks plots FOLDER`: a suite report folder's PNGs again, from its speed.csv
and memory.csv, titled with the GPU and date of its report.md; nothing is measured."""
from pathlib import Path

from benchmarks.suite import memory, plots, report, speed
from benchmarks.tables import read_csv

PROG = "python -m benchmarks plots"
HELP = "redraw a suite report folder's plots from its CSVs"


def add_arguments(p):
    p.add_argument("folder", type=Path, help="a folder that `python -m benchmarks suite` wrote")
    p.add_argument("--gpu-memory-gb", type=float, default=None,
                   help="the card's memory for the memory plot, where report.md does not record it")


def run(args):
    if plots.missing():
        raise SystemExit(f"{PROG}: {plots.missing()}")
    header = dict(line[2:].split(": ", 1) for line in (args.folder / "report.md").read_text().splitlines()
                  if line.startswith("- ") and ": " in line)
    machine = f"{header.get('GPU') or header.get('device', 'unknown device')}, {header['date (UTC)']} UTC"
    capacity = int(header["GPU memory"].split()[0]) if "GPU memory" in header else None
    if args.gpu_memory_gb:
        capacity = int(args.gpu_memory_gb * 1e9)
    ctx = report.Context("cuda" if "GPU" in header else "cpu", None, args.folder, None, None, machine)
    drawn = []
    if (args.folder / "speed.csv").exists():
        rows = read_csv(args.folder / "speed.csv")
        dtypes, passes = (list(dict.fromkeys(getattr(r, key) for r in rows)) for key in ("dtype", "pass_"))
        drawn += [path for path, _ in speed.draw_plots(rows, dtypes, passes, ctx)]
    if (args.folder / "memory.csv").exists():
        drawn.append(memory.draw_plot(read_csv(args.folder / "memory.csv"), capacity, ctx)[0])
    print("Drew " + ", ".join(str(path) for path in drawn))
    return 0
