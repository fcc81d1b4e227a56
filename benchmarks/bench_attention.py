"""Forward and backward speed of flashattn against PyTorch's SDPA backends and the naive reference.

On a GPU (CUDA available and flashattn's kernels built) it runs the
FlashAttention sweep: bf16 and fp16, B*S = 16384 tokens, H*D = 2048, head dims
64/128/256, S from 512 to 16k, causal and not; for each shape and each pass it
times flashattn, SDPA's FLASH_ATTENTION, CUDNN_ATTENTION and EFFICIENT_ATTENTION
backends and the naive reference (all in this process, on the same tensors).
The passes (--passes):

- fwd: out = fn().
- bwd: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), after one
  forward outside the timed region; FLOPs 2.5x the forward's.
- fwdbwd: out = fn() and torch.autograd.grad(out, (q, k, v), dout) together;
  FLOPs 3.5x the forward's.

It also measures the peak memory of one forward, and of one training step
(forward + backward, B=1 H=16 D=128 bf16, S up to 64k), for flashattn and the
naive reference.

On a CPU-only machine it runs a small CPU comparison instead (flashattn's
blockwise CPU path against the naive reference; the forward, and with --passes
the gradients too), with the peak of torch's CPU allocator during one forward,
and says what it could not run.

The measurements are functions that the benchmark suite (benchmarks/suite)
imports: Sweep and gpu_speed_rows / cpu_speed_rows for the speed,
peak_memory_row for the memory, speed_tables and memory_table for the tables.

Results: results.csv (one row per config x pass x backend) and results.md
(header with GPU, versions, commit, date; one table per dtype and pass; the
memory tables) in --out, and the Markdown tables printed last on stdout.

Before any timing, each backend's output (its gradients dq, dk, dv in the bwd
and fwdbwd passes) is compared once against flashattn's (max abs diff column),
and flashattn's against an fp32 reference on a slice of the batch and heads,
so that a broken kernel cannot post a fast number: a mismatch is shown as such
instead of its speed.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import csv
import datetime as dt
import gc
import itertools
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_ROOT = REPO_ROOT / "benchmarks" / "results"

GPU_BACKENDS = ("flashattn", "flash", "cudnn", "efficient", "naive")
CPU_BACKENDS = ("flashattn", "naive")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# The sweep of the FlashAttention papers: a fixed token count and model width,
# so that every row moves the same amount of Q/K/V/O through memory.
SWEEP_TOKENS = 16384
SWEEP_MODEL_DIM = 2048
SWEEP_HEADDIMS = (64, 128, 256)
SWEEP_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
QUICK_HEADDIMS = (64, 128, 256)
QUICK_SEQLENS = (2048, 8192)

# Peak memory of one forward: the shape of gpu.md's anchor, where the naive
# reference runs out of memory from S = 16k on an 80 GB card.
MEMORY_SHAPE = dict(batch=4, heads=32, headdim=64, dtype="fp16", causal=True)
MEMORY_SEQLENS = (4096, 8192, 16384)

# Peak memory of a training step (forward + backward): the anchor,
# where flashattn trains at S = 64k and the naive reference runs out of memory
# long before.
TRAIN_MEMORY_SHAPE = dict(batch=1, heads=16, headdim=128, dtype="bf16", causal=False)
TRAIN_MEMORY_SEQLENS = (4096, 8192, 16384, 32768, 65536)
QUICK_TRAIN_MEMORY_SEQLENS = (8192, 65536)

# Names for plots and prose; the tables keep the short keys.
BACKEND_LABELS = {"flashattn": "flashattn", "flash": "SDPA flash", "cudnn": "SDPA cuDNN",
                  "efficient": "SDPA efficient", "naive": "naive"}

PASSES = ("fwd", "bwd", "fwdbwd")
PASS_TITLES = {"fwd": "forward", "bwd": "backward", "fwdbwd": "forward + backward"}
# FLOPs of a pass in units of the forward's: the backward runs five GEMMs of
# the forward's size (S = Q K^T recomputed, dV, dP, dK, dQ) where the forward
# runs two.
PASS_FLOP_FACTORS = {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}
FWD_WARMUP_MS, FWD_REP_MS = 25, 100
# do_bench settings of the bwd and fwdbwd passes: shorter than the forward's,
# so that the full GPU run (72 configs x 5 backends x 3 passes) stays under
# ~8 minutes on an H100; a backward call is 2-3x a forward call, so the
# median still comes from dozens of calls.
GRAD_WARMUP_MS, GRAD_REP_MS = 10, 50

CPU_BATCH, CPU_HEADS, CPU_HEADDIM = 1, 8, 64
CPU_SEQLENS = (256, 512, 1024, 2048)
CPU_QUICK_SEQLENS = (256, 512)

# A correct kernel differs from another one by a few roundings of the output;
# a broken one by O(1). The factor leaves room for different summation orders.
MISMATCH_EPS_FACTOR = 8
# The naive reference does the softmax in the input dtype, so it gets more room.
NAIVE_TOL_FACTOR = 4
# Gradients sum over whole sequences (dK, dV over every query row, dQ over
# every key), so they get 4x the outputs' room. Their tolerance scales with
# their own magnitude, without the outputs' floor of 1: with random inputs
# they are far below 1 (max |dq| ~ 0.1 at S = 8k), where that floor would
# accept anything. Measured in bf16 and fp16, the naive reference's gradients
# stay within 5% of this tolerance, so it gets no extra room here.
GRAD_TOL_FACTOR = 4
GRAD_NAMES = ("dq", "dk", "dv")
# The fp32 reference check runs on this slice of the batch and heads, so that
# the reference fits in memory at S = 16k.
REF_CHECK_BATCH, REF_CHECK_HEADS = 1, 2
# Bigger than the H100's 50 MB L2: zeroing it evicts the previous call's data.
L2_FLUSH_BYTES = 256 * 2**20
REF_SLICE_NAME = f"the fp32 reference on batch[:{REF_CHECK_BATCH}], heads[:{REF_CHECK_HEADS}]"


@dataclass
class Row:
    kind: str                 # "speed" or "memory"
    device: str               # "cuda" or "cpu"
    dtype: str
    causal: bool
    batch: int
    heads: int
    seqlen: int
    headdim: int
    backend: str
    pass_: str = "fwd"        # fwd | bwd | fwdbwd; the CSV column "pass"
    status: str = "ok"        # ok | n/a | OOM | mismatch | error
    median_ms: float | None = None
    tflops: float | None = None
    max_abs_diff: float | None = None
    peak_mem_bytes: int | None = None   # memory rows: the inputs' bytes + extra_mem_bytes
    extra_mem_bytes: int | None = None  # memory rows: the call's peak above what was allocated before it
    call_ms: float | None = None        # memory rows: wall time of the one measured call, not a benchmark
    notes: str = ""


@dataclass(frozen=True)
class Shape:
    """One benchmarked configuration; it makes the speed rows of its backends."""
    device: str
    dtype: str
    causal: bool
    batch: int
    heads: int
    seqlen: int
    headdim: int

    def row(self, backend, pass_, kind="speed"):
        return Row(kind, self.device, self.dtype, self.causal, self.batch, self.heads,
                   self.seqlen, self.headdim, backend, pass_)

    def inputs(self, count=3):
        """q, k, v (and dout with count=4) of this shape, seeded by it."""
        return make_qkv(self.batch, self.seqlen, self.heads, self.headdim, DTYPES[self.dtype], self.device,
                        seed=self.seqlen + self.headdim, count=count)

    @property
    def label(self):
        return (f"B={self.batch} S={self.seqlen} H={self.heads} D={self.headdim} {self.dtype} "
                f"{'causal' if self.causal else 'non-causal'}")


@dataclass(frozen=True)
class Sweep:
    """The speed sweep: every config (dtype x causal x head dim x sequence length), pass and backend.

    GPU configs keep B*S = tokens and H*D = model_dim, the FlashAttention
    papers' sweep; CPU configs are B = CPU_BATCH, H = CPU_HEADS.
    """
    dtypes: tuple
    causal: tuple
    headdims: tuple
    seqlens: tuple
    passes: tuple
    backends: tuple = GPU_BACKENDS
    tokens: int = SWEEP_TOKENS
    model_dim: int = SWEEP_MODEL_DIM

    def shapes(self, device):
        """[(progress label, Shape)] of every config, in table order."""
        configs = []
        for dtype in self.dtypes:
            for causal in self.causal:
                for headdim in self.headdims:
                    for seqlen in self.seqlens:
                        if device == "cuda":
                            batch, heads = max(1, self.tokens // seqlen), max(1, self.model_dim // headdim)
                        else:
                            batch, heads = CPU_BATCH, CPU_HEADS
                        configs.append((f"{dtype} causal={causal} D={headdim} S={seqlen}",
                                        Shape(device, dtype, causal, batch, heads, seqlen, headdim)))
        return configs


@dataclass
class RunInfo:
    device: str
    header: dict = field(default_factory=dict)
    not_run: list = field(default_factory=list)


# ----------------------------------------------------------------------------
# Small helpers
# ----------------------------------------------------------------------------

def attention_flops(batch, heads, seqlen, headdim, causal):
    """4*B*H*S*S*D (two GEMMs of 2*S*S*D each), halved for causal (Sq == Sk)."""
    flops = 4 * batch * heads * seqlen * seqlen * headdim
    return flops / 2 if causal else flops


def short_reason(text, limit=300):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def git_commit():
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=10)
        if sha.returncode != 0:
            return os.environ.get("FLASHATTN_COMMIT", "unknown")
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
        suffix = " (+ uncommitted changes)" if dirty.stdout.strip() else ""
        return sha.stdout.strip() + suffix
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("FLASHATTN_COMMIT", "unknown")


def slug(name):
    name = re.sub(r"^nvidia\s+", "", name.strip(), flags=re.IGNORECASE)
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


def fmt_num(value, digits=1):
    return "" if value is None else f"{value:.{digits}f}"


def fmt_bytes(n):
    if n is None:
        return "-"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def progress(items, desc):
    """A tqdm bar when tqdm is installed and stderr is a terminal, else one
    printed line per item (a log file keeps them readable)."""
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if not sys.stderr.isatty():
        tqdm = None
    items = list(items)
    if tqdm is not None:
        bar = tqdm(items, desc=desc, file=sys.stderr, dynamic_ncols=True)
        for item in bar:
            bar.set_postfix_str(item[0])
            yield item
        return
    for i, item in enumerate(items, 1):
        print(f"[{desc} {i}/{len(items)}] {item[0]}", file=sys.stderr, flush=True)
        yield item


def max_abs_diff(a, b):
    return (a.float() - b.float()).abs().max().item()


def tolerance(dtype, reference):
    scale = max(1.0, reference.float().abs().max().item())
    return MISMATCH_EPS_FACTOR * torch.finfo(dtype).eps * scale


def check_output(row, out, reference, what, tol):
    """Record max|out - reference| in the row; mark it a mismatch past the tolerance."""
    limit = tol * (NAIVE_TOL_FACTOR if row.backend == "naive" else 1)
    row.max_abs_diff = max_abs_diff(out, reference)
    row.notes = f"diff vs {what}"
    ok = math.isfinite(row.max_abs_diff) and row.max_abs_diff <= limit
    if not ok:
        row.status = "mismatch"
        row.notes = f"max abs diff vs {what} is {row.max_abs_diff:.3g} > tolerance {limit:.3g}"
    return ok


def grad_tolerances(dtype, references):
    """Tolerances of (dq, dk, dv), each scaled by its reference's magnitude (see GRAD_TOL_FACTOR)."""
    eps = torch.finfo(dtype).eps
    return [MISMATCH_EPS_FACTOR * GRAD_TOL_FACTOR * eps * g.float().abs().max().item() for g in references]


def check_grads(row, grads, references, what, tols):
    """check_output for (dq, dk, dv): the row's max_abs_diff is the largest of the
    three, and a mismatch of any one marks the row."""
    diffs = [max_abs_diff(g, r) for g, r in zip(grads, references)]
    row.max_abs_diff = max(diffs, key=lambda d: d if math.isfinite(d) else math.inf)
    row.notes = f"diff vs {what}: " + ", ".join(f"{n} {d:.3g}" for n, d in zip(GRAD_NAMES, diffs))
    bad = [f"{n} {d:.3g} > tolerance {t:.3g}" for n, d, t in zip(GRAD_NAMES, diffs, tols)
           if not (math.isfinite(d) and d <= t)]
    if bad:
        row.status = "mismatch"
        row.notes = f"max abs diff vs {what}: " + ", ".join(bad)
    return not bad


def make_qkv(batch, seqlen, heads, headdim, dtype, device, seed, count=3):
    """q, k, v (and dout with count=4), each [B, S, H, D], flash_attn_func's layout."""
    gen = torch.Generator(device=device).manual_seed(seed)
    shape = (batch, seqlen, heads, headdim)
    return [torch.randn(shape, generator=gen, device=device, dtype=dtype) for _ in range(count)]


def grad_leaves(tensors):
    """Leaves that share the tensors' storage and require grad: the gradient
    passes get their own, so that the forward pass times inputs without autograd."""
    return [t.detach().requires_grad_() for t in tensors]


def grad_step(fn, inputs, dout, pass_):
    """The call that a gradient pass times, for fn() -> out computed from the leaves inputs.

    bwd: the forward runs here, once, outside the timed call, and the call
    keeps its graph (retain_graph) so that it can repeat. fwdbwd: the call runs
    the forward and the backward."""
    if pass_ == "bwd":
        out = fn()
        return lambda: torch.autograd.grad(out, inputs, dout, retain_graph=True)
    return lambda: torch.autograd.grad(fn(), inputs, dout)


def reference_grads(q, k, v, dout, softmax_scale, causal):
    """(dq, dk, dv) of the fp32 reference through autograd, in fp32."""
    from flashattn.reference import attention_ref

    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    out, _ = attention_ref(*leaves, softmax_scale=softmax_scale, causal=causal, upcast=True)
    return torch.autograd.grad(out, leaves, dout.float())


def free_cuda_memory():
    gc.collect()
    torch.cuda.empty_cache()


# ----------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------

def cuda_timers(settings):
    """A median-milliseconds timer of fn() for each pass, and the header's line saying how.

    settings: {pass: (warmup_ms, rep_ms)}. triton's do_bench if importable, else CUDA events.
    """
    # Passes that share settings are named together; one group needs no names.
    groups = {}
    for pass_, warmup_rep in settings.items():
        groups.setdefault(warmup_rep, []).append(PASS_TITLES[pass_])
    how = "; ".join(("" if len(groups) == 1 else ", ".join(names) + ": ") + f"warmup {warmup} ms, rep {rep} ms"
                    for (warmup, rep), names in groups.items())
    try:
        from triton.testing import do_bench
    except ImportError:
        do_bench = None
    if do_bench is not None:
        def make_timer(warmup_ms, rep_ms):
            def timer(fn):
                return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
            return timer
        return ({pass_: make_timer(*warmup_rep) for pass_, warmup_rep in settings.items()},
                f"triton.testing.do_bench median ({how})")

    # Like do_bench: flush L2 before each call, queue every call before waiting,
    # so neither cached inputs nor launch overhead shape the median.
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")

    def timed_calls(fn, n):
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(n)]
        for start, end in events:
            flush.zero_()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) for start, end in events]

    def make_timer(warmup_ms, rep_ms):
        def timer(fn):
            estimate = max(statistics.median(timed_calls(fn, 5)), 1e-3)
            timed_calls(fn, max(1, int(warmup_ms / estimate)))
            return statistics.median(timed_calls(fn, max(5, int(rep_ms / estimate))))
        return timer
    return ({pass_: make_timer(*warmup_rep) for pass_, warmup_rep in settings.items()},
            f"CUDA events median ({how}; triton not importable)")


def cpu_time(fn, budget_s, min_reps=3, max_reps=7):
    """Median wall-clock seconds of fn() after one warm-up call."""
    fn()
    times = []
    started = time.perf_counter()
    while len(times) < max_reps and (len(times) < min_reps or time.perf_counter() - started < budget_s):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ----------------------------------------------------------------------------
# GPU sweep
# ----------------------------------------------------------------------------

def sdpa_backends():
    return {"flash": SDPBackend.FLASH_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def sdpa_fn(q, k, v, causal, scale):
    """SDPA wants [B, H, S, D]: transposed views of the same [B, S, H, D] tensors.
    Its is_causal is top-left aligned, the same as ours only because Sq == Sk here.
    The backend is chosen by the caller's sdpa_kernel context. The result is a
    [B, S, H, D] view, like flashattn's output."""
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    return lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, scale=scale).transpose(1, 2)


def call_capturing_warnings(fn):
    """Run fn; on failure re-raise with SDPA's warnings (which say why a backend
    refused the inputs) folded into the message."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return fn()
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as exc:  # an unsupported backend raises RuntimeError
            # SDPA warns "<backend> kernel not used because:" and then the reason;
            # keep the reasons, once each, before the error itself.
            reasons = dict.fromkeys(" ".join(str(w.message).split()) for w in caught)
            reasons = [r for r in reasons if r and not r.endswith("because:")]
            raise RuntimeError("; ".join(reasons + [str(exc)])) from None


def backend_fns(q, k, v, causal, scale):
    """{backend: fn() -> out [B, S, H, D]} on q, k, v, and {backend: its context}:
    flashattn and naive, and on CUDA tensors SDPA's three backends too.

    Each backend runs, checked and timed, inside its context: SDPA's backend
    choice stays out of the timed calls.
    """
    from flashattn import flash_attn_func
    from flashattn.reference import attention_ref

    fns = {
        "flashattn": lambda: flash_attn_func(q, k, v, softmax_scale=scale, causal=causal),
        "naive": lambda: attention_ref(q, k, v, softmax_scale=scale, causal=causal, upcast=False)[0],
    }
    contexts = dict.fromkeys(fns, contextlib.nullcontext)
    if q.is_cuda:
        for name, backend in sdpa_backends().items():
            fns[name] = sdpa_fn(q, k, v, causal, scale)
            contexts[name] = lambda backend=backend: sdpa_kernel(backend)
    return fns, contexts


def time_gpu_row(row, timer, fn, context, flops):
    """The median time of fn() and its TFLOP/s into the row, or OOM / error where timing fails."""
    try:
        with context():
            row.median_ms = call_capturing_warnings(lambda: timer(fn))
        row.tflops = flops / (row.median_ms * 1e-3) / 1e12
    except torch.cuda.OutOfMemoryError:
        row.status = "OOM"
    except Exception as exc:
        row.status, row.notes = "error", short_reason(f"while timing: {exc}")


def gpu_speed_rows(sweep, timers, seconds=None, desc="gpu sweep"):
    """Every config of the sweep, each pass, each backend; seconds[pass], where given, accumulates the time spent."""
    backends = [b for b in GPU_BACKENDS if b in sweep.backends]
    rows = []
    for _, shape in progress(sweep.shapes("cuda"), desc):
        rows += gpu_config_rows(shape, backends, sweep.passes, timers, seconds)
    return rows


def gpu_config_rows(shape, backends, passes, timers, seconds=None):
    """The passes of every backend on one config, on one set of inputs; seconds[pass],
    where given, accumulates the time spent."""
    from flashattn.reference import attention_ref

    seconds = collections.Counter() if seconds is None else seconds
    dtype = DTYPES[shape.dtype]
    scale = 1.0 / math.sqrt(shape.headdim)
    flops = attention_flops(shape.batch, shape.heads, shape.seqlen, shape.headdim, shape.causal)
    grad_passes = [p for p in passes if p != "fwd"]
    free_cuda_memory()
    q, k, v, *rest = shape.inputs(count=4 if grad_passes else 3)
    # The fp32 references run on a slice, to check flashattn itself.
    sl = (slice(0, REF_CHECK_BATCH), slice(None), slice(0, REF_CHECK_HEADS))
    rows = []
    skip = {}  # backend -> why its gradient passes do not run
    if "fwd" in passes:
        started = time.perf_counter()
        ref_slice, _ = attention_ref(q[sl], k[sl], v[sl], softmax_scale=scale, causal=shape.causal, upcast=True)
        tol = tolerance(dtype, ref_slice)
        fns, contexts = backend_fns(q, k, v, shape.causal, scale)
        rows += gpu_forward_rows(shape, backends, fns, contexts, (ref_slice, sl, tol), timers["fwd"], flops)
        del ref_slice, fns, contexts
        if any(r.backend == "naive" and r.status == "OOM" for r in rows):
            skip["naive"] = "not run: the naive forward already ran out of memory"
        seconds["fwd"] += time.perf_counter() - started
    if grad_passes:
        dout = rest[0]
        started = time.perf_counter()
        ref_grads = reference_grads(q[sl], k[sl], v[sl], dout[sl], scale, shape.causal)
        tols = grad_tolerances(dtype, ref_grads)
        inputs = grad_leaves((q, k, v))
        fns, contexts = backend_fns(*inputs, shape.causal, scale)
        for pass_ in grad_passes:  # the first one's time includes the fp32 reference's gradients
            rows += gpu_grad_rows(pass_, shape, backends, fns, contexts, inputs, dout, (ref_grads, sl, tols),
                                  timers[pass_], flops * PASS_FLOP_FACTORS[pass_], skip)
            seconds[pass_] += time.perf_counter() - started
            started = time.perf_counter()
    return rows


def gpu_forward_rows(shape, backends, fns, contexts, reference, timer, flops):
    """The fwd pass of every backend: check its output once, then time it.

    reference: (the fp32 reference's output on the slice sl, sl, tolerance).
    """
    ref_slice, sl, tol = reference
    rows = []
    anchor = None  # flashattn's full output, once it passed the fp32 check
    for name in backends:
        row = shape.row(name, "fwd")
        rows.append(row)
        try:
            with contexts[name]():
                out = call_capturing_warnings(fns[name])
            if anchor is not None:
                ok = check_output(row, out, anchor, "flashattn's output", tol)
            else:
                ok = check_output(row, out[sl], ref_slice, REF_SLICE_NAME, tol)
            if name == "flashattn" and ok:
                anchor = out
            del out
        except torch.cuda.OutOfMemoryError:
            row.status = "OOM"
        except Exception as exc:
            row.status = "error" if name == "flashattn" else "n/a"
            row.notes = short_reason(exc)
        free_cuda_memory()
        if row.status in ("ok", "mismatch"):
            time_gpu_row(row, timer, fns[name], contexts[name], flops)
            free_cuda_memory()
    return rows


def gpu_grad_rows(pass_, shape, backends, fns, contexts, inputs, dout, reference, timer, flops, skip):
    """A gradient pass (bwd or fwdbwd) of every backend: check its (dq, dk, dv)
    once, then time the pass's call (grad_step) on the same graph.

    fns compute from the leaves inputs; reference: (the fp32 reference's
    gradients on the slice sl, sl, their tolerances); skip: {backend: why not run}.
    """
    ref_grads, sl, tols = reference
    rows = []
    anchor = None  # flashattn's full gradients, once they passed the fp32 check
    for name in backends:
        row = shape.row(name, pass_)
        rows.append(row)
        if name in skip:
            row.status, row.notes = "OOM", skip[name]
            continue
        fn, step, grads = fns[name], None, None
        try:
            with contexts[name]():
                step = call_capturing_warnings(lambda: grad_step(fn, inputs, dout, pass_))
                grads = call_capturing_warnings(step)
            if anchor is not None:
                ok = check_grads(row, grads, anchor, "flashattn's gradients", tols)
            else:
                ok = check_grads(row, [g[sl] for g in grads], ref_grads, REF_SLICE_NAME, tols)
            if name == "flashattn" and ok:
                anchor = grads
        except torch.cuda.OutOfMemoryError:
            row.status = "OOM"
        except Exception as exc:
            row.status = "error" if name == "flashattn" else "n/a"
            row.notes = short_reason(exc)
        grads = None
        if row.status in ("ok", "mismatch"):
            time_gpu_row(row, timer, step, contexts[name], flops)
        step = None  # a bwd step holds its forward's graph
        free_cuda_memory()
    return rows


def gpu_header(timing):
    props = torch.cuda.get_device_properties(0)
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    return {
        "GPU": props.name,
        "SMs": props.multi_processor_count,
        "torch": torch.__version__,
        "CUDA": torch.version.cuda,
        "triton": triton_version,
        "flashattn build": build_info(),
        "python": platform.python_version(),
        "git commit": git_commit(),
        "date (UTC)": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "timing": timing,
    }


def build_info():
    try:
        from flashattn import _build_info as info
        return f"arch list {getattr(info, 'ARCH_LIST', None)}, CUDA {getattr(info, 'CUDA_VERSION', None)}"
    except ImportError:
        return "unknown"


# ----------------------------------------------------------------------------
# Peak memory
# ----------------------------------------------------------------------------

MEMORY_MEASURED = {
    "cuda": "torch.cuda.max_memory_allocated after a reset",
    "cpu": "the high-water mark of torch's CPU allocator, from the allocations and frees that "
           "torch.profiler records with profile_memory=True",
}


def memory_rows(shapes, backends, training, desc):
    """peak_memory_row of each shape (in order of S) and backend. Once a backend
    runs out of memory it is not run at the longer sequences; their rows say so."""
    configs = [(f"{BACKEND_LABELS[name]} S={shape.seqlen}", shape, name) for shape in shapes for name in backends]
    rows, out_of_memory_at = [], {}
    for _, shape, name in progress(configs, desc):
        if name in out_of_memory_at:
            row = shape.row(name, "fwdbwd" if training else "fwd", kind="memory")
            row.status, row.notes = "OOM", f"not run: out of memory already at S = {out_of_memory_at[name]}"
        else:
            row = peak_memory_row(shape, name, training)
            if row.status == "OOM":
                out_of_memory_at[name] = shape.seqlen
        rows.append(row)
    return rows


def peak_memory_row(shape, backend, training):
    """The memory row of one call of the backend on fresh inputs of the shape:
    one forward, or with training a training step, out = fn();
    torch.autograd.grad(out, (q, k, v), dout).

    extra_mem_bytes is the call's peak allocation above what was allocated
    before it (MEMORY_MEASURED says how, per device), peak_mem_bytes adds the
    inputs' bytes, call_ms is the call's wall time.
    """
    row = shape.row(backend, "fwdbwd" if training else "fwd", kind="memory")
    measure = cuda_peak_allocated if shape.device == "cuda" else cpu_peak_allocated
    if shape.device == "cuda":
        free_cuda_memory()
    try:
        inputs = shape.inputs(count=4 if training else 3)
        input_bytes = sum(t.numel() * t.element_size() for t in inputs)
        qkv = grad_leaves(inputs[:3]) if training else inputs[:3]
        fns, contexts = backend_fns(*qkv, shape.causal, 1.0 / math.sqrt(shape.headdim))
        step = grad_step(fns[backend], qkv, inputs[3], "fwdbwd") if training else fns[backend]
        with contexts[backend]():
            extra, seconds = call_capturing_warnings(lambda: measure(step))
        row.extra_mem_bytes, row.peak_mem_bytes, row.call_ms = extra, input_bytes + extra, seconds * 1e3
        row.notes = f"inputs {'q, k, v, dout' if training else 'q, k, v'}: {fmt_bytes(input_bytes)}"
    except torch.cuda.OutOfMemoryError:
        row.status = "OOM"
    except Exception as exc:
        row.status, row.notes = "error", short_reason(exc)
    return row


def cuda_peak_allocated(step):
    """(peak bytes allocated during step() above the bytes allocated before it, the call's seconds)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    started = time.perf_counter()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before, time.perf_counter() - started


def cpu_peak_allocated(step):
    """cuda_peak_allocated for CPU tensors. torch keeps no CPU memory counter, so the
    peak is that of the running sum of the allocations and frees of torch's CPU
    allocator that torch.profiler records during the call; the seconds include
    the profiler's overhead."""
    from torch.profiler import ProfilerActivity, profile

    # Without a GPU, kineto logs an ERROR that it found none; on the CPU that is expected.
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        started = time.perf_counter()
        step()
        seconds = time.perf_counter() - started
    changes = sorted((event.start_ns(), event.nbytes()) for event in prof.profiler.kineto_results.events()
                     if event.name() == "[memory]")
    return max(0, *itertools.accumulate(nbytes for _, nbytes in changes)), seconds


# ----------------------------------------------------------------------------
# CPU comparison
# ----------------------------------------------------------------------------

def cpu_speed_rows(sweep, budget_s, desc="cpu run"):
    """Every config of the sweep, each pass, for flashattn's CPU path and the naive reference."""
    backends = [b for b in CPU_BACKENDS if b in sweep.backends]
    rows = []
    for _, shape in progress(sweep.shapes("cpu"), desc):
        rows += cpu_config_rows(shape, backends, sweep.passes, budget_s)
    return rows


def cpu_config_rows(shape, backends, passes, budget_s):
    """The passes of the backends (flashattn's CPU path, the naive reference) on
    one config, each checked against the fp32 reference, then timed for about
    budget_s seconds (cpu_time)."""
    from flashattn.reference import attention_ref

    dtype = DTYPES[shape.dtype]
    causal = shape.causal
    scale = 1.0 / math.sqrt(shape.headdim)
    flops = attention_flops(shape.batch, shape.heads, shape.seqlen, shape.headdim, causal)
    grad_passes = [p for p in passes if p != "fwd"]
    q, k, v, *rest = shape.inputs(count=4 if grad_passes else 3)
    rows = []
    if "fwd" in passes:
        ref32, _ = attention_ref(q, k, v, softmax_scale=scale, causal=causal, upcast=True)
        tol = tolerance(dtype, ref32)
        fns, _ = backend_fns(q, k, v, causal, scale)
        for name in backends:
            row = shape.row(name, "fwd")
            rows.append(row)
            try:
                check_output(row, fns[name](), ref32, "the fp32 reference", tol)
                row.median_ms = cpu_time(fns[name], budget_s) * 1e3
                row.tflops = flops / (row.median_ms * 1e-3) / 1e12
            except Exception as exc:
                row.status, row.notes = "error", short_reason(exc)
    if grad_passes:
        dout = rest[0]
        ref_grads = reference_grads(q, k, v, dout, scale, causal)
        tols = grad_tolerances(dtype, ref_grads)
        inputs = grad_leaves((q, k, v))
        fns, _ = backend_fns(*inputs, causal, scale)
        for pass_ in grad_passes:
            for name in backends:
                row = shape.row(name, pass_)
                rows.append(row)
                try:
                    step = grad_step(fns[name], inputs, dout, pass_)
                    check_grads(row, step(), ref_grads, "the fp32 reference", tols)
                    row.median_ms = cpu_time(step, budget_s) * 1e3
                    row.tflops = flops * PASS_FLOP_FACTORS[pass_] / (row.median_ms * 1e-3) / 1e12
                except Exception as exc:
                    row.status, row.notes = "error", short_reason(exc)
    return rows


def cpu_header(reason):
    return {
        "device": f"CPU: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads",
        "torch": torch.__version__,
        "CUDA": f"{torch.version.cuda} (torch build; {reason})",
        "flashattn build": build_info(),
        "python": platform.python_version(),
        "git commit": git_commit(),
        "date (UTC)": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "timing": "time.perf_counter, median of 3-7 calls after one warm-up",
    }


CPU_NOT_RUN = [
    "the TFLOP/s sweep of flashattn's CUDA kernels, forward, backward and forward + backward "
    "(bf16/fp16, B*S = 16k tokens, H*D = 2048, S 512..16k)",
    "the SDPA baselines: FLASH_ATTENTION, CUDNN_ATTENTION, EFFICIENT_ATTENTION",
    "the measured peak CUDA memory of one forward (flashattn vs naive, B=4 H=32 D=64 fp16 causal)",
    "the measured peak CUDA memory of a training step, forward + backward "
    "(flashattn vs naive, B=1 H=16 D=128 bf16, S 4k..64k)",
]


# ----------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------

def write_csv(rows, path):
    names = [f.name for f in fields(Row)]
    columns = {n: n.rstrip("_") for n in names}  # Row.pass_ is the column "pass"
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(columns.values()))
        writer.writeheader()
        for row in rows:
            record = {n: getattr(row, n) for n in names}
            for key in ("median_ms", "tflops", "call_ms"):
                if record[key] is not None:
                    record[key] = f"{record[key]:.4f}"
            if record["max_abs_diff"] is not None:
                record["max_abs_diff"] = f"{record['max_abs_diff']:.3e}"
            writer.writerow({columns[n]: value for n, value in record.items()})


def speed_cell(row, unit_scale=1.0):
    if row is None:
        return "-"
    if row.status in ("ok",):
        return fmt_num(row.tflops * unit_scale)
    if row.status == "mismatch":
        return "mismatch"
    return row.status


def ratio_cell(num, den):
    if num is None or den is None or num.status != "ok" or den.status != "ok":
        return "-"
    return f"{num.tflops / den.tflops:.2f}"


def speed_tables(rows, device):
    """One table per (dtype, pass); a run of the forward alone keeps its titles
    unmarked, others say each pass's FLOP multiplier."""
    speed = [r for r in rows if r.kind == "speed"]
    lines = []
    backends = GPU_BACKENDS if device == "cuda" else CPU_BACKENDS
    present = [b for b in backends if any(r.backend == b for r in speed)]
    passes = [p for p in PASSES if any(r.pass_ == p for r in speed)]
    unit, scale = ("TFLOP/s", 1.0) if device == "cuda" else ("GFLOP/s", 1e3)
    tables = [(dtype, pass_) for dtype in dict.fromkeys(r.dtype for r in speed) for pass_ in passes]
    for dtype, pass_ in tables:
        by_config = {}
        for r in speed:
            if r.dtype == dtype and r.pass_ == pass_:
                by_config.setdefault((r.causal, r.headdim, r.seqlen), {})[r.backend] = r
        if not by_config:
            continue
        head = ["causal", "D", "S", "B x H"] + [f"{b}" for b in present]
        if device == "cuda":
            head += ["flashattn/flash", "flashattn/cudnn"]
        else:
            head += ["flashattn ms", "naive ms"]
        title = PASS_TITLES[pass_]
        if passes != ["fwd"]:
            title += f" (FLOPs x{PASS_FLOP_FACTORS[pass_]:g})"
        lines += [f"### {dtype} {title}, {unit}", "", "| " + " | ".join(head) + " |",
                  "|" + "---|" * len(head)]
        for (causal, d, s), cells in sorted(by_config.items()):
            any_row = next(iter(cells.values()))
            line = [str(causal).lower(), str(d), str(s), f"{any_row.batch} x {any_row.heads}"]
            line += [speed_cell(cells.get(b), scale) for b in present]
            if device == "cuda":
                fa = cells.get("flashattn")
                line += [ratio_cell(fa, cells.get("flash")), ratio_cell(fa, cells.get("cudnn"))]
            else:
                line += [fmt_num(cells[b].median_ms, 2) if b in cells and cells[b].median_ms else "-"
                         for b in ("flashattn", "naive")]
            lines.append("| " + " | ".join(line) + " |")
        lines.append("")
    return lines


def memory_table(rows, pass_):
    """The peak-memory table of one forward (pass_ "fwd") or of a training step
    ("fwdbwd"): a row per S, an 'extra' and a 'peak' column per backend."""
    mem = [r for r in rows if r.kind == "memory" and r.pass_ == pass_]
    if not mem:
        return []
    backends = [b for b in GPU_BACKENDS if any(r.backend == b for r in mem)]
    by_seqlen = {}
    for r in mem:
        by_seqlen.setdefault(r.seqlen, {})[r.backend] = r
    first = mem[0]
    what, tensors = (("one forward", ["q", "k", "v"]) if pass_ == "fwd" else
                     ("a training step, out = fn(); torch.autograd.grad(out, (q, k, v), dout)",
                      ["q", "k", "v", "dout"]))
    head = ["S", "inputs " + "+".join(tensors)]
    for b in backends:
        head += [f"{b} extra", f"{b} peak"] + (["flashattn peak / previous"] if b == "flashattn" else [])
    lines = [f"### Peak memory of {what} (B={first.batch}, H={first.heads}, D={first.headdim}, {first.dtype}, "
             f"{'causal' if first.causal else 'non-causal'})", "",
             f"Measured: {MEMORY_MEASURED[first.device]}. 'extra' is the call's peak above what was allocated "
             f"before it; 'peak' adds the inputs {', '.join(tensors)}. Memory grows linearly where "
             "'peak / previous' equals the ratio of the S.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    itemsize = torch.finfo(DTYPES[first.dtype]).bits // 8
    previous = None  # (S, flashattn's peak) of the row above
    for s, cells in sorted(by_seqlen.items()):
        line = [str(s), fmt_bytes(len(tensors) * first.batch * first.heads * s * first.headdim * itemsize)]
        for b in backends:
            r = cells.get(b)
            if r is None:
                line += ["-", "-"]
            elif r.status != "ok":
                line += [r.status, r.status]
            else:
                line += [fmt_bytes(r.extra_mem_bytes), fmt_bytes(r.peak_mem_bytes)]
            if b == "flashattn":
                peak = r.peak_mem_bytes if r is not None and r.status == "ok" else None
                line.append(f"{peak / previous[1]:.2f} (S x{s / previous[0]:g})"
                            if peak and previous and previous[1] else "-")
                previous = (s, peak)
        lines.append("| " + " | ".join(line) + " |")
    return lines + [""]


def notes_lines(rows):
    """Distinct reasons for n/a, errors and mismatches, so the tables stay narrow."""
    seen = {}
    for r in rows:
        if r.status in ("n/a", "error", "mismatch") and r.notes:
            # Group notes that differ only in their numbers; show the first one.
            key = (r.backend, r.status, re.sub(r"[-+.\deE]*\d", "#", r.notes))
            pass_ = "" if r.pass_ == "fwd" else f" {PASS_TITLES[r.pass_]}"
            where = f"{r.dtype}{pass_} causal={str(r.causal).lower()} D={r.headdim} S={r.seqlen}"
            seen.setdefault(key, (r.notes, []))[1].append(where)
    if not seen:
        return []
    lines = ["### Notes", ""]
    for (backend, status, _), (note, where) in seen.items():
        shown = ", ".join(where[:4]) + (f" and {len(where) - 4} more" if len(where) > 4 else "")
        lines.append(f"- {backend} {status} ({shown}): {note}")
    return lines + [""]


def markdown(run, rows):
    passes = [p for p in PASSES if any(r.pass_ == p for r in rows if r.kind == "speed")] or ["fwd"]
    title = (f"flashattn {', '.join(PASS_TITLES[p] for p in passes)} benchmark"
             + (" (CPU run)" if run.device == "cpu" else ""))
    lines = [f"# {title}", ""]
    lines += [f"- {key}: {value}" for key, value in run.header.items()]
    lines.append("")
    if run.not_run:
        lines += ["**CPU run: no GPU here. Not run (they need a GPU with flashattn's CUDA kernels built):**", ""]
        lines += [f"- {item}" for item in run.not_run]
        lines.append("")
    lines += ["Cells: speed, or `n/a` (backend refused the shape; see Notes), `OOM`, "
              "`mismatch` (output differs from flashattn's / the fp32 reference: speed withheld, see CSV), "
              "`error`. Max abs diffs are in results.csv.", ""]
    if passes != ["fwd"]:
        lines += ["Passes: FLOPs are 4*B*H*S*S*D, halved for causal, times the pass's multiplier. "
                  "The backward times torch.autograd.grad(out, (q, k, v), dout, retain_graph=True) after "
                  "one forward outside the timed region; forward + backward times out = fn() and "
                  "torch.autograd.grad(out, (q, k, v), dout) together. Their check compares the gradients "
                  "dq, dk, dv, each within a tolerance scaled by its own magnitude.", ""]
    lines += speed_tables(rows, run.device)
    lines += memory_table(rows, "fwd")
    lines += memory_table(rows, "fwdbwd")
    lines += notes_lines(rows)
    return "\n".join(lines)


# ----------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------

def parse_list(text, cast=str):
    return [cast(x) for x in text.replace(" ", "").split(",") if x]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Defaults follow the device: the full GPU sweep on a GPU, "
                                       "a small CPU comparison otherwise. The git commit is read with git; "
                                       "where the tree is no git checkout, FLASHATTN_COMMIT is used.")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default benchmarks/results/<YYYY-MM-DD>-<gpu-slug>)")
    p.add_argument("--quick", action="store_true",
                   help="a small subset: GPU bf16, D 64/128/256, S 2048/8192, all passes, training-step "
                        "memory at S 8192 and 65536; CPU S 256/512")
    p.add_argument("--passes", type=lambda s: parse_list(s), default=None,
                   help=f"comma list out of {','.join(PASSES)} (default: all on a GPU, fwd on the CPU)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="auto: cuda when a GPU and flashattn's kernels are there, else cpu")
    p.add_argument("--dtypes", type=lambda s: parse_list(s), default=None,
                   help="comma list of bf16,fp16 (GPU) or fp32,bf16 (CPU)")
    p.add_argument("--headdims", type=lambda s: parse_list(s, int), default=None)
    p.add_argument("--seqlens", type=lambda s: parse_list(s, int), default=None)
    p.add_argument("--causal", choices=("both", "true", "false"), default="both")
    p.add_argument("--backends", type=lambda s: parse_list(s), default=None,
                   help=f"comma list out of {','.join(GPU_BACKENDS)} (default: all)")
    p.add_argument("--tokens", type=int, default=SWEEP_TOKENS, help="B*S of each GPU config")
    p.add_argument("--model-dim", type=int, default=SWEEP_MODEL_DIM, help="H*D of each GPU config")
    p.add_argument("--memory-seqlens", type=lambda s: parse_list(s, int), default=list(MEMORY_SEQLENS),
                   help="sequence lengths of the peak-memory table of one forward ('' to skip it)")
    p.add_argument("--train-memory-seqlens", type=lambda s: parse_list(s, int), default=None,
                   help="GPU: sequence lengths of the peak-memory table of a training step ('' to skip it; "
                        f"default {','.join(map(str, TRAIN_MEMORY_SEQLENS))}, "
                        f"--quick {','.join(map(str, QUICK_TRAIN_MEMORY_SEQLENS))}; "
                        "none when --passes is fwd alone)")
    p.add_argument("--warmup", type=float, default=FWD_WARMUP_MS, help="do_bench warm-up, ms")
    p.add_argument("--rep", type=float, default=FWD_REP_MS, help="do_bench repetition time, ms")
    p.add_argument("--grad-warmup", type=float, default=GRAD_WARMUP_MS,
                   help="do_bench warm-up of the bwd and fwdbwd passes, ms")
    p.add_argument("--grad-rep", type=float, default=GRAD_REP_MS,
                   help="do_bench repetition time of the bwd and fwdbwd passes, ms")
    p.add_argument("--features", action="store_true",
                   help="GPU: also time variable-length batches, sliding windows, softcap, ALiBi and dropout "
                        "(benchmarks/bench_features.py) into features.csv and a section of results.md")
    p.add_argument("--cpu-budget", type=float, default=0.5,
                   help="CPU run: seconds of timed repeats per measurement (3 calls at least)")
    args = p.parse_args(argv)
    args.causal = {"both": [False, True], "true": [True], "false": [False]}[args.causal]
    args.backends = args.backends or list(GPU_BACKENDS)
    unknown = set(args.backends) - set(GPU_BACKENDS)
    if unknown:
        p.error(f"--backends: unknown {sorted(unknown)}; accepted: {', '.join(GPU_BACKENDS)}")
    if args.dtypes:
        unknown = set(args.dtypes) - set(DTYPES)
        if unknown:
            p.error(f"--dtypes: unknown {sorted(unknown)}; accepted: {', '.join(DTYPES)}")
    if args.passes is not None:
        unknown = set(args.passes) - set(PASSES)
        if unknown or not args.passes:
            p.error(f"--passes: got {sorted(unknown) or 'none'}; accepted: one or more of {', '.join(PASSES)}")
        args.passes = [name for name in PASSES if name in args.passes]
    return args


def pick_device(requested, prog="bench_attention.py"):
    """('cuda' | 'cpu', why not cuda); exits, naming prog, where the requested device cannot run."""
    from flashattn import _extension
    has_kernels = bool(getattr(_extension, "HAS_CUDA_KERNELS", False))
    has_gpu = torch.cuda.is_available()
    if requested == "cpu":
        return "cpu", "CPU run requested with --device cpu"
    if has_gpu and has_kernels:
        return "cuda", ""
    if has_gpu:
        sys.exit(f"{prog}: a GPU is present but flashattn's CUDA kernels were not built "
                 "(flashattn._extension.HAS_CUDA_KERNELS is False). Build them with "
                 "`bash scripts/env.sh` (or pip install --no-build-isolation --no-deps -e .), "
                 "or pass --device cpu for the CPU comparison.")
    if requested == "cuda":
        sys.exit(f"{prog}: --device cuda, but torch sees no CUDA GPU here.")
    return "cpu", "no CUDA GPU visible to torch"


def main(argv=None):
    args = parse_args(argv)
    device, why_cpu = pick_device(args.device)
    if device == "cuda":
        args.dtypes = args.dtypes or (["bf16"] if args.quick else ["bf16", "fp16"])
        args.headdims = args.headdims or list(QUICK_HEADDIMS if args.quick else SWEEP_HEADDIMS)
        args.seqlens = args.seqlens or list(QUICK_SEQLENS if args.quick else SWEEP_SEQLENS)
        bad = [d for d in args.dtypes if d not in ("bf16", "fp16")]
        if bad:
            sys.exit(f"bench_attention.py: --dtypes {bad} not benchmarked on the GPU; accepted: bf16, fp16")
        args.passes = args.passes or list(PASSES)
        if args.train_memory_seqlens is None and args.passes != ["fwd"]:
            args.train_memory_seqlens = list(QUICK_TRAIN_MEMORY_SEQLENS if args.quick else TRAIN_MEMORY_SEQLENS)
        settings = {p: (args.warmup, args.rep) if p == "fwd" else (args.grad_warmup, args.grad_rep)
                    for p in args.passes}
        timers, timing = cuda_timers(settings)
        run = RunInfo("cuda", gpu_header(timing))
        device_slug = slug(run.header["GPU"])
    else:
        args.dtypes = args.dtypes or ["fp32", "bf16"]
        args.headdims = args.headdims or [CPU_HEADDIM]
        args.seqlens = args.seqlens or list(CPU_QUICK_SEQLENS if args.quick else CPU_SEQLENS)
        args.passes = args.passes or ["fwd"]
        run = RunInfo("cpu", cpu_header(why_cpu), list(CPU_NOT_RUN))
        device_slug = "cpu"
        print(f"bench_attention.py: {why_cpu}: running the small CPU comparison "
              "(flashattn's CPU path vs the naive reference). Not run, needs a GPU:", flush=True)
        for item in CPU_NOT_RUN:
            print(f"  - {item}", flush=True)

    out_dir = args.out or RESULTS_ROOT / f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d}-{device_slug}"
    out_dir.mkdir(parents=True, exist_ok=True)

    sweep = Sweep(tuple(args.dtypes), tuple(args.causal), tuple(args.headdims), tuple(args.seqlens),
                  tuple(args.passes), tuple(args.backends), args.tokens, args.model_dim)
    memory_backends = [b for b in ("flashattn", "naive") if b in args.backends]
    started = time.perf_counter()
    if device == "cuda":
        seconds = dict.fromkeys(args.passes, 0.0)  # time spent in each pass, then in the memory tables
        rows = gpu_speed_rows(sweep, timers, seconds)
        memory_started = time.perf_counter()
        for seqlens, shape, training, desc in ((args.memory_seqlens, MEMORY_SHAPE, False, "peak memory"),
                                               (args.train_memory_seqlens, TRAIN_MEMORY_SHAPE, True,
                                                "training-step memory")):
            shapes = [Shape(device="cuda", seqlen=s, **shape) for s in seqlens or ()]
            rows += memory_rows(shapes, memory_backends, training, desc)
        seconds["memory tables"] = time.perf_counter() - memory_started
    else:
        rows = cpu_speed_rows(sweep, args.cpu_budget)
        shapes = [Shape("cpu", "fp32", False, CPU_BATCH, CPU_HEADS, s, args.headdims[0]) for s in args.seqlens]
        rows += memory_rows(shapes, memory_backends, False, "peak memory")
    run.header["wall time"] = f"{time.perf_counter() - started:.0f} s"
    if device == "cuda" and args.passes != ["fwd"]:
        run.header["wall time"] += " (" + ", ".join(f"{PASS_TITLES.get(k, k)} {v:.0f} s"
                                                    for k, v in seconds.items()) + ")"

    write_csv(rows, out_dir / "results.csv")
    text = markdown(run, rows)
    if args.features and device == "cuda":
        if str(REPO_ROOT) not in sys.path:  # run as a script: benchmarks/ is on the path, the repo is not
            sys.path.insert(0, str(REPO_ROOT))
        from benchmarks import bench_features
        feature_timers, _ = cuda_timers({p: (args.grad_warmup, args.grad_rep) for p in bench_features.PASSES})
        features = bench_features.feature_rows(feature_timers, args.quick)
        bench_features.write_csv(features, out_dir / "features.csv")
        text += "\n\n## Options: variable-length batches, sliding windows, extras\n\n" + bench_features.markdown(features)
    (out_dir / "results.md").write_text(text + "\n")
    print()
    print(text)
    print(f"Wrote {out_dir / 'results.csv'} and {out_dir / 'results.md'}")
    failed = [r for r in rows if r.backend == "flashattn" and r.status in ("error", "mismatch")]
    if failed:
        print(f"WARNING: flashattn failed or mismatched on {len(failed)} config(s); see Notes above.")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
