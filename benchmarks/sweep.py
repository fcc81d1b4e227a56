"""`python -m benchmarks sweep` (scripts/bench.sh): forward and backward speed of flashattn
against PyTorch's SDPA backends and the naive reference, and peak memory.

On a GPU (CUDA available and flashattn's kernels built) it runs the
FlashAttention sweep: bf16 and fp16, B*S = 16384 tokens, H*D = 2048, head dims
64/128/256, S from 512 to 16k, causal and not; for each shape and each pass
(fwd, bwd, fwdbwd: benchmarks/speed.py) it times flashattn, SDPA's
FLASH_ATTENTION, CUDNN_ATTENTION and EFFICIENT_ATTENTION backends and the naive
reference (all in this process, on the same tensors). It also measures the peak
memory of one forward, and of one training step (forward + backward, B=1 H=16
D=128 bf16, S up to 64k), for flashattn and the naive reference.

On a CPU-only machine it runs a small CPU comparison instead (flashattn's
blockwise CPU path against the naive reference; the forward, and with --passes
the gradients too), with the peak of torch's CPU allocator during one forward,
and says what it could not run.

Results: results.csv (one row per config x pass x backend) and results.md
(header with GPU, versions, commit, date; one table per dtype and pass; the
memory tables) in --out, and the Markdown tables printed last on stdout.

Before any timing, each backend's output (its gradients dq, dk, dv in the bwd
and fwdbwd passes) is checked against the fp32 reference on a slice of the batch
and heads with the tests' bound (benchmarks/checks.py), so that a broken kernel
cannot post a fast number: a mismatch is shown as such instead of its speed.
"""
import time

from benchmarks import features
from benchmarks.arguments import add_device, add_out, choice_list, int_list
from benchmarks.environment import (cpu_header, dated_folder, gpu_header, header_lines, pick_device,
                                    results_folder, slug)
from benchmarks.peak_memory import memory_rows
from benchmarks.shapes import (CPU_BATCH, CPU_HEADDIM, CPU_HEADS, DEFAULT_GPU_BACKENDS, DTYPES, GPU_BACKENDS,
                               OPT_IN_BACKENDS, PASS_TITLES, PASSES,
                               SWEEP_HEADDIMS, SWEEP_MODEL_DIM, SWEEP_SEQLENS, SWEEP_TOKENS, Shape, Sweep)
from benchmarks.speed import cpu_timers, sweep_rows
from benchmarks.tables import memory_table, notes_lines, speed_tables, write_csv
from benchmarks.timing import FWD_REP_MS, FWD_WARMUP_MS, GRAD_REP_MS, GRAD_WARMUP_MS, cuda_timers

PROG = "python -m benchmarks sweep"
HELP = "the speed sweep and memory tables into results.csv and results.md (scripts/bench.sh)"
QUICK_SEQLENS = (2048, 8192)
CPU_SEQLENS = (256, 512, 1024, 2048)
CPU_QUICK_SEQLENS = (256, 512)

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

CPU_NOT_RUN = [
    "the TFLOP/s sweep of flashattn's CUDA kernels, forward, backward and forward + backward "
    "(bf16/fp16, B*S = 16k tokens, H*D = 2048, S 512..16k)",
    "the SDPA baselines: FLASH_ATTENTION, CUDNN_ATTENTION, EFFICIENT_ATTENTION",
    "the measured peak CUDA memory of one forward (flashattn vs naive, B=4 H=32 D=64 fp16 causal)",
    "the measured peak CUDA memory of a training step, forward + backward "
    "(flashattn vs naive, B=1 H=16 D=128 bf16, S 4k..64k)",
]


def add_arguments(p):
    p.epilog = ("Defaults follow the device: the full GPU sweep on a GPU, a small CPU comparison otherwise. "
                "The git commit is read with git; where the tree is no git checkout, FLASHATTN_COMMIT is used.")
    add_out(p, "benchmarks/results/<YYYY-MM-DD>-<gpu-slug>")
    p.add_argument("--quick", action="store_true",
                   help="a small subset: GPU bf16, D 64/128/256, S 2048/8192, all passes, training-step "
                        "memory at S 8192 and 65536; CPU S 256/512")
    p.add_argument("--passes", type=choice_list(PASSES, ordered=True), default=None,
                   help=f"comma list out of {','.join(PASSES)} (default: all on a GPU, fwd on the CPU)")
    add_device(p)
    p.add_argument("--dtypes", type=choice_list(tuple(DTYPES)), default=None,
                   help="comma list of bf16,fp16 (GPU) or fp32,bf16 (CPU)")
    p.add_argument("--headdims", type=int_list, default=None)
    p.add_argument("--seqlens", type=int_list, default=None)
    p.add_argument("--causal", choices=("both", "true", "false"), default="both")
    p.add_argument("--backends", type=choice_list(GPU_BACKENDS), default=list(DEFAULT_GPU_BACKENDS),
                   help=f"comma list out of {','.join(GPU_BACKENDS)} (default: all but {','.join(OPT_IN_BACKENDS)})")
    p.add_argument("--tokens", type=int, default=SWEEP_TOKENS, help="B*S of each GPU config")
    p.add_argument("--model-dim", type=int, default=SWEEP_MODEL_DIM, help="H*D of each GPU config")
    p.add_argument("--memory-seqlens", type=int_list, default=list(MEMORY_SEQLENS),
                   help="sequence lengths of the peak-memory table of one forward ('' to skip it)")
    p.add_argument("--train-memory-seqlens", type=int_list, default=None,
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
    p.add_argument("--rounds", type=int, default=1,
                   help="time each config's backends in turn, this many rounds, each keeping its best median "
                        "(default 1: each backend timed once, right after its check)")
    p.add_argument("--features", action="store_true",
                   help="GPU: also time variable-length batches, sliding windows, softcap, ALiBi and dropout "
                        "(benchmarks/features.py) into features.csv and a section of results.md")
    p.add_argument("--cpu-budget", type=float, default=0.5,
                   help="CPU run: seconds of timed repeats per measurement (3 calls at least)")


def run(args):
    if args.rounds < 1:
        raise SystemExit(f"{PROG}: --rounds {args.rounds}: at least 1")
    device, why_cpu = pick_device(args.device, PROG)
    causal = {"both": (False, True), "true": (True,), "false": (False,)}[args.causal]
    if device == "cuda":
        dtypes = args.dtypes or (["bf16"] if args.quick else ["bf16", "fp16"])
        if set(dtypes) - {"bf16", "fp16"}:
            raise SystemExit(f"{PROG}: --dtypes {dtypes} not benchmarked on the GPU; accepted: bf16, fp16")
        headdims = args.headdims or SWEEP_HEADDIMS  # --quick keeps every head dim
        seqlens = args.seqlens or (QUICK_SEQLENS if args.quick else SWEEP_SEQLENS)
        passes = args.passes or list(PASSES)
        train_seqlens = args.train_memory_seqlens
        if train_seqlens is None and passes != ["fwd"]:
            train_seqlens = QUICK_TRAIN_MEMORY_SEQLENS if args.quick else TRAIN_MEMORY_SEQLENS
        timers, timing = cuda_timers({p: (args.warmup, args.rep) if p == "fwd" else (args.grad_warmup, args.grad_rep)
                                      for p in passes})
        header, not_run = gpu_header(timing), []
        folder = slug(header["GPU"])
    else:
        dtypes = args.dtypes or ["fp32", "bf16"]
        headdims = args.headdims or [CPU_HEADDIM]
        seqlens = args.seqlens or (CPU_QUICK_SEQLENS if args.quick else CPU_SEQLENS)
        passes = args.passes or ["fwd"]
        timers, header, not_run, folder = cpu_timers(args.cpu_budget), cpu_header(why_cpu), CPU_NOT_RUN, "cpu"
        print(f"{PROG}: {why_cpu}: running the small CPU comparison "
              "(flashattn's CPU path vs the naive reference). Not run, needs a GPU:", flush=True)
        for item in CPU_NOT_RUN:
            print(f"  - {item}", flush=True)
    if args.rounds > 1:
        header["timing"] += f"; best of {args.rounds} rounds, a config's backends timed in turn"
    out = results_folder(args.out, dated_folder(folder))

    sweep = Sweep(tuple(dtypes), causal, tuple(headdims), tuple(seqlens), tuple(passes), tuple(args.backends),
                  args.tokens, args.model_dim)
    memory_backends = [b for b in ("flashattn", "naive") if b in args.backends]
    started = time.perf_counter()
    seconds = dict.fromkeys(passes, 0.0)  # time spent in each pass, then in the memory tables
    rows = sweep_rows(sweep, device, timers, seconds, desc=f"{device} sweep", rounds=args.rounds)
    memory_started = time.perf_counter()
    if device == "cuda":
        for sizes, shape, training, desc in ((args.memory_seqlens, MEMORY_SHAPE, False, "peak memory"),
                                             (train_seqlens, TRAIN_MEMORY_SHAPE, True, "training-step memory")):
            shapes = [Shape(device="cuda", seqlen=s, **shape) for s in sizes or ()]
            rows += memory_rows(shapes, memory_backends, training, desc)
    else:
        shapes = [Shape("cpu", "fp32", False, CPU_BATCH, CPU_HEADS, s, headdims[0]) for s in seqlens]
        rows += memory_rows(shapes, memory_backends, False, "peak memory")
    seconds["memory tables"] = time.perf_counter() - memory_started
    header["wall time"] = f"{time.perf_counter() - started:.0f} s"
    if device == "cuda" and passes != ["fwd"]:
        header["wall time"] += " (" + ", ".join(f"{PASS_TITLES.get(k, k)} {v:.0f} s" for k, v in seconds.items()) + ")"

    write_csv(rows, out / "results.csv")
    text = markdown(device, header, not_run, rows)
    if args.features and device == "cuda":
        feature_timers, _ = cuda_timers({p: (args.grad_warmup, args.grad_rep) for p in features.PASSES})
        feature_rows = features.feature_rows(feature_timers, args.quick)
        features.write_csv(feature_rows, out / "features.csv")
        text += ("\n\n## Options: variable-length batches, sliding windows, extras\n\n"
                 + features.markdown(feature_rows))
    (out / "results.md").write_text(text + "\n")
    print()
    print(text)
    print(f"Wrote {out / 'results.csv'} and {out / 'results.md'}")
    failed = [r for r in rows if r.backend == "flashattn" and r.status in ("error", "mismatch")]
    if failed:
        print(f"WARNING: flashattn failed or mismatched on {len(failed)} config(s); see Notes above.")
        return 1
    return 0


def markdown(device, header, not_run, rows):
    passes = [p for p in PASSES if any(r.pass_ == p for r in rows if r.kind == "speed")] or ["fwd"]
    title = (f"flashattn {', '.join(PASS_TITLES[p] for p in passes)} benchmark"
             + (" (CPU run)" if device == "cpu" else ""))
    lines = [f"# {title}", ""] + header_lines(header) + [""]
    if not_run:
        lines += ["**CPU run: no GPU here. Not run (they need a GPU with flashattn's CUDA kernels built):**", ""]
        lines += [f"- {item}" for item in not_run] + [""]
    lines += ["Cells: speed, or `n/a` (backend refused the shape; see Notes), `OOM`, "
              "`mismatch` (output past the tests' bound against the fp32 reference: speed withheld, see CSV), "
              "`error`. Max abs diffs are in results.csv.", ""]
    if passes != ["fwd"]:
        lines += ["Passes: FLOPs are 4*B*H*S*S*D, halved for causal, times the pass's multiplier. "
                  "The backward times torch.autograd.grad(out, (q, k, v), dout, retain_graph=True) after "
                  "one forward outside the timed region; forward + backward times out = fn() and "
                  "torch.autograd.grad(out, (q, k, v), dout) together. Their check compares the gradients "
                  "dq, dk, dv, each within 3x the error of PyTorch's own gradients in the same dtype.", ""]
    lines += speed_tables(rows, device)
    lines += memory_table(rows, "fwd")
    lines += memory_table(rows, "fwdbwd")
    lines += notes_lines(rows)
    return "\n".join(lines)
