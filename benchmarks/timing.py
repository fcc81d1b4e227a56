"""How a call is timed: triton's do_bench (CUDA events where triton is missing) on the GPU,
time.perf_counter on the CPU; and the progress shown while a run goes on."""
import statistics
import sys
import time

import torch

from benchmarks.shapes import PASS_TITLES

# Every timing starts after HEAT_MS of the call back to back (do_bench's warm-up), so that each
# backend is timed at the clock its own sustained load gets. Under load the H200 holds its top clock
# (1980 MHz) for about the first 100 ms, until its 700 W power cap lowers it to 1600-1800 MHz
# (nvidia-smi: clock-event reason SW power cap). With a 10 ms warm-up the first backend timed after
# any idle got that window and the others did not: d256 causal 8k backward, ours 510 TFLOP/s in the
# first window against 453 sustained, cuDNN 378 sustained, so a best-of-rounds ratio of 1.35 where
# the sustained one is 1.21 (benchmarks/NOTES.md, round 43). In that probe the second window, after
# about 80 ms of load, already read within 2% of the sustained time; 200 ms leaves a margin.
HEAT_MS = 200
FWD_WARMUP_MS, FWD_REP_MS = HEAT_MS, 100
# do_bench's repetition time of the bwd and fwdbwd passes: shorter than the
# forward's, as a backward call is 2-3x a forward call; the median still comes
# from dozens of calls.
GRAD_WARMUP_MS, GRAD_REP_MS = HEAT_MS, 50
# {pass: (warmup_ms, rep_ms)} of the speed sweep.
DEFAULT_SETTINGS = {p: (FWD_WARMUP_MS, FWD_REP_MS) if p == "fwd" else (GRAD_WARMUP_MS, GRAD_REP_MS)
                    for p in PASS_TITLES}
# Bigger than the H100's 50 MB L2: zeroing it evicts the previous call's data.
L2_FLUSH_BYTES = 256 * 2**20


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


# Timings of each backend of one comparison, taken in turn (A, B, C, A, B, ...); each keeps its best
# median. One window per backend let a slow window decide a ratio: the first timing of d128 S 8k causal
# in a process read 494 TFLOP/s where the next rounds of the same process read 568-591 (NOTES.md,
# eighth session).
ROUNDS = 3


def best_of_rounds(measures, rounds=ROUNDS):
    """measures: {name: zero-argument function returning milliseconds}. Each is called `rounds` times,
    in turn; returns ({name: best ms}, {name: why it failed}). A measure that raises (OOM, a backend
    that refuses the shape) is not called again and gets "OOM" or the exception's first line."""
    best, failed = {}, {}
    for _ in range(rounds):
        for name, measure in measures.items():
            if name in failed:
                continue
            try:
                best[name] = min(best.get(name, float("inf")), measure())
            except torch.cuda.OutOfMemoryError:
                failed[name] = "OOM"
            except Exception as exc:  # noqa: BLE001 - a backend's refusal is a result, not the end of the run
                failed[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
    return {name: ms for name, ms in best.items() if name not in failed}, failed


def cpu_timer(budget_s, min_reps=3, max_reps=7):
    """A timer of fn() in median milliseconds of wall-clock time: one warm-up call, then
    min_reps to max_reps calls, as many as fit budget_s seconds."""
    def timer(fn):
        fn()
        times = []
        started = time.perf_counter()
        while len(times) < max_reps and (len(times) < min_reps or time.perf_counter() - started < budget_s):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e3
    return timer


def progress(items, desc):
    """A tqdm bar when tqdm is installed and stderr is a terminal, else one
    printed line per item (a log file keeps them readable). items: (label, ...) tuples."""
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
