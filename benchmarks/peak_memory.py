"""Peak memory rows: what one forward, or one training step, allocates above its inputs."""
import itertools
import math
import os
import time

import torch

from benchmarks.backends import (backend_fns, call_capturing_warnings, free_cuda_memory, grad_leaves, grad_step,
                                 short_reason)
from benchmarks.shapes import BACKEND_LABELS
from benchmarks.tables import fmt_bytes
from benchmarks.timing import progress

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
    before it (benchmarks.tables.MEMORY_MEASURED says how, per device), peak_mem_bytes adds the
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
