"""Paged against contiguous variable-length attention on the same tokens: flash_attn_varlen_func's
forward with k and v in pages (block_table; page sizes 16 and 256, pages shuffled) and with the same
keys packed, causal, bf16, H = 32, Hk = 8 (GQA), for full prefills and chunked prefills (a chunk of
queries at the end of a longer cache). Each row checks that both give the same out, times both in one
process and writes the ratio; results.csv and results.md go to the output folder. On the sm90 family
--copy-modes times each way of copying paged keys in the same process (FLASHATTN_SM90_PAGED_COPY,
which the binding reads at every call: auto, tma, gather, gather8); other families ignore it.

Where FlashAttention-4 imports (FLASHATTN_FA4_DIR, benchmarks/backends.py), its own paged call (its
page_table, with seqused_k: it takes no cu_seqlens_k with pages) and its own contiguous varlen call on the
same tokens are timed in the same rounds: what paging costs the other Hopper kernel library, beside
what it costs ours. Its out is checked against ours (max difference), not required to be identical.

The contiguous call and each copy mode of one (head dim, workload, page size) are timed in turn,
round after round (benchmarks/timing.py: best_of_rounds), each keeping its best median: a single
timing of a row moved by up to 10% between runs (benchmarks/NOTES.md, thirteenth session).

    python -m benchmarks paged [--out DIR] [--copy-modes auto,tma,gather]
    python -m benchmarks paged --dry-run --out /tmp/paged   # CPU, tiny lengths: checks the plumbing
"""
import contextlib
import csv
import os
import sys

import torch

from benchmarks.arguments import add_out, choice_list
from benchmarks.backends import flash_attention_4, short_reason
from benchmarks.environment import cpu_header, dated_folder, gpu_header, header_lines, results_folder, slug
from benchmarks.tables import table_lines
from benchmarks.timing import FWD_REP_MS, FWD_WARMUP_MS, best_of_rounds, cpu_timer

PROG = "python -m benchmarks paged"
HELP = "GPU: paged (block_table) vs contiguous varlen forward on the same tokens (--dry-run: CPU plumbing check)"
HEADS, HEADS_K = 32, 8
PAGE_SIZES = (16, 256)
COPY_MODES = ("auto", "tma", "gather", "gather8")  # FLASHATTN_SM90_PAGED_COPY
# name -> (query lengths, key lengths) per sequence: the queries are the last keys' positions.
WORKLOADS = {
    "prefill 8 x 2k": ([2048] * 8, [2048] * 8),
    "chunk 512 of 4k x 8": ([512] * 8, [4096] * 8),
    "chunk 1k of 16k x 2": ([1024] * 2, [16384] * 2),
    "mixed 16 seqs": ([1, 37, 512, 900, 128, 2048, 1, 300, 64, 1500, 700, 33, 1024, 5, 256, 999],
                      [4000, 37, 3000, 900, 8192, 2048, 17, 300, 5000, 1500, 700, 2000, 1024, 9000, 256, 999]),
}


def add_arguments(parser):
    add_out(parser, "benchmarks/results/<date>-<gpu>-paged")
    parser.add_argument("--head-dims", default="128,64", help="comma list of head dims (default 128,64)")
    parser.add_argument("--copy-modes", type=choice_list(COPY_MODES, ordered=True), default=["auto"],
                        help="sm90: how paged keys are copied, each timed in this process (default auto)")
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU, every length divided by 64: checks the plumbing, no figures")


def fwd_flops(lengths_q, lengths_k, head_dim):
    """Causal forward FLOPs: 4 * D * H * (visible pairs), bottom-right aligned."""
    pairs = sum(q * k - q * (q - 1) // 2 if k >= q else k * (k + 1) // 2 for q, k in zip(lengths_q, lengths_k))
    return 4 * head_dim * HEADS * pairs


def to_pages(keys, values, cu_k, lengths_k, page_size, gen):
    """k and v as shuffled pages, and the block table."""
    counts = [-(-n // page_size) for n in lengths_k]
    num_pages = sum(counts)
    order = torch.randperm(num_pages, generator=gen).tolist()
    k_pages = keys.new_zeros((num_pages, page_size, *keys.shape[1:]))
    v_pages = torch.zeros_like(k_pages)
    table = torch.zeros(len(lengths_k), max(counts), dtype=torch.int32)
    starts, used = cu_k.tolist(), 0
    for b, n in enumerate(lengths_k):
        for j in range(counts[b]):
            page, rows = order[used], slice(starts[b] + j * page_size, min(starts[b] + (j + 1) * page_size, starts[b] + n))
            used += 1
            k_pages[page, : rows.stop - rows.start] = keys[rows]
            v_pages[page, : rows.stop - rows.start] = values[rows]
            table[b, j] = page
    return k_pages, v_pages, table.to(keys.device)


def first(out):
    """FlashAttention-4's out: it returns (out, lse) or out."""
    return out[0] if isinstance(out, tuple) else out


@contextlib.contextmanager
def copy_mode(mode):
    """FLASHATTN_SM90_PAGED_COPY=mode inside (None: left as it is), restored after."""
    before = os.environ.get("FLASHATTN_SM90_PAGED_COPY")
    if mode is not None:
        os.environ["FLASHATTN_SM90_PAGED_COPY"] = mode
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("FLASHATTN_SM90_PAGED_COPY", None)
        else:
            os.environ["FLASHATTN_SM90_PAGED_COPY"] = before


def run(args):
    if not args.dry_run and not torch.cuda.is_available():
        print(f"{PROG}: needs a CUDA GPU (or --dry-run)", file=sys.stderr)
        return 2
    from flashattn import flash_attn_varlen_func

    device = "cpu" if args.dry_run else "cuda"
    if args.dry_run:
        timing = "--dry-run: one CPU call each, no figures"
        header = cpu_header("--dry-run: tiny lengths on the CPU")
        header["timing"] = timing
        timer = cpu_timer(0.0, min_reps=1, max_reps=1)
        workloads = {name: ([max(1, n // 64) for n in lq], [max(1, n // 64) for n in lk])
                     for name, (lq, lk) in WORKLOADS.items()}
    else:
        from triton.testing import do_bench

        timing = (f"triton.testing.do_bench median (warmup {FWD_WARMUP_MS} ms, rep {FWD_REP_MS} ms), the calls of a "
                  "row timed in turn, best of rounds")
        header = gpu_header(timing)
        timer = lambda fn: do_bench(fn, warmup=FWD_WARMUP_MS, rep=FWD_REP_MS, return_mode="median")  # noqa: E731
        workloads = WORKLOADS
    fa4, fa4_missing = (None, "not run (--dry-run)") if args.dry_run else flash_attention_4("flash_attn_varlen_func")
    header["FlashAttention-4"] = "timed (paged: page_table and seqused_k)" if fa4 is not None else fa4_missing
    print("\n".join(header_lines(header)), flush=True)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for head_dim in (int(d) for d in args.head_dims.split(",")):
        for name, (lengths_q, lengths_k) in workloads.items():
            cu_q = torch.tensor([0, *torch.tensor(lengths_q).cumsum(0).tolist()], dtype=torch.int32, device=device)
            cu_k = torch.tensor([0, *torch.tensor(lengths_k).cumsum(0).tolist()], dtype=torch.int32, device=device)
            q = torch.randn(sum(lengths_q), HEADS, head_dim, generator=gen).to(device, torch.bfloat16)
            k, v = (torch.randn(sum(lengths_k), HEADS_K, head_dim, generator=gen).to(device, torch.bfloat16)
                    for _ in range(2))
            common = dict(max_seqlen_q=max(lengths_q), max_seqlen_k=max(lengths_k), causal=True)
            contiguous = lambda: flash_attn_varlen_func(q, k, v, cu_q, cu_k, **common)  # noqa: E731
            want = contiguous()
            # The same call through the kernel variant the paged path runs (softcap/ALiBi/dropout compiled
            # in, switched off at run time: zero ALiBi slopes): what paging itself costs is paged / this.
            zero_slopes = torch.zeros(HEADS, device=device)
            extras = lambda: flash_attn_varlen_func(q, k, v, cu_q, cu_k, **common, alibi_slopes=zero_slopes)  # noqa: E731
            extras_ms = timer(extras)
            flops = fwd_flops(lengths_q, lengths_k, head_dim)
            fa4_common = dict(cu_seqlens_q=cu_q, max_seqlen_q=max(lengths_q), max_seqlen_k=max(lengths_k),
                              causal=True)
            seqused_k = torch.tensor(lengths_k, dtype=torch.int32, device=device)
            fa4_contiguous = lambda: first(fa4(q, k, v, cu_seqlens_k=cu_k, **fa4_common))  # noqa: E731
            for page_size in PAGE_SIZES:
                k_pages, v_pages, table = to_pages(k, v, cu_k, lengths_k, page_size, gen)
                paged = lambda: flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, **common,  # noqa: E731
                                                       block_table=table)
                same = {}
                for mode in args.copy_modes:
                    with copy_mode(mode):
                        same[mode] = torch.equal(paged(), want)

                def measure(fn, mode=None):
                    def timed():
                        with copy_mode(mode):
                            return timer(fn)
                    return timed

                measures = {"contiguous": measure(contiguous),
                            **{mode: measure(paged, mode) for mode in args.copy_modes}}
                fa4_diff = float("nan")
                if fa4 is not None:
                    fa4_paged = lambda: first(fa4(q, k_pages, v_pages, seqused_k=seqused_k,  # noqa: E731
                                                  page_table=table, **fa4_common))
                    try:
                        fa4_diff = (fa4_paged().float() - want.float()).abs().max().item()
                        measures.update({"fa4 contiguous": measure(fa4_contiguous), "fa4 paged": measure(fa4_paged)})
                    except Exception as exc:  # noqa: BLE001 - a shape it refuses is a gap in its columns
                        print(f"{PROG}: FlashAttention-4 d{head_dim} {name} page {page_size}: "
                              f"{type(exc).__name__}: {short_reason(exc)}", file=sys.stderr)
                best, failed = best_of_rounds(measures)
                if failed:
                    print(f"{PROG}: d{head_dim} {name} page {page_size}: {failed}", file=sys.stderr)
                base_ms = best.get("contiguous", float("nan"))
                fa4_base_ms, fa4_ms = best.get("fa4 contiguous", float("nan")), best.get("fa4 paged", float("nan"))
                for mode in args.copy_modes:
                    ms = best.get(mode, float("nan"))
                    row = {"head_dim": head_dim, "workload": name, "page_size": page_size, "copy_mode": mode,
                           "contiguous_ms": round(base_ms, 4), "contiguous_extras_kernel_ms": round(extras_ms, 4),
                           "paged_ms": round(ms, 4),
                           "paged_over_contiguous": round(ms / base_ms, 3),
                           "contiguous_tflops": round(flops / base_ms / 1e9, 1),
                           "paged_tflops": round(flops / ms / 1e9, 1), "same_out": same[mode],
                           "fa4_contiguous_ms": round(fa4_base_ms, 4), "fa4_paged_ms": round(fa4_ms, 4),
                           "fa4_paged_over_contiguous": round(fa4_ms / fa4_base_ms, 3),
                           "fa4_paged_maxdiff": fa4_diff}
                    rows.append(row)
                    print(f"d{head_dim} {name:22s} page {page_size:3d} {mode:6s}: contiguous {base_ms:.3f} ms "
                          f"(extras kernel {extras_ms:.3f}), paged {ms:.3f} ms (x{ms / base_ms:.3f}), "
                          f"same out: {same[mode]}; FA4 contiguous {fa4_base_ms:.3f} ms, paged {fa4_ms:.3f} ms "
                          f"(x{fa4_ms / fa4_base_ms:.3f})", flush=True)
                del k_pages, v_pages
    gpu_name = "cpu" if args.dry_run else slug(torch.cuda.get_device_name())
    folder = results_folder(args.out, dated_folder(f"{gpu_name}-paged"))
    with open(folder / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    lines = header_lines(header) + ["", *table_lines(["D", "workload", "page", "copy (sm90)", "contiguous ms",
                                                          "contiguous, extras kernel ms", "paged ms",
                                                          "paged / contiguous", "TFLOP/s (contig / paged)", "same out",
                                                          "FA4 contiguous ms", "FA4 paged ms", "FA4 paged / contiguous"])]
    lines += [f"| {r['head_dim']} | {r['workload']} | {r['page_size']} | {r['copy_mode']} | {r['contiguous_ms']:.3f} | "
              f"{r['contiguous_extras_kernel_ms']:.3f} | {r['paged_ms']:.3f} | "
              f"{r['paged_over_contiguous']:.3f} | {r['contiguous_tflops']} / {r['paged_tflops']} | {r['same_out']} | "
              f"{r['fa4_contiguous_ms']:.3f} | {r['fa4_paged_ms']:.3f} | {r['fa4_paged_over_contiguous']:.3f} |"
              for r in rows]
    (folder / "results.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {folder / 'results.md'}")
    worst = max(r["paged_over_contiguous"] for r in rows)
    print(f"worst paged / contiguous: {worst:.3f}; every out identical: {all(r['same_out'] for r in rows)}")
    return 0
