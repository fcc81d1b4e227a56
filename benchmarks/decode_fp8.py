"""Decoding over an FP8 KV cache: the FP8 KV-cache kernel against a bf16 cache and the dequantising route.

    python -m benchmarks decode-fp8 [--out DIR] [--quick]

One query token per sequence (Sq = 1, bf16 q) attends to a full cache: head dim 128, H = 32 query
heads over Hk = 8 (GQA) and Hk = 32 (MHA), batch 1, 8 and 64, cache lengths 4k to 64k, contiguous or
paged (pages of 16 and 256 tokens, block table shuffled). Three calls on the same keys and values:
flash_attn_with_kvcache over the bf16 cache (the decoding kernel), over the e4m3 cache with
k_descale and v_descale (the FP8 KV-cache kernel, flashattn.fp8.runs_kvcache_kernel), and the same
FP8 call on the dequantising route (flashattn/kvcache.py: _fp8_kvcache, which dequantises the whole
cache on every call; only where its copies fit the memory budget). Bandwidth = the cache's bytes
(K and V: 2 * B * S * Hk * D times 2 bytes for bf16, 1 for e4m3) / the median time. The descales are
powers of two, so the dequantised values are bf16 values and the fp32 reference is exact; before
timing, the FP8 kernel's output on the first and last sequence is checked against it with the tests'
bound (benchmarks/checks.py).
"""
from __future__ import annotations

import torch

from benchmarks.arguments import add_out
from benchmarks.checks import output_reference
from benchmarks.decode import run_rows
from benchmarks.environment import header_lines
from flashattn.testing import max_abs_diff

PROG = "python -m benchmarks decode-fp8"
HELP = "GPU: decoding over an FP8 KV cache against a bf16 cache and the dequantising route"
HEADS, HEAD_DIM = 32, 128
DTYPE = torch.bfloat16
FP8 = torch.float8_e4m3fn
CACHE_BUDGET = 16 * 2**30  # bytes of the bf16 K + V caches of a row
ROUTE_BUDGET = 4 * 2**30   # bytes of the FP8 caches the route's dequantised copies are timed for


def rows_plan(quick):
    batches = (1, 8) if quick else (1, 8, 64)
    seqlens = (16384, 65536) if quick else (4096, 16384, 65536)
    for heads_k in (8, 32):
        for batch in batches:
            for seqlen in seqlens:
                for layout in ("contiguous", "paged16", "paged256"):
                    yield heads_k, batch, seqlen, layout


def paged(t, page, order):
    """t (B, S, Hk, D) as a pool of `page`-token pages: sequence b's i-th page at pool page
    order[b * S / page + i]."""
    batch, seqlen, heads_k, dim = t.shape
    pool = torch.empty(batch * (seqlen // page), page, heads_k, dim, device=t.device, dtype=t.dtype)
    pool[order] = t.reshape(-1, page, heads_k, dim)
    return pool


def measure(timer, heads_k, batch, seqlen, layout):
    from flashattn import flash_attn_with_kvcache, fp8

    elements = 2 * batch * seqlen * heads_k * HEAD_DIM
    row = {"Hk": heads_k, "B": batch, "S": seqlen, "layout": layout, "FP8 GB": elements / 1e9}
    if elements * 2 * (2 if layout != "contiguous" else 1) > CACHE_BUDGET:
        return {**row, "status": "skipped: over the memory budget"}
    gen = torch.Generator(device="cuda").manual_seed(seqlen + batch + heads_k)
    stored = [(torch.randn(batch, seqlen, heads_k, HEAD_DIM, generator=gen, device="cuda") * 2).to(FP8)
              for _ in range(2)]
    # Powers of two: stored x descale is a bf16 value, the bf16 cache holds exactly the real values.
    descale = [torch.exp2(torch.randint(-4, 2, (batch, heads_k), generator=gen, device="cuda").float())
               for _ in range(2)]
    real = [(s.float() * d[:, None, :, None]).to(DTYPE) for s, d in zip(stored, descale)]
    q = torch.randn(batch, 1, HEADS, HEAD_DIM, generator=gen, device="cuda", dtype=DTYPE)
    seqlens = torch.full((batch,), seqlen, device="cuda", dtype=torch.int32)
    table = None
    fp8_caches, bf16_caches = stored, real
    if layout != "contiguous":
        page = int(layout.removeprefix("paged"))
        order = torch.randperm(batch * (seqlen // page), generator=gen, device="cuda")
        table = order.reshape(batch, -1).to(torch.int32)
        fp8_caches = [paged(t, page, order) for t in stored]
        bf16_caches = [paged(t, page, order) for t in real]

    def bf16_call():
        return flash_attn_with_kvcache(q, *bf16_caches, cache_seqlens=seqlens, block_table=table)

    def fp8_call():
        return flash_attn_with_kvcache(q, *fp8_caches, cache_seqlens=seqlens, block_table=table,
                                       k_descale=descale[0], v_descale=descale[1])

    if not fp8.runs_kvcache_kernel(q, *fp8_caches, None, None):
        return {**row, "status": "the FP8 KV-cache kernel does not serve this call"}
    sequences = sorted({0, batch - 1})
    reference = output_reference(q[sequences], real[0][sequences], real[1][sequences], HEAD_DIM**-0.5, causal=False)
    diff, bound = max_abs_diff(fp8_call()[sequences], reference.outputs[0]), reference.bounds[0]
    if not diff <= bound:
        return {**row, "status": f"MISMATCH: max abs diff {diff:.3g} against the fp32 reference > bound {bound:.3g}"}
    bf16_ms, fp8_ms = timer(bf16_call), timer(fp8_call)
    route_ms = float("nan")
    if elements <= ROUTE_BUDGET:
        kernel_route = fp8.runs_kvcache_kernel
        fp8.runs_kvcache_kernel = lambda *args, **kwargs: False
        try:
            route_ms = timer(fp8_call)
        finally:
            fp8.runs_kvcache_kernel = kernel_route
    del stored, real, fp8_caches, bf16_caches
    torch.cuda.empty_cache()
    return {**row, "status": "ok", "bf16 ms": bf16_ms, "bf16 GB/s": elements * 2 / (bf16_ms * 1e-3) / 1e9,
            "fp8 ms": fp8_ms, "fp8 GB/s": elements / (fp8_ms * 1e-3) / 1e9, "speedup": bf16_ms / fp8_ms,
            "route ms": route_ms, "over route": route_ms / fp8_ms, "max diff": diff}


def markdown(header, rows):
    lines = ["# Decoding over an FP8 KV cache (flash_attn_with_kvcache)", ""] + header_lines(header)
    lines += ["", "| Hk | B | S | cache | FP8 GB | bf16 cache ms | GB/s | FP8 kernel ms | GB/s | speedup | "
              "route ms | kernel / route |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        head = f"| {r['Hk']} | {r['B']} | {r['S']} | {r['layout']} | {r['FP8 GB']:.2f} |"
        if r["status"] != "ok":
            lines.append(head + f" {r['status']} | | | | | | |")
            continue
        route = "not run" if r["route ms"] != r["route ms"] else f"{r['route ms']:.3f}"
        over = "" if r["route ms"] != r["route ms"] else f"{r['over route']:.1f}x"
        lines.append(head + f" {r['bf16 ms']:.3f} | {r['bf16 GB/s']:.0f} | {r['fp8 ms']:.3f} | {r['fp8 GB/s']:.0f} | "
                     f"{r['speedup']:.2f}x | {route} | {over} |")
    ok = [r for r in rows if r["status"] == "ok"]
    if ok:
        lines += ["", f"FP8 cache over bf16 cache: {min(r['speedup'] for r in ok):.2f}x to "
                      f"{max(r['speedup'] for r in ok):.2f}x ({len(ok)} rows).", ""]
    return "\n".join(lines)


def add_arguments(parser):
    add_out(parser, "benchmarks/results/decode-fp8")
    parser.add_argument("--quick", action="store_true", help="batch 1 and 8, S 16k and 64k")


def run(args):
    keys = ["Hk", "B", "S", "layout", "FP8 GB", "status", "bf16 ms", "bf16 GB/s", "fp8 ms", "fp8 GB/s", "speedup",
            "route ms", "over route", "max diff"]
    return run_rows(args, PROG, rows_plan(args.quick), measure, markdown, "decode-fp8", "decode_fp8", keys)
