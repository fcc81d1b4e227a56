"""Decoding speed: achieved KV-read bandwidth of flash_attn_with_kvcache against SDPA and the copy ceiling.

    python -m benchmarks decode [--out DIR] [--quick]

One query token per sequence (Sq = 1) attends to a full cache: bf16, head dim 128, H = 32 query heads
over Hk = 8 (GQA) and Hk = 32 (MHA), batch 1, 8 and 64, cache lengths 4k to 256k, the cache contiguous
or paged (pages of 16 and 256 tokens, block table shuffled). Nothing is appended in the timed call.
Bandwidth = the bytes of K and V in the cache (2 * B * S * Hk * D * 2) / the median time; the
ceiling is gpu.md's device-to-device copy, 3.0 TB/s counting reads and writes. SDPA runs
F.scaled_dot_product_attention(enable_gqa=True) on the same contiguous cache seen as (B, Hk, S, D)
(for paged rows: on the contiguous cache holding the same keys). Rows whose caches would not fit
the memory budget are listed as skipped. Before timing, each row's output is checked against the fp32
reference on the first and last sequence with the tests' bound (benchmarks/checks.py); "max diff" is
its largest error there.
Target (issue 5): batch 1 at S >= 64k at least 80% of the ceiling, and faster than SDPA in every row.
"""
from __future__ import annotations

import csv

import torch
import torch.nn.functional as F

from benchmarks.arguments import add_out
from benchmarks.checks import output_reference
from benchmarks.environment import RESULTS_ROOT, header_lines, results_folder, start_gpu_run
from benchmarks.timing import FWD_REP_MS, FWD_WARMUP_MS
from flashattn.testing import max_abs_diff

PROG = "python -m benchmarks decode"
HELP = "GPU: decoding bandwidth of flash_attn_with_kvcache against SDPA into decode.csv/.md"
HEADS, HEAD_DIM = 32, 128
DTYPE = torch.bfloat16
COPY_CEILING = 3.0e12  # bytes/s, gpu.md: device-to-device copy, read + written
CACHE_BUDGET = 24 * 2**30  # bytes of one K + V cache; paged rows keep a contiguous twin for SDPA


def rows_plan(quick):
    batches = (1, 8) if quick else (1, 8, 64)
    seqlens = (16384, 65536) if quick else (4096, 16384, 65536, 262144)
    for heads_k in (8, 32):
        for batch in batches:
            for seqlen in seqlens:
                for layout in ("contiguous", "paged16", "paged256"):
                    yield heads_k, batch, seqlen, layout


def paged_copy(k, v, page, order):
    """k, v (B, S, Hk, D) copied into a pool of `page`-token pages: sequence b's i-th page goes to
    pool page order[b * S / page + i]. Returns the two pools and the block table."""
    batch, seqlen, heads_k, dim = k.shape
    pages = seqlen // page
    k_cache = torch.empty(batch * pages, page, heads_k, dim, device=k.device, dtype=k.dtype)
    v_cache = torch.empty_like(k_cache)
    k_cache[order] = k.reshape(batch * pages, page, heads_k, dim)
    v_cache[order] = v.reshape(batch * pages, page, heads_k, dim)
    return k_cache, v_cache, order.reshape(batch, pages).to(torch.int32)


def check_decode(ours, q, k, v):
    """(max|ours() - reference|, its bound) on the first and last sequence, every head: the
    tests' bound, with the fp32 reference on those sequences' contiguous keys."""
    sequences = sorted({0, q.shape[0] - 1})
    reference = output_reference(q[sequences], k[sequences], v[sequences], HEAD_DIM**-0.5, causal=False)
    return max_abs_diff(ours()[sequences], reference.outputs[0]), reference.bounds[0]


def measure(timer, heads_k, batch, seqlen, layout):
    from flashattn import flash_attn_with_kvcache

    cache_bytes = 2 * batch * seqlen * heads_k * HEAD_DIM * 2
    needed = cache_bytes * (2 if layout != "contiguous" else 1)
    row = {"Hk": heads_k, "B": batch, "S": seqlen, "layout": layout, "KV GB": cache_bytes / 1e9}
    if needed > 2 * CACHE_BUDGET:
        return {**row, "status": f"skipped: {needed / 2**30:.0f} GiB of caches"}
    gen = torch.Generator(device="cuda").manual_seed(seqlen + batch + heads_k)
    k = torch.randn(batch, seqlen, heads_k, HEAD_DIM, generator=gen, device="cuda", dtype=DTYPE)
    v = torch.randn(batch, seqlen, heads_k, HEAD_DIM, generator=gen, device="cuda", dtype=DTYPE)
    q = torch.randn(batch, 1, HEADS, HEAD_DIM, generator=gen, device="cuda", dtype=DTYPE)
    seqlens = torch.full((batch,), seqlen, device="cuda", dtype=torch.int32)
    if layout == "contiguous":
        k_cache, v_cache, table = k, v, None
    else:
        page = int(layout.removeprefix("paged"))
        order = torch.randperm(batch * (seqlen // page), generator=gen, device="cuda")
        k_cache, v_cache, table = paged_copy(k, v, page, order)

    def ours():
        return flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table)

    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def sdpa():
        return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)

    diff, bound = check_decode(ours, q, k, v)
    if not diff <= bound:
        return {**row, "status": f"MISMATCH: max abs diff {diff:.3g} against the fp32 reference > bound {bound:.3g}"}
    ms, sdpa_ms = timer(ours), timer(sdpa)
    bw, sdpa_bw = cache_bytes / (ms * 1e-3), cache_bytes / (sdpa_ms * 1e-3)
    del k, v, k_cache, v_cache
    torch.cuda.empty_cache()
    return {**row, "status": "ok", "ms": ms, "GB/s": bw / 1e9, "of ceiling": bw / COPY_CEILING,
            "SDPA ms": sdpa_ms, "SDPA GB/s": sdpa_bw / 1e9, "speedup": sdpa_ms / ms, "max diff": diff}


def markdown(header, rows):
    lines = ["# Decoding bandwidth (flash_attn_with_kvcache)", ""] + header_lines(header)
    lines += ["- ceiling: device-to-device copy 3.0 TB/s (gpu.md)", "",
              "| Hk | B | S | cache | KV GB | flashattn ms | GB/s | of ceiling | SDPA ms | SDPA GB/s | speedup |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        head = f"| {r['Hk']} | {r['B']} | {r['S']} | {r['layout']} | {r['KV GB']:.2f} |"
        if r["status"] != "ok":
            lines.append(head + f" {r['status']} | | | | | |")
            continue
        lines.append(head + f" {r['ms']:.3f} | {r['GB/s']:.0f} | {r['of ceiling']:.0%} | {r['SDPA ms']:.3f} | "
                     f"{r['SDPA GB/s']:.0f} | {r['speedup']:.2f}x |")
    ok = [r for r in rows if r["status"] == "ok"]
    target = [r for r in ok if r["B"] == 1 and r["S"] >= 65536]
    lines += ["", "Target: batch 1 at S >= 64k at >= 80% of the ceiling: "
              + (f"{sum(r['of ceiling'] >= 0.8 for r in target)} of {len(target)} rows "
                 f"({min(r['of ceiling'] for r in target):.0%} to {max(r['of ceiling'] for r in target):.0%})"
                 if target else "no such row run")
              + f"; faster than SDPA: {sum(r['speedup'] > 1 for r in ok)} of {len(ok)} rows.", ""]
    return "\n".join(lines)


def add_arguments(parser):
    add_out(parser, "benchmarks/results/decode")
    parser.add_argument("--quick", action="store_true", help="batch 1 and 8, S 16k and 64k")


def run_rows(args, prog, plan, measure, markdown, folder, stem, keys):
    """A decoding benchmark's run (this module's and decode_fp8's): measure(timer, *row) for every row
    of plan, each printed as it comes, then stem.md (markdown(header, rows)) and stem.csv (keys) in
    args.out, else a dated folder under RESULTS_ROOT / folder. 2 without a GPU, 1 if a row's output
    missed the reference, else 0."""
    started = start_gpu_run(prog, {"fwd": (FWD_WARMUP_MS, FWD_REP_MS)})
    if started is None:
        return 2
    timers, header = started
    rows = []
    for row in plan:
        rows.append(measure(timers["fwd"], *row))
        print(rows[-1], flush=True)
    text = markdown(header, rows)
    out = results_folder(args.out, RESULTS_ROOT / folder)
    (out / f"{stem}.md").write_text(text)
    with open(out / f"{stem}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, keys)
        writer.writeheader()
        writer.writerows(rows)
    print(text)
    return 0 if all(not r["status"].startswith("MISMATCH") for r in rows) else 1


def run(args):
    keys = ["Hk", "B", "S", "layout", "KV GB", "status", "ms", "GB/s", "of ceiling", "SDPA ms", "SDPA GB/s",
            "speedup", "max diff"]
    return run_rows(args, PROG, rows_plan(args.quick), measure, markdown, "decode", "decode", keys)
