"""compute-sanitizer over every flashattn kernel: memcheck, racecheck, initcheck and synccheck.

    python scripts/sanitize.py OUTDIR [--tools memcheck,racecheck,initcheck,synccheck]

Runs scripts/sanitize_driver.py under each tool, once with the tile configs this
GPU picks and once with FLASHATTN_MAX_SMEM_PER_BLOCK=101376, which makes the
kernels take the smaller tiles of GPUs that give a block 99 KB of shared memory
(sm_86, sm_89). The caching allocator is off, so that every tensor is its own
allocation and a read past a tensor's end is caught. Writes OUTDIR/sanitize.log
(every tool's full output) and OUTDIR/sanitize.md (a table ready to commit),
prints the table, and exits non-zero unless every run completed with 0 errors
(racecheck: 0 hazards, warnings included).
"""

import argparse
import datetime as dt
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "scripts" / "sanitize_driver.py"
SMALL_SMEM_PER_BLOCK = 99 * 1024
TIMEOUT_S = 1200


@dataclass(frozen=True)
class Run:
    tool: str
    sweep: str  # the driver's --sweep
    small_smem: bool  # FLASHATTN_MAX_SMEM_PER_BLOCK=SMALL_SMEM_PER_BLOCK

    @property
    def configs(self) -> str:
        return f"{SMALL_SMEM_PER_BLOCK // 1024} KB smem tiles" if self.small_smem else "this GPU's tiles"


# racecheck and synccheck watch every shared-memory access and barrier: the small sweep.
RUNS = [
    Run("memcheck", "full", small_smem=False),
    Run("memcheck", "small", small_smem=True),
    Run("initcheck", "full", small_smem=False),
    Run("initcheck", "small", small_smem=True),
    Run("racecheck", "small", small_smem=False),
    Run("racecheck", "small", small_smem=True),
    Run("synccheck", "small", small_smem=False),
    Run("synccheck", "small", small_smem=True),
]


@dataclass
class Result:
    run: Run
    calls: str  # "forward / backward" calls the driver completed, or "-" when it did not finish
    errors: str  # what the tool's summary line counts, or why there is none
    seconds: float
    clean: bool


def sanitizer_path() -> str:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    return str(Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "compute-sanitizer")


def summarize(tool: str, output: str, returncode: int) -> tuple[str, str, bool]:
    """(calls, errors, clean) from a run's output."""
    done = re.search(r"sanitize driver: (\d+) forward and (\d+) backward calls completed", output)
    calls = f"{done.group(1)} / {done.group(2)}" if done else "-"
    if tool == "racecheck":
        summary = re.search(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)", output)
        describe = "{} hazards ({} errors, {} warnings)"
    else:
        summary = re.search(r"ERROR SUMMARY: (\d+) errors?", output)
        describe = "{} errors"
    if summary is None:
        return calls, f"no summary (exit {returncode})", False
    clean = done is not None and int(summary.group(1)) == 0 and returncode == 0
    return calls, describe.format(*summary.groups()), clean


def run_one(run: Run, log) -> Result:
    env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("FLASHATTN_MAX_SMEM_PER_BLOCK", None)
    if run.small_smem:
        env["FLASHATTN_MAX_SMEM_PER_BLOCK"] = str(SMALL_SMEM_PER_BLOCK)
    command = [sanitizer_path(), "--tool", run.tool, "--error-exitcode", "1",
               sys.executable, str(DRIVER), "--sweep", run.sweep]
    header = f"==== {run.tool}, sweep {run.sweep}, {run.configs}: {' '.join(command)}"
    print(header, flush=True)
    log.write(header + "\n")
    started = time.monotonic()
    try:
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        output, returncode = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as err:
        output = (err.stdout or b"").decode(errors="replace") + (err.stderr or b"").decode(errors="replace")
        output += f"\nsanitize.py: timed out after {TIMEOUT_S} s\n"
        returncode = -1
    seconds = time.monotonic() - started
    log.write(output + "\n")
    log.flush()
    calls, errors, clean = summarize(run.tool, output, returncode)
    print(f"     {errors}; driver calls (fwd / bwd): {calls}; {seconds:.0f} s", flush=True)
    return Result(run, calls, errors, seconds, clean)


def machine() -> str:
    """GPU, torch, CUDA, sanitizer version, commit, date: one line for the Markdown header."""
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    try:
        version = subprocess.run([sanitizer_path(), "--version"], capture_output=True, text=True).stdout
        sanitizer = re.search(r"Version (\S+)", version).group(1)
    except (OSError, AttributeError):
        sanitizer = "unknown"
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = ""
    # As the benchmarks: where the tree is no git checkout, FLASHATTN_COMMIT names it.
    commit = commit or os.environ.get("FLASHATTN_COMMIT") or "unknown"
    return (f"{gpu}, torch {torch.__version__}, CUDA {torch.version.cuda}, compute-sanitizer {sanitizer}, "
            f"commit {commit}, {dt.date.today().isoformat()}")


def markdown(results: list[Result], header: str) -> str:
    lines = [
        "# compute-sanitizer over flashattn's kernels",
        "",
        header,
        "",
        "Every run executes the forward and both backward paths (dQ by atomics, deterministic) of "
        "every case of the sweep, through `scripts/sanitize_driver.py` (the sweeps are described there), "
        "with PyTorch's caching allocator off.",
        "",
        "| tool | tile configs | sweep | calls (fwd / bwd) | result | time |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        verdict = "clean" if r.clean else "**FAILED**"
        lines.append(f"| {r.run.tool} | {r.run.configs} | {r.run.sweep} | {r.calls} | {r.errors}: {verdict} "
                     f"| {r.seconds:.0f} s |")
    total = sum(r.seconds for r in results)
    clean = sum(r.clean for r in results)
    lines += ["", f"{clean} of {len(results)} runs clean, {total / 60:.1f} min in all.", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--tools", default="memcheck,racecheck,initcheck,synccheck",
                        help="comma-separated subset of the tools (default: all four)")
    parser.add_argument("--tiles", choices=["both", "gpu", "small"], default="both",
                        help="the runs on this GPU's tiles, on the 99 KB smem tiles, or both (default)")
    args = parser.parse_args()
    tools = args.tools.split(",")
    unknown = set(tools) - {run.tool for run in RUNS}
    if unknown:
        parser.error(f"unknown tools: {', '.join(sorted(unknown))}")
    args.outdir.mkdir(parents=True, exist_ok=True)
    with open(args.outdir / "sanitize.log", "w") as log:
        wanted = {"both": (False, True), "gpu": (False,), "small": (True,)}[args.tiles]
        results = [run_one(run, log) for run in RUNS if run.tool in tools and run.small_smem in wanted]
    table = markdown(results, machine())
    (args.outdir / "sanitize.md").write_text(table)
    print(table)
    return 0 if all(r.clean for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
