"""Forward speed of each kernel family of this build against SDPA's cuDNN backend, in one run
(GPU only):

    python -m benchmarks families [--out DIR] [--head-dims 64,128] [--seqlens 2048,8192] [--dtype bf16,fp16]

Shapes as the sweep's: B * S = 16k tokens, H * D = 2048, Sq = Sk, causal and not. The default family of
the GPU (sm90 on an H100 whose build includes 9.0a) runs in this process; every other family that runs
on the GPU (sm80) runs the same shapes in a child process with FLASHATTN_FAMILY set (the binding reads
it once per process), on the same GPU, right after. cuDNN and SDPA's flash backend run in this process.
Each row also gives the largest difference between the default family's output and cuDNN's, as a
sanity check (the tests are the correctness check). FlashAttention-4 gets a column when it imports
(benchmarks/backends.py: flash_attention_4, FLASHATTN_FA4_DIR). Several dtypes (--dtype bf16,fp16)
give a table each, in one run. TFLOP/s = 4 * B * H * S^2 * D, halved for causal, over the
median time.

Each in-process backend of a row (the default family, cuDNN, SDPA flash, FlashAttention-4) is timed
three times in turn (ours, cuDNN, flash, FA4, ours, ...) and keeps its best median
(benchmarks/timing.py: best_of_rounds, which says why); the child family's shapes likewise, in its
own process.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch

from benchmarks.arguments import add_out, int_list
from benchmarks.backends import SDPA_BACKENDS, fa4_fn, flash_attention_4, sdpa_fn
from benchmarks.environment import REPO_ROOT, dated_folder, header_lines, results_folder, slug, start_gpu_run
from benchmarks.timing import FWD_REP_MS, FWD_WARMUP_MS, best_of_rounds
from flashattn.testing import attention_flops

HELP = "the forward of each kernel family against SDPA cuDNN, one run (GPU)"
TOKENS, WIDTH = 16384, 2048  # B * S and H * D of every shape
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
OTHER_FAMILIES = ["sm80"]  # forced in a child process where the default family is another one


def add_arguments(parser):
    add_out(parser, "benchmarks/results/<date>-<gpu>-families")
    parser.add_argument("--head-dims", type=int_list, default=[64, 128])
    parser.add_argument("--seqlens", type=int_list, default=[2048, 8192])
    parser.add_argument("--dtype", type=dtype_list, default=["bf16"], help="bf16, fp16 or both: bf16,fp16")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # prints JSON rows only


def dtype_list(text):
    """--dtype: one or more of DTYPES, comma-separated."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in DTYPES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"--dtype takes {' or '.join(DTYPES)} (comma-separated), not {text!r}")
    return names


def shapes(args):
    for head_dim in args.head_dims:
        for seqlen in args.seqlens:
            for causal in (False, True):
                yield head_dim, seqlen, causal


def inputs(head_dim, seqlen, dtype):
    gen = torch.Generator(device="cuda").manual_seed(head_dim * 100003 + seqlen)
    shape = (TOKENS // seqlen, seqlen, WIDTH // head_dim, head_dim)
    return [torch.randn(shape, generator=gen, dtype=dtype, device="cuda") for _ in range(3)]


def time_flashattn(args, dtype, timer):
    """{(head_dim, seqlen, causal): ms} of this process's family (the child's timings) in dtype."""
    import flashattn
    times = {}
    for head_dim, seqlen, causal in shapes(args):
        q, k, v = inputs(head_dim, seqlen, DTYPES[dtype])
        best, failed = best_of_rounds(
            {"ours": lambda: timer(lambda: flashattn.flash_attn_func(q, k, v, causal=causal))})
        if failed:
            raise RuntimeError(failed["ours"])
        times[(head_dim, seqlen, causal)] = best["ours"]
    return times


def run_child(args, dtype, family):
    """The same shapes timed in a child process with FLASHATTN_FAMILY=family: ({shape: ms}), or an error."""
    argv = [sys.executable, "-m", "benchmarks", "families", "--child", "--dtype", dtype,
            "--head-dims", ",".join(map(str, args.head_dims)), "--seqlens", ",".join(map(str, args.seqlens))]
    result = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True,
                            env={**os.environ, "FLASHATTN_FAMILY": family})
    if result.returncode != 0:
        return None, result.stderr.strip().splitlines()[-1:] or ["failed"]
    rows = json.loads(result.stdout.strip().splitlines()[-1])
    return {tuple(row["shape"]): row["ms"] for row in rows["times"]}, rows["family"]


def run(args):
    started = start_gpu_run("benchmarks families", {"fwd": (FWD_WARMUP_MS, FWD_REP_MS)})
    if started is None:
        return 1
    timers, header = started
    timer = timers["fwd"]
    import flashattn
    family = flashattn.kernel_family()
    if args.child:
        print(json.dumps({"family": family,
                          "times": [{"shape": list(shape), "ms": ms}
                                    for shape, ms in time_flashattn(args, args.dtype[0], timer).items()]}))
        return 0

    fa4, fa4_missing = flash_attention_4()
    tables = []
    for dtype in args.dtype:
        others = {}
        for other in OTHER_FAMILIES:
            if other != family:
                times, name = run_child(args, dtype, other)
                if times is None:
                    print(f"benchmarks families: FLASHATTN_FAMILY={other} failed: {name}", file=sys.stderr)
                else:
                    others[name] = times
        rows = time_rows(args, dtype, family, others, fa4, timer)
        columns = list(rows[0])
        lines = [f"## Forward, {dtype}, TFLOP/s (B * S = {TOKENS}, H * D = {WIDTH})", "",
                 "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        for row in rows:
            cells = [f"{v:.3g}" if isinstance(v, float) and k.startswith("max") else
                     f"{v:.2f}" if isinstance(v, float) and "/" in k else
                     f"{v:.0f}" if isinstance(v, float) else str(v) for k, v in row.items()]
            lines.append("| " + " | ".join(cells) + " |")
        tables.append("\n".join(lines))
        families = [f"{family} (this process)", *(f"{n} (FLASHATTN_FAMILY={n})" for n in others)]
    lines = [f"# Forward of each kernel family, {', '.join(args.dtype)}", "", *header_lines(header),
             f"- families: {', '.join(families)}",
             "- SDPA: cuDNN and flash backends, this process",
             f"- FlashAttention-4: {'flash_attn.cute, this process' if fa4 else 'not run (' + fa4_missing + ')'}"]
    text = "\n".join(lines) + "\n\n" + "\n\n".join(tables) + "\n"
    folder = results_folder(args.out, dated_folder(f"{slug(header['GPU'])}-families"))
    (folder / "families.md").write_text(text)
    print(text)
    return 0


def time_rows(args, dtype, family, others, fa4, timer):
    """The rows of one dtype's table: this process's backends timed in turn, the children's times."""
    import flashattn
    rows = []
    for head_dim, seqlen, causal in shapes(args):
        q, k, v = inputs(head_dim, seqlen, DTYPES[dtype])
        flops = attention_flops(TOKENS // seqlen, WIDTH // head_dim, seqlen, head_dim, causal)
        shape = (head_dim, seqlen, causal)
        sdpa = sdpa_fn(q, k, v, causal, head_dim**-0.5)

        def cudnn(sdpa=sdpa):
            with torch.nn.attention.sdpa_kernel(SDPA_BACKENDS["cudnn"]):
                return sdpa()

        def sdpa_flash(sdpa=sdpa):
            with torch.nn.attention.sdpa_kernel(SDPA_BACKENDS["flash"]):
                return sdpa()

        def ours(q=q, k=k, v=v, causal=causal):
            return flashattn.flash_attn_func(q, k, v, causal=causal)

        fns = {family: ours, "cuDNN": cudnn, "SDPA flash": sdpa_flash}
        if fa4 is not None:  # a shape it refuses (or fails to compile) is a gap in its column, not the end of the run
            fns["FA4"] = fa4_fn(fa4, q, k, v, causal, head_dim**-0.5)
        diff = (ours().float() - cudnn().float()).abs().max().item()
        best, failed = best_of_rounds({name: (lambda fn=fn: timer(fn)) for name, fn in fns.items()})
        for name in (family, "cuDNN"):
            if name in failed:
                raise RuntimeError(f"{name} at {shape}: {failed[name]}")
        for name in ("SDPA flash", "FA4"):
            if name in failed:
                print(f"benchmarks families: {name} at {shape}: {failed[name]}", file=sys.stderr)
        row = {"head dim": head_dim, "S": seqlen, "B": TOKENS // seqlen, "H": WIDTH // head_dim,
               "causal": causal, family: flops / best[family] / 1e9}
        for name, times in others.items():
            row[name] = flops / times[shape] / 1e9
        for name in ("cuDNN", "SDPA flash", *(["FA4"] if fa4 is not None else [])):
            row[name] = flops / best[name] / 1e9 if name in best else float("nan")
        row[f"{family} / cuDNN"] = row[family] / row["cuDNN"]
        if fa4 is not None:
            row[f"{family} / FA4"] = row[family] / row["FA4"]
        row[f"max |{family} - cuDNN|"] = diff
        rows.append(row)
    return rows
