"""The FP8 forward (issue 20) against 16-bit forwards on the same shapes, in one run (GPU):

    python -m benchmarks fp8 [--out DIR] [--head-dims 64,128,256] [--seqlens 2048,4096,8192,16384]
    python -m benchmarks fp8 --dry-run --out /tmp/fp8   # CPU, tiny shapes: checks the plumbing, no figures

Shapes as the sweep's, bf16-equivalent: B * S = 16k tokens, H * D = 2048, Sq = Sk, causal and not.
Columns, each in TFLOP/s (4 * B * H * S^2 * D, halved for causal, over the median time; the FP8 row
counts the same FLOPs as the 16-bit ones):
- FP8: flash_attn_func on float8_e4m3fn q, k, v with q_descale, k_descale and v_descale (fp32 (B, H):
  amax / 448 per sequence and head, as FP8 recipes quantise), out bf16; the whole call timed. On the
  sm90 family it runs the FP8 kernel (flashattn/fp8.py: runs_kernel); the "FP8 path" column says
  which path ran (elsewhere, "dequantised": 16-bit attention on the dequantised values);
- FP8 dequantised: the same call as the dequantising route runs it (flashattn.fp8.dequantize, then
  flash_attn_func in bf16), timed whole: what the FP8 row would read if its call took that route
  (where the kernel runs the FP8 row, the two say which route is faster for the shape);
- ours bf16: flash_attn_func on the same values dequantised to bf16 (this GPU's default family);
- cuDNN bf16: SDPA's cuDNN backend on those bf16 values;
- FA4 bf16: FlashAttention-4 (flash_attn.cute) on them, when it imports (benchmarks/backends.py:
  flash_attention_4, FLASHATTN_FA4_DIR);
- FA3 FP8 and FA3 bf16: FlashAttention-3's sm90 kernels on the same e4m3 values and descales, and on
  the bf16 values, when scripts/stage_fa3.sh's library is there (benchmarks/backends.py:
  flash_attention_3, FLASHATTN_FA3_LIB; head dims 64, 128 and 256). FlashAttention-4 has no FP8 on sm90,
  so FA3 is the FP8 baseline that runs on this GPU;
and the ratios FP8 / FP8 dequantised, FP8 / ours bf16, FP8 / cuDNN (and FP8 / FA4, FP8 / FA3 FP8), and
max |FP8 - ours bf16| (and max |FA3 FP8 - ours bf16|): sanity checks of the FP8 rows
(tests/test_fp8.py bounds our FP8 kernel's error).

The backends of a row are timed in turn (FP8, ours, cuDNN, FA4, FP8, ...), each keeping its best median
(benchmarks/timing.py: best_of_rounds, which says why). results.csv and fp8.md go to the output folder.
"""
import csv
import sys

import torch

from benchmarks.arguments import add_out, int_list
from benchmarks.backends import SDPA_BACKENDS, fa4_fn, flash_attention_3, flash_attention_4, sdpa_fn
from benchmarks.environment import cpu_header, dated_folder, header_lines, results_folder, slug, start_gpu_run
from benchmarks.tables import table_lines
from benchmarks.timing import FWD_REP_MS, FWD_WARMUP_MS, best_of_rounds, cpu_timer
from flashattn.testing import attention_flops

PROG = "python -m benchmarks fp8"
HELP = "GPU: the FP8 forward against our bf16 forward, cuDNN and FlashAttention-4 (--dry-run: CPU plumbing check)"
TOKENS, WIDTH = 16384, 2048  # B * S and H * D of every shape
E4M3_MAX = 448.0  # e4m3's largest magnitude: a head's amax is stored as it
# --dry-run: tokens and sequence lengths divided by this (H and D as given): a CPU run of seconds.
DRY_RUN_DIVISOR = 64


def add_arguments(parser):
    add_out(parser, "benchmarks/results/<date>-<gpu>-fp8")
    parser.add_argument("--head-dims", type=int_list, default=[64, 128, 256])
    parser.add_argument("--seqlens", type=int_list, default=[2048, 4096, 8192, 16384])
    parser.add_argument("--dry-run", action="store_true",
                        help=f"CPU, tokens and lengths divided by {DRY_RUN_DIVISOR}: checks the plumbing, no figures")


def inputs(tokens, seqlen, head_dim, device):
    """FP8 q, k, v (B, S, H, D) quantised from standard normal values with a descale per (batch, head),
    descale = amax / 448, the descales {name: (B, H) fp32}, and the same values dequantised to bf16."""
    gen = torch.Generator(device=device).manual_seed(head_dim * 100003 + seqlen)
    shape = (tokens // seqlen, seqlen, WIDTH // head_dim, head_dim)
    stored, scales = [], {}
    for name in ("q_descale", "k_descale", "v_descale"):
        real = torch.randn(shape, generator=gen, device=device)
        descale = real.abs().amax(dim=(1, 3)) / E4M3_MAX  # (B, H)
        stored.append((real / descale[:, None, :, None]).to(torch.float8_e4m3fn))
        scales[name] = descale
    bf16 = [(t.float() * s[:, None, :, None]).to(torch.bfloat16) for t, s in zip(stored, scales.values())]
    return stored, scales, bf16


def run(args):
    import flashattn
    from flashattn import flash_attn_func, fp8

    if args.dry_run:
        device, tokens = "cpu", TOKENS // DRY_RUN_DIVISOR
        seqlens = [max(1, s // DRY_RUN_DIVISOR) for s in args.seqlens]
        header = cpu_header("--dry-run: tiny shapes on the CPU")
        header["timing"] = "--dry-run: one CPU call each, no figures"
        timer = cpu_timer(0.0, min_reps=1, max_reps=1)
        family, fa4, fa4_missing = "cpu", None, "not run (--dry-run)"
        fa3, fa3_missing = None, "not run (--dry-run)"
    else:
        started = start_gpu_run(PROG, {"fwd": (FWD_WARMUP_MS, FWD_REP_MS)})
        if started is None:
            return 2
        timers, header = started
        timer = timers["fwd"]
        device, tokens, seqlens = "cuda", TOKENS, args.seqlens
        family = flashattn.kernel_family()
        fa4, fa4_missing = flash_attention_4()
        fa3, fa3_missing = flash_attention_3()
    print("\n".join(header_lines(header)), flush=True)

    rows = []
    for head_dim in args.head_dims:
        for seqlen in seqlens:
            for causal in (False, True):
                (q8, k8, v8), scales, (q, k, v) = inputs(tokens, seqlen, head_dim, device)
                scale = head_dim**-0.5
                fns = {
                    "FP8": lambda: flash_attn_func(q8, k8, v8, causal=causal, **scales),
                    "FP8 dequantised": lambda: flash_attn_func(*fp8.dequantize(q8, k8, v8, scales, torch.bfloat16),
                                                               causal=causal),
                    "ours bf16": lambda: flash_attn_func(q, k, v, causal=causal),
                }
                if device == "cuda":
                    sdpa_cudnn = sdpa_fn(q, k, v, causal, scale)

                    def cudnn(sdpa_cudnn=sdpa_cudnn):
                        with torch.nn.attention.sdpa_kernel(SDPA_BACKENDS["cudnn"]):
                            return sdpa_cudnn()

                    fns["cuDNN bf16"] = cudnn
                    if fa4 is not None:  # a shape it refuses is a gap in its column, not the end of the run
                        fns["FA4 bf16"] = fa4_fn(fa4, q, k, v, causal, scale)
                    if fa3 is not None:
                        fns["FA3 FP8"] = lambda: fa3.forward(q8, k8, v8, causal, scale, scales)[0]
                        fns["FA3 bf16"] = lambda: fa3.forward(q, k, v, causal, scale)[0]
                ours = fns["ours bf16"]().float()
                diff = (fns["FP8"]().float() - ours).abs().max().item()
                diff_fa3 = (fns["FA3 FP8"]().float() - ours).abs().max().item() if "FA3 FP8" in fns else float("nan")
                best, failed = best_of_rounds({name: (lambda fn=fn: timer(fn)) for name, fn in fns.items()})
                for name in ("FP8", "FP8 dequantised", "ours bf16"):
                    if name in failed:
                        raise RuntimeError(f"{name} at d{head_dim} S {seqlen} causal={causal}: {failed[name]}")
                for name, why in failed.items():
                    print(f"{PROG}: {name} at d{head_dim} S {seqlen} causal={causal}: {why}", file=sys.stderr)
                flops = attention_flops(tokens // seqlen, WIDTH // head_dim, seqlen, head_dim, causal)
                tflops = {name: flops / best[name] / 1e9 if name in best else float("nan") for name in fns}
                row = {"head_dim": head_dim, "S": seqlen, "B": tokens // seqlen, "H": WIDTH // head_dim,
                       "causal": causal, "fp8_path": "kernel" if fp8.runs_kernel(q8, k8, v8) else "dequantised",
                       "fp8_tflops": tflops["FP8"], "fp8_dequantised_tflops": tflops["FP8 dequantised"],
                       "ours_bf16_tflops": tflops["ours bf16"],
                       "cudnn_bf16_tflops": tflops.get("cuDNN bf16", float("nan")),
                       "fa4_bf16_tflops": tflops.get("FA4 bf16", float("nan")),
                       "fa3_fp8_tflops": tflops.get("FA3 FP8", float("nan")),
                       "fa3_bf16_tflops": tflops.get("FA3 bf16", float("nan")),
                       "fp8_over_fp8_dequantised": tflops["FP8"] / tflops["FP8 dequantised"],
                       "fp8_over_ours_bf16": tflops["FP8"] / tflops["ours bf16"],
                       "fp8_over_cudnn": tflops["FP8"] / tflops.get("cuDNN bf16", float("nan")),
                       "fp8_over_fa4": tflops["FP8"] / tflops.get("FA4 bf16", float("nan")),
                       "fp8_over_fa3_fp8": tflops["FP8"] / tflops.get("FA3 FP8", float("nan")),
                       "max_abs_fp8_minus_ours_bf16": diff,
                       "max_abs_fa3_fp8_minus_ours_bf16": diff_fa3}  # fmt: skip
                rows.append(row)
                print(f"d{head_dim} S {seqlen:5d} causal={causal!s:5}: FP8 ({row['fp8_path']}) "
                      f"{row['fp8_tflops']:.1f}, FP8 dequantised {row['fp8_dequantised_tflops']:.1f}, "
                      f"ours bf16 {row['ours_bf16_tflops']:.1f}, cuDNN bf16 "
                      f"{row['cudnn_bf16_tflops']:.1f}, FA4 bf16 {row['fa4_bf16_tflops']:.1f}, FA3 FP8 "
                      f"{row['fa3_fp8_tflops']:.1f}, FA3 bf16 {row['fa3_bf16_tflops']:.1f} TFLOP/s "
                      f"(FP8 / ours {row['fp8_over_ours_bf16']:.2f}); max |FP8 - bf16| {diff:.3g}", flush=True)

    gpu_name = "cpu" if args.dry_run else slug(torch.cuda.get_device_name())
    folder = results_folder(args.out, dated_folder(f"{gpu_name}-fp8"))
    with open(folder / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({k: f"{v:.4g}" if isinstance(v, float) else v for k, v in r.items()} for r in rows)
    with_fa4, with_fa3 = fa4 is not None, fa3 is not None
    head = ["D", "S", "B x H", "causal", "FP8 path", "FP8", "FP8 dequantised", "ours bf16", "cuDNN bf16"]
    head += ["FA4 bf16"] if with_fa4 else []
    head += ["FA3 FP8", "FA3 bf16"] if with_fa3 else []
    head += ["FP8 / FP8 dequantised", "FP8 / ours bf16", "FP8 / cuDNN"] + (["FP8 / FA4"] if with_fa4 else [])
    head += ["FP8 / FA3 FP8"] if with_fa3 else []
    head += ["max abs(FP8 - bf16)"] + (["max abs(FA3 FP8 - bf16)"] if with_fa3 else [])
    unit = "GFLOP/s" if args.dry_run else "TFLOP/s"
    scale_unit = 1e3 if args.dry_run else 1.0

    def cell(value, digits):
        return "-" if value != value else f"{value:.{digits}f}"  # NaN: not run
    lines = [f"# Forward, FP8 (e4m3, out bf16) against bf16, {unit} (B * S = {tokens}, H * D = {WIDTH})", "",
             *header_lines(header), f"- family: {family}",
             f"- FlashAttention-4: {'flash_attn.cute, this process' if with_fa4 else fa4_missing}",
             f"- FlashAttention-3: {'scripts/stage_fa3.sh library, this process' if with_fa3 else fa3_missing}",
             "",
             *table_lines(head)]  # fmt: skip
    for r in rows:
        cells = [str(r["head_dim"]), str(r["S"]), f"{r['B']} x {r['H']}", str(r["causal"]).lower(), r["fp8_path"]]
        cells += [cell(r[key] * scale_unit, 1) for key in ("fp8_tflops", "fp8_dequantised_tflops", "ours_bf16_tflops",
                                                            "cudnn_bf16_tflops")]
        cells += [cell(r["fa4_bf16_tflops"], 1)] if with_fa4 else []
        cells += [cell(r["fa3_fp8_tflops"], 1), cell(r["fa3_bf16_tflops"], 1)] if with_fa3 else []
        cells += [cell(r[key], 2) for key in ("fp8_over_fp8_dequantised", "fp8_over_ours_bf16", "fp8_over_cudnn")]
        cells += [cell(r["fp8_over_fa4"], 2)] if with_fa4 else []
        cells += [cell(r["fp8_over_fa3_fp8"], 2)] if with_fa3 else []
        cells.append(f"{r['max_abs_fp8_minus_ours_bf16']:.3g}")
        cells += [cell(r["max_abs_fa3_fp8_minus_ours_bf16"], 3)] if with_fa3 else []
        lines.append("| " + " | ".join(cells) + " |")
    (folder / "fp8.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {folder / 'fp8.md'}")
    return 0
