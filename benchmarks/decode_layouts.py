"""What the order of a paged cache's pages costs: decoding (bf16, D = 128, H = 32, Sq = 1) over the
same keys laid out five ways, timed as benchmarks/decode.py times (do_bench, L2 flushed before each call):

  contiguous    the (B, S, Hk, D) cache
  ident16       16-token pages, block table 0, 1, 2, ... (the contiguous cache's addresses)
  local16       16-token pages shuffled within groups of 2 MiB of the pool
  shuffled16    16-token pages shuffled across the pool (decode.py's paged16)
  shuffled256   256-token pages shuffled across the pool (decode.py's paged256)

and SDPA on the contiguous cache, each layout's output checked as decode.py checks it. The kernel does the same work in all five (the paged ones look
their pages up in the same way), so what separates ident16 from shuffled16 is how the memory serves
scattered 16-token pages, not the kernel.

    python -m benchmarks decode-layouts [--out DIR]
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.arguments import add_out
from benchmarks.decode import DTYPE, HEAD_DIM, HEADS, check_decode, paged_copy
from benchmarks.environment import RESULTS_ROOT, header_lines, results_folder, start_gpu_run
from benchmarks.timing import FWD_REP_MS, FWD_WARMUP_MS

PROG = "python -m benchmarks decode-layouts"
HELP = "GPU: decoding time by page layout into decode_layouts.md"

SHAPES = ((8, 1, 65536), (8, 8, 65536), (8, 8, 262144), (32, 8, 65536))  # (Hk, B, S)
LAYOUTS = ("contiguous", "ident16", "local16", "shuffled16", "shuffled256")


def page_order(layout, pages, page_bytes, gen):
    """The pool page of each table entry (flattened over the batch)."""
    if layout.startswith("ident"):
        return torch.arange(pages, device="cuda")
    if layout.startswith("shuffled"):
        return torch.randperm(pages, generator=gen, device="cuda")
    group = max(1, 2**21 // page_bytes)  # local: a permutation within each 2 MiB of the pool
    return torch.argsort(torch.arange(pages, device="cuda") // group
                         + torch.rand(pages, generator=gen, device="cuda", dtype=torch.float64))


def add_arguments(parser):
    add_out(parser, "benchmarks/results/decode")


def run(args):
    from flashattn import flash_attn_with_kvcache

    started = start_gpu_run(PROG, {"fwd": (FWD_WARMUP_MS, FWD_REP_MS)})
    if started is None:
        return 2
    timers, header = started
    timer = timers["fwd"]
    lines = ["# Decoding time by page layout (flash_attn_with_kvcache, us)", ""] + header_lines(header)
    lines += ["", "| Hk | B | S | SDPA (contiguous) | " + " | ".join(LAYOUTS) + " |",
              "|---|---|---|---|" + "---|" * len(LAYOUTS)]
    failed = False
    for heads_k, batch, seqlen in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(seqlen + batch + heads_k)
        k = torch.randn(batch, seqlen, heads_k, HEAD_DIM, generator=gen, device="cuda", dtype=DTYPE)
        v = torch.randn_like(k)
        q = torch.randn(batch, 1, HEADS, HEAD_DIM, generator=gen, device="cuda", dtype=DTYPE)
        seqlens = torch.full((batch,), seqlen, device="cuda", dtype=torch.int32)
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        cells = [f"{timer(lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)) * 1e3:.1f}"]
        for layout in LAYOUTS:
            if layout == "contiguous":
                k_cache, v_cache, table = k, v, None
            else:
                page = int(layout.removeprefix("ident").removeprefix("local").removeprefix("shuffled"))
                pages = batch * seqlen // page
                order = page_order(layout, pages, page * heads_k * HEAD_DIM * k.element_size(), gen)
                k_cache, v_cache, table = paged_copy(k, v, page, order)

            def ours():
                return flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table)

            diff, bound = check_decode(ours, q, k, v)
            if not diff <= bound:
                cells.append(f"MISMATCH ({diff:.3g})")
                failed = True
            else:
                cells.append(f"{timer(ours) * 1e3:.1f}")
            del k_cache, v_cache
        lines.append(f"| {heads_k} | {batch} | {seqlen} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
        del k, v
        torch.cuda.empty_cache()
    text = "\n".join(lines) + "\n"
    out = results_folder(args.out, RESULTS_ROOT / "decode")
    (out / "decode_layouts.md").write_text(text)
    print(text)
    return 1 if failed else 0
