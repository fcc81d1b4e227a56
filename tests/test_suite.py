"""The benchmarks, `python -m benchmarks`, end to end: the suite's smallest CPU run
writes the report folder with every section and sane numbers, and its plots can be
redrawn from its CSVs; on a GPU, the kernel-launch section."""

import csv
import importlib.util
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
CPU_SECTIONS = ("## Summary", "## Speed", "## Memory", "## Regimes", "## Kernel launches")


def run_suite(out: Path, *args: str) -> str:
    """Runs the suite into out; returns its stdout, or fails with its output."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "suite", "--out", str(out), *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("suite-cpu")
    return out, run_suite(out, "--quick", "--device", "cpu")


def test_cpu_run_writes_every_section_and_says_what_needs_a_gpu(cpu_run: tuple[Path, str]) -> None:
    out, stdout = cpu_run
    report = (out / "report.md").read_text()
    for heading in CPU_SECTIONS:
        assert heading in report
    assert "Not run on the CPU (needs a GPU" in report
    assert "Needs a GPU, not run" in stdout
    for section in ("speed", "memory", "regimes", "profile"):
        assert f"- {section}: " in report, f"the report does not say what of {section} needs a GPU"
    for name in ("speed.csv", "memory.csv", "regimes.csv"):
        assert read_csv(out / name), f"{name} is empty"


def test_cpu_run_draws_the_plots_or_says_why_not(cpu_run: tuple[Path, str]) -> None:
    out, _ = cpu_run
    report = (out / "report.md").read_text()
    pngs = ["speed_fp32_fwd.png", "speed_fp32_bwd.png", "speed_fp32_fwdbwd.png", "memory.png"]
    if importlib.util.find_spec("matplotlib") is None:
        assert "Plots skipped: matplotlib is not installed" in report
        assert not list(out.glob("*.png"))
    else:
        for name in pngs:
            assert (out / name).stat().st_size > 0
            assert f"]({name})" in report


def test_cpu_speed_is_checked_and_positive(cpu_run: tuple[Path, str]) -> None:
    rows = read_csv(cpu_run[0] / "speed.csv")
    assert {r["pass"] for r in rows} == {"fwd", "bwd", "fwdbwd"}
    assert {r["backend"] for r in rows} == {"flashattn", "naive"}
    for r in rows:
        assert r["status"] == "ok", r
        assert float(r["tflops"]) > 0 and float(r["median_ms"]) > 0
        assert math.isfinite(float(r["max_abs_diff"]))


def test_cpu_memory_flashattn_below_naive_and_growing_slower(cpu_run: tuple[Path, str]) -> None:
    rows = read_csv(cpu_run[0] / "memory.csv")
    for pass_ in ("fwd", "fwdbwd"):
        peak = {(r["backend"], int(r["seqlen"])): int(r["peak_mem_bytes"]) for r in rows if r["pass"] == pass_}
        assert all(r["status"] == "ok" for r in rows if r["pass"] == pass_)
        *_, previous, longest = sorted({s for _, s in peak})
        assert peak["flashattn", longest] < peak["naive", longest], pass_
        growth = {b: peak[b, longest] / peak[b, previous] for b in ("flashattn", "naive")}
        assert 1 <= growth["flashattn"] < growth["naive"], (pass_, growth)


def test_cpu_regimes_table_has_every_shape_with_positive_ratios(cpu_run: tuple[Path, str]) -> None:
    report = (cpu_run[0] / "report.md").read_text()
    regimes = report.split("## Regimes")[1].split("\n## ")[0]
    rows = [line for line in regimes.splitlines() if re.match(r"\| \d+ \| \d+ \|", line)]
    assert len(rows) == 4  # B {1, 4} x S {128, 256}
    for line in rows:
        ratios = re.findall(r"\| (\d+\.\d+)x ", line)
        assert len(ratios) == 2, line  # speedup over naive, naive / flashattn memory
        assert all(float(r) > 0 for r in ratios), line


@pytest.mark.gpu
def test_gpu_profile_counts_fewer_kernels_for_flashattn(tmp_path: Path) -> None:
    run_suite(tmp_path, "--quick", "--sections", "profile")
    rows = read_csv(tmp_path / "launches.csv")
    kernels = {b: sum(int(r["calls"]) for r in rows if r["backend"] == b and r["kind"] == "kernel")
               for b in ("naive", "flashattn")}
    assert 0 < kernels["flashattn"] < kernels["naive"], kernels
    assert "kernels launched" in (tmp_path / "report.md").read_text()


def test_plots_redraw_from_the_csvs_with_the_machine_in_the_title(cpu_run: tuple[Path, str]) -> None:
    pytest.importorskip("matplotlib")
    out, _ = cpu_run
    png = out / "speed_fp32_fwd.png"
    png.unlink()
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "plots", str(out)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert png.stat().st_size > 0 and "memory.png" in proc.stdout


def test_speed_plot_holds_every_series_and_names_the_machine(tmp_path: Path, monkeypatch) -> None:
    """The shared y range fits the fastest point of any panel, not only the first panel's."""
    plt = pytest.importorskip("matplotlib.pyplot")
    from benchmarks.shapes import Shape
    from benchmarks.suite import plots

    rows = []
    for headdim, tflops in ((64, 100.0), (128, 500.0)):  # the faster series is in the second panel
        for seqlen in (512, 1024):
            row = Shape("cuda", "bf16", False, 1, 8, seqlen, headdim).row("cudnn", "fwd")
            row.tflops = tflops
            rows.append(row)
    drawn = []
    monkeypatch.setattr(plt, "close", drawn.append)
    plots.speed(rows, "bf16", "fwd", tmp_path / "speed.png", "bf16 forward\nGPU X, 2026-01-01 UTC")
    (fig,) = drawn
    assert all(ax.get_ylim()[1] >= 500.0 for ax in fig.axes)
    assert "GPU X, 2026-01-01" in fig._suptitle.get_text()


def test_speed_tables_give_a_ratio_column_only_to_the_baselines_that_ran() -> None:
    """FlashAttention-4 and -3 are optional backends: a ratio column for each that timed a row, none for
    one whose rows all say why it did not run, and the ratio is flashattn's speed over that backend's."""
    from benchmarks.shapes import Shape
    from benchmarks.tables import speed_tables

    rows = []
    for seqlen in (512, 1024):
        shape = Shape("cuda", "bf16", False, 1, 8, seqlen, 128)
        for backend, tflops in (("flashattn", 300.0), ("cudnn", 200.0), ("fa3", 400.0), ("fa4", None)):
            row = shape.row(backend, "fwd")
            row.tflops, row.status = tflops, "ok" if tflops else "n/a"
            rows.append(row)
    lines = speed_tables(rows, "cuda")
    head = next(line for line in lines if line.startswith("| causal"))
    assert "flashattn/fa3" in head and "flashattn/fa4" not in head
    columns = [cell.strip() for cell in head.strip("|").split("|")]
    body = [line for line in lines if line.startswith("| false")]
    assert len(body) == 2
    for line in body:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        assert cells[columns.index("flashattn/fa3")] == "0.75"
        assert cells[columns.index("flashattn/cudnn")] == "1.50"
        assert cells[columns.index("fa4")] == "n/a"


@pytest.mark.parametrize("layout", ["contiguous", "paged16"])
def test_decode_check_passes_the_cpu_path_and_fails_a_wrong_output(layout: str) -> None:
    from benchmarks.decode import HEAD_DIM, check_decode, paged_copy
    from flashattn import flash_attn_with_kvcache

    gen = torch.Generator().manual_seed(0)
    batch, seqlen, heads, heads_k = 3, 64, 4, 2
    q = torch.randn(batch, 1, heads, HEAD_DIM, generator=gen, dtype=torch.bfloat16)
    k, v = (torch.randn(batch, seqlen, heads_k, HEAD_DIM, generator=gen, dtype=torch.bfloat16) for _ in range(2))
    cache_seqlens = torch.full((batch,), seqlen, dtype=torch.int32)
    k_cache, v_cache, table = k, v, None
    if layout == "paged16":
        k_cache, v_cache, table = paged_copy(k, v, 16, torch.randperm(batch * seqlen // 16, generator=gen))

    def ours():
        return flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens, block_table=table)

    error, bound = check_decode(ours, q, k, v)
    assert error <= bound
    error, bound = check_decode(lambda: ours() * 1.05, q, k, v)
    assert error > bound


def test_best_of_rounds_takes_turns_keeps_each_best_and_drops_a_failing_measure() -> None:
    """benchmarks.timing.best_of_rounds: backends timed in turn, round after round; the best of each;
    one that raises is reported and not called again, the others go on."""
    from benchmarks.timing import best_of_rounds

    calls = []
    times = {"a": iter([5.0, 3.0, 4.0]), "b": iter([2.0, 2.5, 1.5])}

    def measure(name):
        calls.append(name)
        return next(times[name])

    def refuses():
        calls.append("c")
        raise ValueError("shape not supported\nsecond line")

    best, failed = best_of_rounds({"a": lambda: measure("a"), "b": lambda: measure("b"), "c": refuses}, rounds=3)
    assert calls == ["a", "b", "c", "a", "b", "a", "b"]
    assert best == {"a": 3.0, "b": 1.5}
    assert failed == {"c": "ValueError: shape not supported"}


@pytest.mark.parametrize("rounds", [1, 3])
def test_sweep_rounds_time_a_configs_backends_in_turn_and_keep_each_best(rounds: int) -> None:
    """benchmarks.speed.config_rows with --rounds: each backend checked, then (rounds > 1) the checked
    ones timed in turn, round after round, each row keeping its best median; rounds 1 times each once,
    right after its check. On the CPU, with a timer that records which call it timed."""
    from benchmarks.shapes import Shape
    from benchmarks.speed import config_rows

    timed = []

    def timer(step):
        timed.append(step)
        return 10.0 - len(timed)  # later calls faster: the best is each backend's last

    shape = Shape("cpu", "fp32", False, 1, 2, 64, 32)
    rows = config_rows(shape, ["flashattn", "naive"], ("fwd",), {"fwd": timer}, rounds=rounds)
    assert [r.backend for r in rows] == ["flashattn", "naive"] and all(r.status == "ok" for r in rows), rows
    assert len(timed) == 2 * rounds and timed[0] is not timed[1]
    assert timed == [timed[0], timed[1]] * rounds  # in turn: flashattn, naive, flashattn, ...
    for i, row in enumerate(rows):
        assert row.median_ms == 10.0 - (2 * (rounds - 1) + i + 1) and row.tflops > 0


def test_sweep_rounds_mark_a_backend_whose_timing_fails() -> None:
    """benchmarks.speed.time_rows_in_rounds: a call that raises while timed leaves its row an error
    that says so, and the others their best."""
    import contextlib

    from benchmarks.shapes import Shape
    from benchmarks.speed import time_rows_in_rounds

    shape = Shape("cpu", "fp32", False, 1, 2, 64, 32)
    good, bad = shape.row("flashattn", "fwd"), shape.row("naive", "fwd")
    good.status = bad.status = "ok"

    def fails():
        raise RuntimeError("refused\nsecond line")

    def timer(step):
        step()
        return 2.0

    time_rows_in_rounds({"flashattn": (good, lambda: None, contextlib.nullcontext),
                         "naive": (bad, fails, contextlib.nullcontext)}, timer, flops=1e9, rounds=2)
    assert good.status == "ok" and good.median_ms == 2.0 and good.tflops == pytest.approx(1e9 / 2e-3 / 1e12)
    assert bad.status == "error" and "while timing" in bad.notes and "refused" in bad.notes, bad


def test_paged_benchmark_dry_run(tmp_path) -> None:
    """benchmarks/paged.py's plumbing on CPU (--dry-run, tiny lengths): a row per workload, page size
    and copy mode, the contiguous and paged calls timed in rounds, the same out, the Markdown table."""
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, "-m", "benchmarks", "paged", "--dry-run", "--head-dims", "64",
                          "--copy-modes", "auto,gather", "--out", str(tmp_path)],
                         cwd=root, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    with open(tmp_path / "results.csv") as fh:
        rows = list(csv.DictReader(fh))
    from benchmarks.paged import PAGE_SIZES, WORKLOADS

    assert [(r["workload"], int(r["page_size"]), r["copy_mode"]) for r in rows] == [
        (name, page, mode) for name in WORKLOADS for page in PAGE_SIZES for mode in ("auto", "gather")]
    bad = [r for r in rows
           if not (r["same_out"] == "True" and float(r["paged_ms"]) > 0 and float(r["contiguous_ms"]) > 0)]
    assert not bad, f"{bad}\nstderr: {run.stderr[-2000:]}"
    assert "| 64 | prefill 8 x 2k | 16 | auto |" in (tmp_path / "results.md").read_text()


def test_fp8_benchmark_dry_run(tmp_path) -> None:
    """benchmarks/fp8.py's plumbing on CPU (--dry-run, tiny shapes): a row per head dim, length and
    causal flag, the FP8 call (dequantised on the CPU), the dequantising route's call and ours bf16
    timed in rounds, the same values (FP8 there is bf16 on the dequantised values: no difference), the
    CSV and the Markdown table."""
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, "-m", "benchmarks", "fp8", "--dry-run", "--head-dims", "64,128",
                          "--seqlens", "2048,4096", "--out", str(tmp_path)],
                         cwd=root, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = read_csv(tmp_path / "results.csv")
    assert [(int(r["head_dim"]), int(r["S"]), r["causal"]) for r in rows] == [
        (d, s, c) for d in (64, 128) for s in (32, 64) for c in ("False", "True")]
    assert all(r["fp8_path"] == "dequantised" and float(r["fp8_tflops"]) > 0 and float(r["ours_bf16_tflops"]) > 0
               and float(r["fp8_dequantised_tflops"]) > 0 and float(r["max_abs_fp8_minus_ours_bf16"]) == 0
               for r in rows)
    assert int(rows[0]["B"]) * int(rows[0]["S"]) == 256 and int(rows[0]["H"]) * 64 == 2048
    table = (tmp_path / "fp8.md").read_text()
    assert "| 64 | 32 | 8 x 32 | false | dequantised |" in table and "FP8 / cuDNN" in table
    assert "FP8 / FP8 dequantised" in table
