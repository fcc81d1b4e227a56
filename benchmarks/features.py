"""Speed of the options beyond plain attention: variable-length batches, sliding windows, and the cost of
softcap, ALiBi and dropout (GPU only). `python -m benchmarks sweep --features` runs it after the sweep;
it also runs alone:

    python -m benchmarks features [--out DIR] [--quick]

Variable-length batch (bf16, H=16, D=128): a batch of mixed lengths (seeded, 128 to 8192 tokens,
32k tokens in all), timed as

- flashattn varlen: flash_attn_varlen_func on the packed tokens;
- flashattn padded: flash_attn_func on the batch padded to the longest sequence (padding rows and keys
  computed and thrown away, which is what a padded batch costs; the answer differs in the padded rows);
- flashattn one by one: flash_attn_func per sequence, one launch each;
- SDPA padded + mask: scaled_dot_product_attention on the padded batch with a boolean key-padding mask
  (the backend PyTorch picks for a mask);
- SDPA one by one: SDPA's flash backend per sequence;
- flashattn padded, same tokens: flash_attn_func on B x S = the same total tokens in equal sequences
  (S = 2048), the yardstick of issue 4's "varlen throughput within 10% of the padded function".

Throughput counts the useful FLOPs only (4 * H * D * sum of S_i^2, halved for causal) for every row, so
padding shows up as lost throughput. Sliding window (bf16, B=1, H=16, D=128, S=16384): full attention
against window_size=(4096, 0) with causal and (2048, 2047) without, i.e. 4096 keys per row; the time
ratio against full non-causal attention should be about 1/4. Extras (bf16, B=2, H=16, D=128, S=8192,
causal): softcap=30, ALiBi and dropout_p=0.1 against plain attention. Sinks (issue 21: at most 5% over
plain, forward and backward): learnable_sink, and with it a gradient through the LSE, against plain
attention at D=64 and D=128 (bf16, B=2, H=16, S=8192, causal). Combine (issue 21: at least 70% of copy
bandwidth): flash_attn_combine of 8 fp32 splits of (B=1, S=8192, H=32, D=128) into bf16, in GB/s of the
bytes it must move, against a device copy of out_partial (torch's copy_, read and write). MLA head dims
(issue 21: at least 1.15x faster than v padded, forward and backward): q and k of head dim 192, v of
128 (DeepSeek's training and prefill shapes; bf16, B=2, H=16, S=8192, causal and not) against the same
call with v zero-padded to 192 and out sliced back (what a caller without dv != d support runs), and
SDPA's flash, cuDNN and efficient backends on the same tensors; TFLOP/s count q k^T at 192 and P V at
128 for all. Head dim 512 (issue 21: Gemma 4's global layers; bf16, B=1, H=16, S=8192, d = dv = 512, causal
and not): flash_attn_func against SDPA's flash, cuDNN and efficient backends on the same tensors (a
backend that refuses head dim 512 gets its reason in the table); TFLOP/s at head dim 512.

Each timed pass is fwd (out = fn()) and fwdbwd (forward and backward of out against a random dout);
the backends of a case are timed three times in turn, each keeping its best median.
"""
from __future__ import annotations

import csv
import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from torch.nn.attention import sdpa_kernel

from benchmarks.arguments import add_out
from benchmarks.backends import SDPA_BACKENDS, sdpa_fn
from benchmarks.environment import RESULTS_ROOT, header_lines, results_folder, start_gpu_run
from benchmarks.timing import FWD_REP_MS, FWD_WARMUP_MS, best_of_rounds
from flashattn.testing import PASS_FLOP_FACTORS, attention_flops

PROG = "python -m benchmarks features"
HELP = "GPU: variable-length batches, sliding windows, softcap, ALiBi, dropout into features.csv/.md"
HEADS, HEAD_DIM = 16, 128
DTYPE = torch.bfloat16
PASSES = ("fwd", "fwdbwd")


@dataclass
class FeatureRow:
    section: str
    case: str
    backend: str
    pass_: str
    median_ms: float | None
    tflops: float | None
    note: str = ""


def mixed_lengths(total, low, high, seed):
    """Lengths in [low, high] (multiples of 8 or not: drawn uniformly), summing to exactly `total`."""
    rnd = random.Random(seed)
    lengths = []
    while sum(lengths) < total:
        lengths.append(min(rnd.randint(low, high), total - sum(lengths)))
    return lengths


def useful_flops(lengths, causal):
    """The forward's FLOPs of attention over each sequence on its own."""
    return sum(attention_flops(1, HEADS, s, HEAD_DIM, causal) for s in lengths)


def timed(timer, fn, pass_, leaves):
    """Median ms of fn() (fwd) or of its forward and backward (fwdbwd)."""
    if pass_ == "fwd":
        with torch.no_grad():
            return timer(fn)
    out = fn()
    dout = torch.randn_like(out)
    del out

    def step():
        torch.autograd.grad(fn(), leaves, dout)
    return timer(step)


def rows_for(section, case, fns, flops, timers, passes):
    """FeatureRows of every (backend, pass): fns maps backend -> (fn, leaves). The backends of a pass
    are timed in turn, several rounds, each keeping its best median (timing.best_of_rounds)."""
    rows = []
    for pass_ in passes:
        factor = PASS_FLOP_FACTORS[pass_]

        def measure(fn, leaves, pass_=pass_):
            try:
                return timed(timers[pass_], fn, pass_, leaves)
            finally:
                torch.cuda.empty_cache()

        best, failed = best_of_rounds({backend: (lambda fn=fn, leaves=leaves: measure(fn, leaves))
                                       for backend, (fn, leaves) in fns.items()})
        for backend in fns:
            if backend in failed:
                rows.append(FeatureRow(section, case, backend, pass_, None, None, failed[backend]))
            else:
                ms = best[backend]
                rows.append(FeatureRow(section, case, backend, pass_, ms, flops * factor / ms / 1e9))
    return rows


def varlen_rows(timers, passes, quick):
    from flashattn import flash_attn_func, flash_attn_varlen_func

    total = 16384 if quick else 32768
    lengths = mixed_lengths(total, 128, 8192, seed=0)
    batch, longest = len(lengths), max(lengths)
    rows = []
    for causal in (False, True):
        gen = torch.Generator(device="cuda").manual_seed(1)

        def randn(*shape):
            return torch.randn(shape, generator=gen, device="cuda", dtype=DTYPE).requires_grad_()

        q, k, v = (randn(total, HEADS, HEAD_DIM) for _ in range(3))
        cu = torch.tensor([0] + [sum(lengths[: i + 1]) for i in range(batch)], device="cuda", dtype=torch.int32)
        starts = cu.tolist()
        # The padded batch: each sequence at the start of its row of `longest`.
        qp, kp, vp = (randn(batch, longest, HEADS, HEAD_DIM) for _ in range(3))
        keep = torch.arange(longest, device="cuda")[None, :] < torch.tensor(lengths, device="cuda")[:, None]
        sdpa_mask = keep[:, None, None, :]  # [B, 1, 1, S]: key padding
        qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (qp, kp, vp))  # SDPA's layout
        uniform = total // 2048
        qu, ku, vu = (randn(uniform, 2048, HEADS, HEAD_DIM) for _ in range(3))

        def one_by_one(attn):
            def fn():
                return torch.cat([attn(q[a:b], k[a:b], v[a:b]) for a, b in zip(starts, starts[1:])])
            return fn

        def fa_single(qs, ks, vs):
            return flash_attn_func(qs[None], ks[None], vs[None], causal=causal)[0]

        def sdpa_single(qs, ks, vs):
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(qs.transpose(0, 1)[None], ks.transpose(0, 1)[None],
                                                      vs.transpose(0, 1)[None], is_causal=causal)[0].transpose(0, 1)

        def sdpa_padded():
            # A causal key-padding mask: SDPA takes one boolean mask, so the causal part goes in it too.
            mask = sdpa_mask & torch.ones(longest, longest, device="cuda", dtype=torch.bool).tril() if causal \
                else sdpa_mask
            return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask)

        fns = {
            "flashattn varlen": (lambda: flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, causal=causal),
                                 (q, k, v)),
            "flashattn padded": (lambda: flash_attn_func(qp, kp, vp, causal=causal), (qp, kp, vp)),
            "flashattn one by one": (one_by_one(fa_single), (q, k, v)),
            "SDPA padded + mask": (sdpa_padded, (qt, kt, vt)),
            "SDPA one by one": (one_by_one(sdpa_single), (q, k, v)),
        }
        case = f"{batch} sequences, {total} tokens, longest {longest}, {'causal' if causal else 'non-causal'}"
        rows += rows_for("varlen", case, fns, useful_flops(lengths, causal), timers, passes)
        same = {"flashattn padded, same tokens": (lambda: flash_attn_func(qu, ku, vu, causal=causal), (qu, ku, vu))}
        rows += rows_for("varlen", case, same, useful_flops([2048] * uniform, causal), timers, passes)
        del q, k, v, qp, kp, vp, qt, kt, vt, qu, ku, vu
        torch.cuda.empty_cache()
    return rows


def window_rows(timers, passes, quick):
    from flashattn import flash_attn_func

    seqlen = 8192 if quick else 16384
    gen = torch.Generator(device="cuda").manual_seed(2)
    q, k, v = (torch.randn(1, seqlen, HEADS, HEAD_DIM, generator=gen, device="cuda", dtype=DTYPE).requires_grad_()
               for _ in range(3))
    full = useful_flops([seqlen], causal=False)
    cases = {
        "full, non-causal": dict(causal=False),
        "full, causal": dict(causal=True),
        "window (4096, 0), causal": dict(causal=True, window_size=(4096, 0)),
        "window (2048, 2047)": dict(window_size=(2048, 2047)),
    }
    fns = {name: ((lambda kw=kw: flash_attn_func(q, k, v, **kw)), (q, k, v)) for name, kw in cases.items()}
    # TFLOP/s here count full non-causal attention's FLOPs for every row: the column reads as
    # "equivalent throughput", and the time ratio is the point.
    return rows_for("window", f"B=1 S={seqlen} H={HEADS} D={HEAD_DIM}", fns, full, timers, passes)


def extras_rows(timers, passes, quick):
    from flashattn import flash_attn_func

    seqlen = 4096 if quick else 8192
    gen = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(2, seqlen, HEADS, HEAD_DIM, generator=gen, device="cuda", dtype=DTYPE).requires_grad_()
               for _ in range(3))
    slopes = torch.tensor([2 ** (-8 * (h + 1) / HEADS) for h in range(HEADS)], device="cuda")
    cases = {
        "plain": {},
        "softcap=30": dict(softcap=30.0),
        "ALiBi": dict(alibi_slopes=slopes),
        "dropout_p=0.1": dict(dropout_p=0.1),
    }
    fns = {name: ((lambda kw=kw: flash_attn_func(q, k, v, causal=True, **kw)), (q, k, v))
           for name, kw in cases.items()}
    return rows_for("extras", f"B=2 S={seqlen} H={HEADS} D={HEAD_DIM} causal", fns,
                    2 * useful_flops([seqlen], causal=True), timers, passes)


def sink_rows(timers, passes, quick):
    from flashattn import flash_attn_func

    seqlen = 4096 if quick else 8192
    gen = torch.Generator(device="cuda").manual_seed(4)
    rows = []
    for head_dim in (64, 128):
        q, k, v = (torch.randn(2, seqlen, HEADS, head_dim, generator=gen, device="cuda", dtype=DTYPE).requires_grad_()
                   for _ in range(3))
        sink = torch.randn(HEADS, generator=gen, device="cuda").requires_grad_()

        def with_lse(q=q, k=k, v=v, sink=sink):
            # out with the LSE's share folded in, so that the backward also takes a gradient through the LSE.
            out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True, learnable_sink=sink)
            return out + lse.transpose(1, 2).unsqueeze(-1).to(out.dtype)

        fns = {
            "plain": ((lambda q=q, k=k, v=v: flash_attn_func(q, k, v, causal=True)), (q, k, v)),
            "learnable_sink": ((lambda q=q, k=k, v=v, sink=sink: flash_attn_func(q, k, v, causal=True,
                                                                                  learnable_sink=sink)),
                               (q, k, v, sink)),
            "learnable_sink + d lse": (with_lse, (q, k, v, sink)),
        }
        flops = 2 * attention_flops(1, HEADS, seqlen, head_dim, causal=True)
        rows += rows_for("sinks", f"B=2 S={seqlen} H={HEADS} D={head_dim} causal", fns, flops, timers, passes)
    return rows


def combine_rows(timers, quick):
    """flash_attn_combine against a copy of out_partial: GB/s of the bytes each must move (in the
    tflops field, which the markdown of this section titles GB/s)."""
    from flashattn import flash_attn_combine

    splits, seqlen, heads, head_dim = 8, 4096 if quick else 8192, 32, 128
    gen = torch.Generator(device="cuda").manual_seed(5)
    out_partial = torch.randn(splits, 1, seqlen, heads, head_dim, generator=gen, device="cuda")
    lse_partial = torch.randn(splits, 1, seqlen, heads, generator=gen, device="cuda")
    copy = torch.empty_like(out_partial)
    # Read: every split's out and lse (fp32); written: out (bf16) and lse (fp32).
    read = (out_partial.numel() + lse_partial.numel()) * 4
    written = lse_partial[0].numel() * 4 + out_partial[0].numel() * 2
    combine_bytes = read + written
    cases = {
        "flash_attn_combine (bf16 out)": (lambda: flash_attn_combine(out_partial, lse_partial, out_dtype=DTYPE),
                                          combine_bytes),
        "copy of out_partial": (lambda: copy.copy_(out_partial), 2 * out_partial.numel() * 4),
    }
    case = f"{splits} splits of B=1 S={seqlen} H={heads} D={head_dim}"
    rows = []
    for backend, (fn, moved) in cases.items():
        with torch.no_grad():
            ms = timers["fwd"](fn)
        rows.append(FeatureRow("combine", case, backend, "fwd", ms, moved / ms / 1e6))
    return rows


def sdpa_backend_fns(q, k, v, causal, scale):
    """{"SDPA <backend>": (fn, inputs)} for each of SDPA's backends on the same tensors (a backend that
    refuses the shape gets its reason in the table)."""
    fns = {}
    for name, backend in SDPA_BACKENDS.items():
        call = sdpa_fn(q, k, v, causal, scale)

        def in_backend(call=call, backend=backend):
            with sdpa_kernel(backend):
                return call()
        fns[f"SDPA {name}"] = (in_backend, (q, k, v))
    return fns


def mla_rows(timers, passes, quick):
    from flashattn import flash_attn_func

    seqlen, head_dim, v_head_dim = 4096 if quick else 8192, 192, 128
    gen = torch.Generator(device="cuda").manual_seed(6)
    q, k = (torch.randn(2, seqlen, HEADS, head_dim, generator=gen, device="cuda", dtype=DTYPE).requires_grad_()
            for _ in range(2))
    v = torch.randn(2, seqlen, HEADS, v_head_dim, generator=gen, device="cuda", dtype=DTYPE).requires_grad_()
    rows = []
    for causal in (False, True):
        fns = {
            f"v of {v_head_dim}": ((lambda causal=causal: flash_attn_func(q, k, v, causal=causal)), (q, k, v)),
            f"v padded to {head_dim}": ((lambda causal=causal: flash_attn_func(
                q, k, F.pad(v, (0, head_dim - v_head_dim)), causal=causal)[..., :v_head_dim]), (q, k, v)),
        }
        fns.update(sdpa_backend_fns(q, k, v, causal, head_dim**-0.5))  # v of 128
        # Useful FLOPs: q k^T over 192 columns, P V over 128 (attention_flops counts both at its head dim).
        flops = 2 * attention_flops(1, HEADS, seqlen, (head_dim + v_head_dim) // 2, causal=causal)
        case = f"B=2 S={seqlen} H={HEADS} D={head_dim} Dv={v_head_dim}{' causal' if causal else ''}"
        rows += rows_for("mla", case, fns, flops, timers, passes)
    return rows


def hd512_rows(timers, passes, quick):
    from flashattn import flash_attn_func

    seqlen, head_dim = 4096 if quick else 8192, 512
    gen = torch.Generator(device="cuda").manual_seed(7)
    q, k, v = (torch.randn(1, seqlen, HEADS, head_dim, generator=gen, device="cuda", dtype=DTYPE).requires_grad_()
               for _ in range(3))
    rows = []
    for causal in (False, True):
        fns = {"flashattn": ((lambda causal=causal: flash_attn_func(q, k, v, causal=causal)), (q, k, v)),
               **sdpa_backend_fns(q, k, v, causal, head_dim**-0.5)}
        flops = attention_flops(1, HEADS, seqlen, head_dim, causal=causal)
        case = f"B=1 S={seqlen} H={HEADS} D={head_dim}{' causal' if causal else ''}"
        rows += rows_for("hd512", case, fns, flops, timers, passes)
    return rows


def feature_rows(timers, quick=False, passes=PASSES):
    return (varlen_rows(timers, passes, quick) + window_rows(timers, passes, quick) + extras_rows(timers, passes, quick)
            + sink_rows(timers, passes, quick) + combine_rows(timers, quick) + mla_rows(timers, passes, quick)
            + hd512_rows(timers, passes, quick))


def markdown(rows):
    """One table per section: case, backend, then ms and TFLOP/s per pass, and the ratio to the section's
    yardstick (varlen: flashattn padded, same tokens; window and extras: the first row of the case)."""
    lines = []
    titles = {"varlen": "Variable-length batch (bf16, H=16, D=128; TFLOP/s of useful FLOPs)",
              "window": "Sliding window (bf16; TFLOP/s as if full non-causal; time vs full non-causal)",
              "extras": "Softcap, ALiBi, dropout (bf16, causal; time vs plain)",
              "sinks": "Learnable sinks (bf16, causal; time vs plain)",
              "combine": "flash_attn_combine (the TFLOP/s column is GB/s moved; time vs the combine)",
              "mla": "MLA head dims, v narrower than q and k (bf16; time vs v of 128)",
              "hd512": "Head dim 512 (Gemma 4's global layers; bf16, B=1, H=16; time vs flashattn)"}
    for section, title in titles.items():
        sec = [r for r in rows if r.section == section]
        if not sec:
            continue
        passes = list(dict.fromkeys(r.pass_ for r in sec))
        lines += [f"### {title}", "",
                  "| case | backend | " + " | ".join(f"{p} ms | {p} TFLOP/s | {p} vs yardstick" for p in passes) + " |",
                  "|---|---|" + "---|---|---|" * len(passes)]
        for case in dict.fromkeys(r.case for r in sec):
            backends = list(dict.fromkeys(r.backend for r in sec if r.case == case))
            yard = "flashattn padded, same tokens" if section == "varlen" else backends[0]
            for backend in backends:
                cells = []
                for p in passes:
                    row = next(r for r in sec if r.case == case and r.backend == backend and r.pass_ == p)
                    ref = next(r for r in sec if r.case == case and r.backend == yard and r.pass_ == p)
                    if row.median_ms is None:
                        cells += [row.note or "-", "-", "-"]
                        continue
                    if section == "varlen":
                        ratio = f"{row.tflops / ref.tflops:.2f}x throughput" if ref.tflops else "-"
                    else:
                        ratio = f"{row.median_ms / ref.median_ms:.2f}x time" if ref.median_ms else "-"
                    cells += [f"{row.median_ms:.3f}", f"{row.tflops:.1f}", ratio]
                lines.append(f"| {case} | {backend} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def write_csv(rows, path):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["section", "case", "backend", "pass", "median_ms", "tflops", "note"])
        for r in rows:
            writer.writerow([r.section, r.case, r.backend, r.pass_,
                             "" if r.median_ms is None else f"{r.median_ms:.4f}",
                             "" if r.tflops is None else f"{r.tflops:.2f}", r.note])


def add_arguments(parser):
    add_out(parser, "benchmarks/results/features")
    parser.add_argument("--quick", action="store_true", help="half the tokens and sequence lengths")


def run(args):
    started = start_gpu_run(PROG, {pass_: (FWD_WARMUP_MS, FWD_REP_MS) for pass_ in ("fwd", "fwdbwd")})
    if started is None:
        return 2
    timers, header = started
    rows = feature_rows(timers, args.quick)
    out = results_folder(args.out, RESULTS_ROOT / "features")
    text = "\n".join(["# Feature benchmarks", ""] + header_lines(header) + ["", markdown(rows)])
    (out / "features.md").write_text(text)
    write_csv(rows, out / "features.csv")
    print(text)
    return 0
