"""Speed: TFLOP/s of the forward, the backward and forward + backward over the sweep,
flashattn against SDPA's flash, cuDNN and efficient backends and naive attention."""
from benchmarks.shapes import BACKEND_LABELS, CPU_BATCH, CPU_HEADS, PASS_TITLES
from benchmarks.speed import sweep_rows
from benchmarks.tables import notes_lines, speed_tables, write_csv
from benchmarks.suite import plots
from benchmarks.suite.report import Section, image, ratio_range

TITLE = "Speed"
NEEDS_GPU = ("speed: flashattn's CUDA kernels and SDPA's flash, cuDNN and efficient backends, "
             "TFLOP/s of the forward, backward and forward + backward over the bf16 sweep")
BASELINES = {"cuda": ("flash", "cudnn"), "cpu": ("naive",)}


def run(ctx):
    sweep = ctx.plan.speed
    section = Section("speed", TITLE)
    seconds = dict.fromkeys(sweep.passes, 0.0)
    rows = sweep_rows(sweep, ctx.device, ctx.timers, seconds, desc="speed")
    section.lines += [describe_gpu(sweep, seconds) if ctx.device == "cuda" else describe_cpu(sweep), ""]
    write_csv(rows, ctx.out / "speed.csv")
    section.files.append("speed.csv")
    section.failed = sum(r.backend == "flashattn" and r.status in ("error", "mismatch") for r in rows)
    section.summary = [summary_line(rows, pass_, ctx.device) for pass_ in sweep.passes]
    if not ctx.plots_missing:
        for path, title in draw_plots(rows, sweep.dtypes, sweep.passes, ctx):
            section.lines += [image(path, title), ""]
            section.files.append(path.name)
    section.lines += speed_tables(rows, ctx.device) + notes_lines(rows)
    return section


def describe_gpu(sweep, seconds):
    spent = ", ".join(f"{PASS_TITLES[p]} {s:.0f} s" for p, s in seconds.items())
    return (f"{'/'.join(sweep.dtypes)}, B·S = {sweep.tokens} tokens and H·D = {sweep.model_dim} (B and H follow "
            f"S and D), head dims {'/'.join(map(str, sweep.headdims))}, S = "
            f"{'/'.join(map(str, sweep.seqlens))}, causal and not. TFLOP/s = 4·B·H·S²·D (halved when causal) "
            "x the pass's factor (forward 1, backward 2.5, forward + backward 3.5) / the median time. Every "
            "backend runs in this process on the same tensors; before it is timed, its output (its gradients "
            "dq, dk, dv in the backward passes) is checked against the fp32 reference on a slice of the batch "
            "and heads with the tests' bound (2x, for gradients 3x, PyTorch's own error in the same dtype): "
            "a mismatch shows instead of a speed. naive is flashattn.reference.attention_ref in the "
            "input dtype, which materialises the S x S scores; flash, cudnn and efficient are "
            f"F.scaled_dot_product_attention under sdpa_kernel(...). Time spent: {spent}.")


def describe_cpu(sweep):
    return (f"{'/'.join(sweep.dtypes)}, B={CPU_BATCH}, H={CPU_HEADS}, D="
            f"{'/'.join(map(str, sweep.headdims))}, S = {'/'.join(map(str, sweep.seqlens))}, causal and not: "
            "flashattn's blockwise CPU path against the naive reference, each checked against the accurate "
            "reference with the tests' bound, then timed (median of time.perf_counter over 3 calls or more). The CPU path is the "
            "readable statement of the algorithm, not a fast kernel: these numbers check the path and the "
            "suite, they do not measure flashattn's speed.")


def summary_line(rows, pass_, device):
    """flashattn's speed relative to each baseline over the configs where both ran, for one pass."""
    by_config = {}
    for r in rows:
        if r.kind == "speed" and r.pass_ == pass_ and r.status == "ok":
            by_config.setdefault((r.dtype, r.causal, r.headdim, r.seqlen), {})[r.backend] = r.tflops
    parts = []
    for baseline in BASELINES[device]:
        ratios = [c["flashattn"] / c[baseline] for c in by_config.values() if "flashattn" in c and baseline in c]
        parts.append(f"{ratio_range(ratios)} the speed of {BACKEND_LABELS[baseline]}")
    return f"{PASS_TITLES[pass_]}: flashattn at " + "; ".join(parts)


def draw_plots(rows, dtypes, passes, ctx):
    """A PNG per dtype and pass; returns their (path, title)."""
    unit, scale = ("TFLOP/s", 1.0) if ctx.device == "cuda" else ("GFLOP/s", 1e3)
    drawn = []
    for dtype in dtypes:
        for pass_ in passes:
            path = ctx.out / f"speed_{dtype}_{pass_}.png"
            title = f"{dtype} {PASS_TITLES[pass_]}, {unit} (higher is better)"
            plots.speed(rows, dtype, pass_, path, f"{title}\n{ctx.machine}", unit, scale)
            drawn.append((path, title))
    return drawn
