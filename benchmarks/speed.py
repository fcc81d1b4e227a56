"""Speed rows: on each config, every backend's pass is checked once against the reference
(benchmarks/checks.py), then timed on the same inputs, all backends in this process.

The passes:
- fwd: out = fn().
- bwd: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), after one
  forward outside the timed region; FLOPs 2.5x the forward's.
- fwdbwd: out = fn() and torch.autograd.grad(out, (q, k, v), dout) together;
  FLOPs 3.5x the forward's.
"""
import collections
import math
import time

import torch

from benchmarks.backends import (backend_fns, call_capturing_warnings, free_cuda_memory, grad_leaves, grad_step,
                                 short_reason)
from benchmarks.checks import REF_SLICE, WHOLE, check, grad_reference, output_reference
from benchmarks.shapes import CPU_BACKENDS, GPU_BACKENDS, PASSES
from benchmarks.timing import best_of_rounds, cpu_timer, progress
from flashattn.testing import attention_flops


def cpu_timers(budget_s):
    """The timer of every pass on the CPU (benchmarks.timing.cpu_timer), in the form of cuda_timers'."""
    return dict.fromkeys(PASSES, cpu_timer(budget_s))


def sweep_rows(sweep, device, timers, seconds=None, desc="sweep", rounds=1):
    """Every config of the sweep, each pass, each of its backends that runs on the device.

    timers: {pass: fn -> median ms} (benchmarks.timing.cuda_timers, or cpu_timers);
    seconds[pass], where given, accumulates the time spent; rounds: as pass_rows'."""
    backends = [b for b in (GPU_BACKENDS if device == "cuda" else CPU_BACKENDS) if b in sweep.backends]
    rows = []
    for _, shape in progress(sweep.shapes(device), desc):
        rows += config_rows(shape, backends, sweep.passes, timers, seconds, rounds)
    return rows


def config_rows(shape, backends, passes, timers, seconds=None, rounds=1):
    """The passes of every backend on one config, on one set of inputs; seconds[pass],
    where given, accumulates the time spent; rounds: as pass_rows'."""
    seconds = collections.Counter() if seconds is None else seconds
    scale = 1.0 / math.sqrt(shape.headdim)
    where = REF_SLICE if shape.device == "cuda" else WHOLE  # the GPU's fp32 reference runs on a slice
    grad_passes = [p for p in passes if p != "fwd"]
    release(shape.device)
    q, k, v, *rest = shape.inputs(count=4 if grad_passes else 3)
    rows = []
    skip = {}  # backend -> why its gradient passes do not run
    if "fwd" in passes:
        started = time.perf_counter()
        reference = output_reference(q, k, v, scale, shape.causal, where)
        fns, contexts = backend_fns(q, k, v, shape.causal, scale)
        steps = {name: (lambda name=name: fns[name], contexts[name]) for name in fns}
        rows += pass_rows(shape, "fwd", backends, steps, reference, timers["fwd"], skip, rounds)
        del reference, fns, contexts, steps
        if any(r.backend == "naive" and r.status == "OOM" for r in rows):
            skip["naive"] = "not run: the naive forward already ran out of memory"
        seconds["fwd"] += time.perf_counter() - started
    if grad_passes:
        dout = rest[0]
        started = time.perf_counter()
        reference = grad_reference(q, k, v, dout, scale, shape.causal, where)
        inputs = grad_leaves((q, k, v))
        fns, contexts = backend_fns(*inputs, shape.causal, scale)
        for pass_ in grad_passes:  # the first one's time includes the reference's gradients
            steps = {name: (lambda name=name: grad_step(fns[name], inputs, dout, pass_), contexts[name])
                     for name in fns}
            rows += pass_rows(shape, pass_, backends, steps, reference, timers[pass_], skip, rounds)
            seconds[pass_] += time.perf_counter() - started
            started = time.perf_counter()
    return rows


def pass_rows(shape, pass_, backends, steps, reference, timer, skip, rounds=1):
    """One pass of every backend: check its result once, then time its call.

    steps: {backend: (make_step, context)}, make_step() -> the call to time, whose
    result is out (fwd) or (dq, dk, dv); skip: {backend: why not run}. rounds > 1:
    the checked backends' calls are timed in turn, round after round, each keeping
    its best median (benchmarks/timing.py: best_of_rounds), so that no backend's
    figure is one window of the GPU's state (its clock moves with power and heat
    from one window to the next); their steps (a bwd step holds its forward's
    graph) stay alive until the rounds end.
    """
    flops = attention_flops(shape.batch, shape.heads, shape.seqlen, shape.headdim, shape.causal, pass_)
    rows = []
    in_rounds = {}  # backend -> (row, step, context), checked and timed after the loop (rounds > 1)
    for name in backends:
        row = shape.row(name, pass_)
        rows.append(row)
        if name in skip:
            row.status, row.notes = "OOM", skip[name]
            continue
        make_step, context = steps[name]
        step = None
        try:
            with context():
                step = call_capturing_warnings(make_step)
                check(row, call_capturing_warnings(step), reference)
        except torch.cuda.OutOfMemoryError:
            row.status = "OOM"
        except Exception as exc:
            row.status = "error" if name in ("flashattn", "flashattn_det") else "n/a"
            row.notes = short_reason(exc)
        release(shape.device)
        if row.status in ("ok", "mismatch"):
            if rounds > 1:
                in_rounds[name] = (row, step, context)
                continue
            time_row(row, timer, step, context, flops)
        step = None  # a bwd step holds its forward's graph
        release(shape.device)
    if in_rounds:
        time_rows_in_rounds(in_rounds, timer, flops, rounds)
        in_rounds.clear()
        step = None  # the last backend's, kept by its `continue`
        release(shape.device)
    return rows


def time_row(row, timer, step, context, flops):
    """The median time of step() and its TFLOP/s into the row, or OOM / error where timing fails."""
    try:
        with context():
            row.median_ms = call_capturing_warnings(lambda: timer(step))
        row.tflops = flops / (row.median_ms * 1e-3) / 1e12
    except torch.cuda.OutOfMemoryError:
        row.status = "OOM"
    except Exception as exc:
        row.status, row.notes = "error", short_reason(f"while timing: {exc}")


def time_rows_in_rounds(in_rounds, timer, flops, rounds):
    """in_rounds: {backend: (row, step, context)}. Each step's median time, best of `rounds` rounds
    that take the backends in turn, and its TFLOP/s into its row, or OOM / error where timing fails."""
    def measure(step, context):
        with context():
            return call_capturing_warnings(lambda: timer(step))
    best, failed = best_of_rounds({name: (lambda step=step, context=context: measure(step, context))
                                   for name, (_, step, context) in in_rounds.items()}, rounds)
    for name, (row, _, _) in in_rounds.items():
        if name in best:
            row.median_ms = best[name]
            row.tflops = flops / (row.median_ms * 1e-3) / 1e12
        elif failed[name] == "OOM":
            row.status = "OOM"
        else:
            row.status, row.notes = "error", short_reason(f"while timing: {failed[name]}")


def release(device):
    if device == "cuda":
        free_cuda_memory()
