"""Context parallelism (flashattn.parallel): a causal training step (forward + backward) of one sequence
split over N GPUs, against one GPU.

Per sequence length (B = 1, total S tokens, zig-zag sharding, bf16) and method (ring, ulysses) it
records the step time (the slowest rank's median), tokens/s per GPU, TFLOP/s per GPU (causal
fwd+bwd FLOPs, flashattn.testing), the peak memory of a rank, and for the ring the time of the same
step with compute only (no sends: each step reuses the local block) and with communication only (the
same sends, no attention): hidden = (compute + comm - step) / comm, the share of the communication
that overlaps the attention. One GPU runs flash_attn_func on the whole sequence at every length that
fits; scaling efficiency = (tokens/s per GPU at N) / (tokens/s at 1), at the same length, or where
one GPU does not fit the length, the ratio of TFLOP/s per GPU to one GPU's at its longest length
(marked *). Writes parallel.md and parallel.csv to --out.

    python -m benchmarks parallel --nproc 2                 # spawns 2 processes, one GPU each (NCCL)
    torchrun --nproc-per-node 2 -m benchmarks parallel      # the same under torchrun
    python -m benchmarks parallel --dry-run --out /tmp/cp   # CPU, gloo, 2 ranks, tiny sizes: checks the plumbing

Steps are timed with time.perf_counter around a synchronised step (steps take 10 ms to tens of
seconds), median of --reps after one warm-up. A 1M-token step takes about 16 s per method on 2 H200s
(40 s on one): split long runs with --seqlens to stay within a time limit.
"""
import csv
import datetime
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.arguments import add_out, choice_list, int_list
from benchmarks.environment import cpu_header, dated_folder, gpu_header, header_lines, results_folder, slug
from flashattn import flash_attn_func
from flashattn.parallel import _Ring, _RingAttention, ring_attention, ulysses_attention
from flashattn.testing import attention_flops, free_loopback_port

HELP = "GPUs: context-parallel training step (ring, Ulysses) over N GPUs against one (--dry-run: CPU plumbing check)"
METHODS = ("ring", "ulysses")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DRY_RUN = {"seqlens": [64, 96], "heads": 4, "head_dim": 16, "dtype": "fp32", "reps": 1, "nproc": 2}
COLUMNS = ("method", "gpus", "seqlen", "step_ms", "tokens_per_s_per_gpu", "tflops_per_gpu", "peak_gib",
           "compute_ms", "comm_ms", "hidden", "efficiency")


def add_arguments(parser):
    parser.add_argument("--nproc", type=int, default=None,
                        help="processes (one GPU each) when not under torchrun (default: every GPU torch sees)")
    parser.add_argument("--seqlens", type=int_list, default=[131072, 262144, 524288, 1048576],
                        help="total tokens per sequence, comma list (each a multiple of 2 * nproc)")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    parser.add_argument("--methods", type=choice_list(METHODS, ordered=True), default=list(METHODS),
                        help="comma list of ring, ulysses")
    parser.add_argument("--reps", type=int, default=3, help="timed steps per measurement, after one warm-up")
    parser.add_argument("--no-single", action="store_true", help="skip the one-GPU runs")
    parser.add_argument("--dry-run", action="store_true",
                        help=f"CPU and gloo, {DRY_RUN['nproc']} ranks, tiny sizes: the plumbing, no figures")
    add_out(parser, "benchmarks/results/<date>-<gpu>-parallel")


def run(args):
    if args.dry_run:
        for name, value in DRY_RUN.items():
            setattr(args, name, value)
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("python -m benchmarks parallel: needs CUDA GPUs (or --dry-run)", flush=True)
        return 2
    torchrun = "WORLD_SIZE" in os.environ and "RANK" in os.environ
    nproc = int(os.environ["WORLD_SIZE"]) if torchrun else (args.nproc or torch.cuda.device_count())
    bad = [s for s in args.seqlens if s % (2 * nproc)]
    if nproc < 1 or bad or args.heads < 1 or args.reps < 1:
        print(f"python -m benchmarks parallel: need nproc >= 1 ({nproc}), heads and reps >= 1, and seqlens that "
              f"are multiples of 2 * nproc = {2 * nproc} (not: {bad})", flush=True)
        return 2
    if device == "cuda" and not torchrun and nproc > torch.cuda.device_count():
        print(f"python -m benchmarks parallel: --nproc {nproc} but torch sees {torch.cuda.device_count()} GPUs",
              flush=True)
        return 2
    if args.dry_run:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback only
    timing = f"time.perf_counter around synchronised steps, median of {args.reps} after a warm-up"
    header = {**cpu_header("--dry-run: CPU and gloo, tiny sizes; no figures"), "timing": timing} if args.dry_run \
        else gpu_header(timing)
    folder = results_folder(args.out, dated_folder(f"{slug(header.get('GPU', 'cpu'))}-parallel"))
    if torchrun:
        _worker(int(os.environ["RANK"]), nproc, None, device, args, folder, header)
    else:
        mp.spawn(_worker, args=(nproc, free_loopback_port(), device, args, folder, header), nprocs=nproc)
    return 0


def _worker(rank, world_size, port, device, args, folder, header):
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    init = "env://" if port is None else f"tcp://127.0.0.1:{port}"
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(minutes=30))
    try:
        rows = []
        if rank == 0 and not args.no_single:
            rows += [_single_row(seqlen, device, args) for seqlen in args.seqlens]
        dist.barrier()
        for method in args.methods:
            for seqlen in args.seqlens:
                rows.append(_parallel_row(method, seqlen, rank, world_size, device, args))
        if rank == 0:
            _write(rows, folder, header, args)
    finally:
        dist.destroy_process_group()


def _inputs(shape, heads, args, device, rank=0, world_size=1):
    """Random q, k, v (requiring grad) and dout of rank's shard of (batch, seqlen, heads, head_dim)."""
    gen = torch.Generator(device=device).manual_seed(rank)
    local = (shape[0], shape[1] // world_size, heads, args.head_dim)

    def make():
        return torch.randn(local, generator=gen, device=device, dtype=DTYPES[args.dtype])
    q, k, v = (make().requires_grad_() for _ in range(3))
    return q, k, v, make()


def _training_step(attention, q, k, v, dout):
    def step():
        out = attention(q, k, v)
        torch.autograd.grad(out, (q, k, v), dout)
    return step


def _timed(step, reps, device, group_max=True):
    """Median seconds of reps synchronised steps after a warm-up (the slowest rank's, with group_max);
    None when the step runs out of memory."""
    def sync():
        if device == "cuda":
            torch.cuda.synchronize()
    times = []
    try:
        for rep in range(reps + 1):
            if group_max:
                dist.barrier()
            sync()
            start = time.perf_counter()
            step()
            sync()
            if rep:
                times.append(time.perf_counter() - start)
        seconds = statistics.median(times)
    except torch.OutOfMemoryError:
        seconds = float("inf")
    if group_max:
        seconds = _group_max(seconds, device)
    return None if seconds == float("inf") else seconds


def _group_max(value, device):
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _peak_gib(device):
    if device != "cuda":
        return None
    return _group_max(torch.cuda.max_memory_allocated() / 2**30, device)


def _reset_peak(device):
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _single_row(seqlen, device, args):
    """One GPU (rank 0 alone): flash_attn_func on the whole sequence; seconds None where it does not fit."""
    _reset_peak(device)
    try:
        q, k, v, dout = _inputs((1, seqlen), args.heads, args, device)
        step = _training_step(lambda q, k, v: flash_attn_func(q, k, v, causal=True), q, k, v, dout)
        seconds = _timed(step, args.reps, device, group_max=False)
    except torch.OutOfMemoryError:
        seconds = None
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" and seconds else None
    return _row("single", 1, seqlen, seconds, peak, args)


def _parallel_row(method, seqlen, rank, world_size, device, args):
    if method == "ulysses" and args.heads % world_size:
        return _row(method, world_size, seqlen, None, None, args, note="heads % gpus != 0")
    _reset_peak(device)
    q, k, v, dout = _inputs((1, seqlen), args.heads, args, device, rank, world_size)
    attention = ring_attention if method == "ring" else ulysses_attention
    seconds = _timed(_training_step(lambda q, k, v: attention(q, k, v, causal=True), q, k, v, dout), args.reps,
                     device)
    peak = _peak_gib(device)
    compute = comm = None
    if method == "ring" and seconds is not None:
        scale = args.head_dim**-0.5
        compute_only = _ComputeOnly(rank, world_size)
        compute = _timed(_training_step(
            lambda q, k, v: _RingAttention.apply(q, k, v, compute_only, scale, True, 0.0, False, "zigzag")[0],
            q, k, v, dout), args.reps, device)
        comm = _timed(lambda: _ring_traffic(_Ring(None), k.detach(), v.detach()), args.reps, device)
    return _row(method, world_size, seqlen, seconds, peak, args, compute, comm)


class _ComputeOnly:
    """flashattn.parallel._Ring's interface without the sends: each step gets the local block again."""

    def __init__(self, rank, world_size):
        self.rank, self.world_size = rank, world_size

    def start(self, tensors, step=None):
        return tensors

    @staticmethod
    def wait(pending):
        return pending


def _ring_traffic(ring, k, v):
    """The ring's sends of one training step without its attention: K/V world - 1 times forward, and
    backward K/V world - 1 times and the fp32 dK/dV accumulators world times."""
    kv = (k, v)
    for _ in range(ring.world_size - 1):
        kv = ring.wait(ring.start(kv))
    kv, grads = (k, v), (k.float(), v.float())
    for step in range(ring.world_size):
        incoming = ring.start(kv) if step + 1 < ring.world_size else None
        grads = ring.wait(ring.start(grads))
        if incoming is not None:
            kv = ring.wait(incoming)


def _row(method, gpus, seqlen, seconds, peak, args, compute=None, comm=None, note=""):
    flops = attention_flops(1, args.heads, seqlen, args.head_dim, True, "fwdbwd")
    row = dict.fromkeys(COLUMNS)
    row.update(method=method, gpus=gpus, seqlen=seqlen, peak_gib=peak, note=note or ("" if seconds else "OOM"))
    if seconds:
        row.update(step_ms=seconds * 1e3, tokens_per_s_per_gpu=seqlen / seconds / gpus,
                   tflops_per_gpu=flops / seconds / gpus / 1e12)
    if compute and comm and seconds:
        row.update(compute_ms=compute * 1e3, comm_ms=comm * 1e3,
                   hidden=min(1.0, max(0.0, (compute + comm - seconds) / comm)))
    return row


def _efficiencies(rows):
    """Each multi-GPU row's efficiency against the one-GPU row of its length, or (marked *) the TFLOP/s
    ratio against the longest length one GPU ran."""
    single = {r["seqlen"]: r for r in rows if r["method"] == "single" and r["step_ms"]}
    longest = single[max(single)] if single else None
    for row in rows:
        if row["method"] == "single" or not row["step_ms"]:
            continue
        if row["seqlen"] in single:
            row["efficiency"] = f"{row['tokens_per_s_per_gpu'] / single[row['seqlen']]['tokens_per_s_per_gpu']:.3f}"
        elif longest:
            row["efficiency"] = f"{row['tflops_per_gpu'] / longest['tflops_per_gpu']:.3f}*"


def _write(rows, folder, header, args):
    _efficiencies(rows)
    columns = (*COLUMNS, "note")
    with open(folder / "parallel.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows({c: _cell(row[c]) for c in columns} for row in rows)
    lines = [f"# Context parallelism: causal training step, B=1, H={args.heads}, D={args.head_dim}, {args.dtype}",
             "", *header_lines(header), f"- command: {getattr(args, 'command_line', 'python -m benchmarks parallel')}",
             "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row[c]) for c in columns) + " |" for row in rows]
    lines += ["", "efficiency: tokens/s per GPU over one GPU's at the same length; * where one GPU does not fit it: "
              "TFLOP/s per GPU over one GPU's at its longest length. hidden: (compute + comm - step) / comm."]
    (folder / "parallel.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


def _cell(value):
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3f}" if value < 100 else f"{value:.0f}"
    return str(value)
