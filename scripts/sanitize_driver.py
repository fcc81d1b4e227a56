"""The workload compute-sanitizer watches: every forward and backward kernel on awkward shapes.

    python scripts/sanitize_driver.py --sweep full|small

scripts/sanitize.py runs it under each tool; by hand, e.g.

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck python scripts/sanitize_driver.py

(without the caching allocator every tensor is its own allocation, so a read
past a tensor's end is out of bounds, not a read of a neighbour).

Every case runs the forward and both backward paths (dQ by atomics, and
deterministic) through the operators, on inputs the kernels read in place:
strided views of one packed tensor, or separate tensors of exactly their size.
The cases take the options in turn (OPTIONS: plain, sliding windows, softcap
with ALiBi, dropout, all of them, and variable-length batches that include a
sequence of length 0), so every compiled kernel variant (local or not, with
extras or not) and the varlen addressing run under every tool. Then KVCACHE_CASES
run flash_attn_with_kvcache (contiguous and paged caches, appends, rotary,
split-KV, leftpad), its kernels included: the append, the decoding kernel, the tiled
KV-cache forward and the combine, and KVCACHE_FP8_CASES the same over FP8 caches
(the FP8 KV-cache kernel; --kvcache-only runs just the KV-cache calls); PAGED_CASES run flash_attn_varlen_func over
paged k and v (block_table, seqused_k), forward and backward; model_feature_calls
runs learnable sinks (forward, backward with dsink and dlse, a split-KV decode) and
flash_attn_combine; and fp8_calls the FP8 forward (e4m3 q, k, v).

  full   both dtypes; every compiled head dim (32, 64, 96, 128, 192, 256, 512) and
         one head dim below each that runs on it with a partial tile (8, 40, 72, 104,
         136, 200, 328: at 512 also a partial second chunk of V's columns); sequence pairs with tails, Sq != Sk both ways and causal rows
         that see no key; MHA, GQA and MQA in turn; causal and not.
  small  for the slow tools (racecheck): both dtypes, every compiled head dim,
         causal and not, on one shape that still has two query tiles, several
         key tiles, a sequence tail, the causal diagonal and a GQA group of 2;
         then REUSE_CASES (bf16 d64, S = 2048, 16 heads over 2, causal and not;
         a cut variable-length batch at d64, 128, 192 and 256), where every shared-memory
         slot of the persistent forward and of the backward's stages is written
         again after it was read.

Prints "sanitize driver: N forward and M backward calls completed (sweep S)"
last; any CUDA error is an exception and a non-zero exit before that.
"""

import argparse
import itertools
import os

import torch

import flashattn  # registers torch.ops.flashattn

DTYPES = [torch.float16, torch.bfloat16]
KERNEL_HEAD_DIMS = [32, 64, 96, 128, 192, 256, 512]
PARTIAL_HEAD_DIMS = [8, 40, 72, 104, 136, 200, 328]  # each runs on the smallest compiled head dim above it
FULL_SEQLENS = [(1, 1), (3, 130), (130, 3), (77, 200), (200, 77)]
SMALL_SEQLENS = [(130, 190)]
HEADS = [(4, 4), (4, 2), (4, 1)]  # (H, Hk): MHA, GQA, MQA
# Keyword arguments of the operators, taken in turn by the cases; "varlen" packs the batch.
OPTIONS = [
    {},
    {"window_left": 17, "window_right": 5},
    {"softcap": 7.5, "alibi": True},
    {"dropout_p": 0.25},
    {"window_left": 40, "window_right": 0, "softcap": 3.0, "alibi": True, "dropout_p": 0.1},
    {"varlen": True},
    {"varlen": True, "window_left": 9, "window_right": 3, "dropout_p": 0.2},
    {"varlen": True, "cut": True, "softcap": 2.0},
]


# The head dim 512 backward takes 200.5 KB of shared memory per block (csrc/sm80/kernel_traits.h:
# BwdConfig<512>), which only sm_90 gives: under smaller tiles (FLASHATTN_MAX_SMEM_PER_BLOCK) its
# launch must fail with an error that leaves the process's CUDA context usable, and the sweep goes on.
SMEM_PER_BLOCK = int(os.environ.get("FLASHATTN_MAX_SMEM_PER_BLOCK", 227 * 1024))


def run_backward(head_dim: int, backward) -> int:
    """Calls backward(); returns 1, or 0 where head_dim's backward has no config for the shared memory
    allowed (its launch error, as expected)."""
    if head_dim <= 256 or SMEM_PER_BLOCK >= 227 * 1024:
        backward()
        return 1
    try:
        backward()
    except RuntimeError as error:
        if "shared memory per block" not in str(error):
            raise
        return 0
    raise AssertionError(f"head dim {head_dim}'s backward ran with {SMEM_PER_BLOCK} bytes of shared memory")


# A handoff through shared memory is checked by racecheck only where a slot is written again after
# it was read: a persistent forward block must draw more query tiles than it has work slots (2), so
# more than 2 x 132 query tiles on an H100, with and without the causal mask (dynamic and static
# schedules); a backward block must walk more steps than it has stages (2, at d256 1). Then a cut
# variable-length batch (sequences of 150 and 450 rows) at each head dim of the sm90 backward,
# whose tiles that reach past a sequence get those rows zeroed in shared memory (Q and dO by the
# producer, K and V by the consumers) before the tensor cores read them; at 192 and 256 the split
# kernel's hand-overs between its two warpgroups (P^T, dS^T) are reused every step.
REUSE_CASES = [
    (torch.bfloat16, 64, (2048, 2048), causal, (16, 2), "contiguous", 1, OPTIONS[0]) for causal in (False, True)
] + [
    (torch.bfloat16, head_dim, (300, 300), causal, (4, 2), "contiguous", 2, {"varlen": True, "cut": True})
    for head_dim in (64, 128, 192, 256) for causal in (False, True)
]


def sweep(name: str) -> list[tuple]:
    """(dtype, head_dim, (Sq, Sk), causal, (H, Hk), layout, batch, options) of every case of the sweep."""
    if name == "small":
        # Plain and everything-on, so each compiled kernel variant runs under the slow tools; then
        # REUSE_CASES, long enough that each shared-memory slot is handed over more than once.
        return [
            (dtype, head_dim, seqlens, causal, (2, 1), "contiguous", 1, options)
            for dtype, head_dim, seqlens, causal, options in itertools.product(
                DTYPES, KERNEL_HEAD_DIMS, SMALL_SEQLENS, [False, True], [OPTIONS[0], OPTIONS[4]]
            )
        ] + REUSE_CASES
    head_dims = sorted(KERNEL_HEAD_DIMS + PARTIAL_HEAD_DIMS)
    cases = []
    for i, (dtype, head_dim, seqlens) in enumerate(itertools.product(DTYPES, head_dims, FULL_SEQLENS)):
        layout = "packed" if i % 2 else "contiguous"  # with HEADS, every (layout, heads) pair in turn
        cases += [(dtype, head_dim, seqlens, causal, HEADS[i % len(HEADS)], layout, 2, OPTIONS[(2 * i + c) % len(OPTIONS)])
                  for c, causal in enumerate((False, True))]
    return cases


def operator_kwargs(options, q, k, v):
    """(q, k, v, kwargs) for the operators: the option values, ALiBi slopes, a dropout seed, and for
    varlen the batch packed into two sequences of uneven length (one of length 0 when S = 1)."""
    kwargs = {key: value for key, value in options.items() if key not in ("alibi", "varlen", "cut")}
    batch, num_heads = q.shape[0], q.shape[2]
    if options.get("dropout_p"):
        kwargs["rng_state"] = torch.randint(0, 2**62, (2,), device="cuda", dtype=torch.int64)
    if options.get("varlen"):
        q, k, v = (t.reshape(-1, *t.shape[2:]) for t in (q.contiguous(), k.contiguous(), v.contiguous()))
        cu_q = torch.tensor([0, q.shape[0] // 2 // batch, q.shape[0]], device="cuda", dtype=torch.int32)
        cu_k = torch.tensor([0, k.shape[0] // 2 // batch, k.shape[0]], device="cuda", dtype=torch.int32)
        kwargs.update(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=int(cu_q.diff().max()),
                      max_seqlen_k=int(cu_k.diff().max()))
        batch = 2
        if options.get("cut"):  # each sequence uses part of its rows: seqused_q, seqused_k, leftpad_k
            used_k = (cu_k.diff() * 3) // 4
            kwargs.update(seqused_q=(cu_q.diff() * 2) // 3, seqused_k=used_k, leftpad_k=used_k // 3)
    if options.get("alibi"):
        kwargs["alibi_slopes"] = torch.rand(batch, num_heads, device="cuda")
    return q, k, v, kwargs


def inputs(dtype, head_dim, seqlens, heads, layout, batch):
    """q [B, Sq, H, D], k and v [B, Sk, Hk, D]: separate tensors, or views of one packed tensor
    whose rows are longer than D (head dim padded by 8, so every row stays 16-byte aligned)."""
    (seqlen_q, seqlen_k), (num_heads, num_heads_k) = seqlens, heads
    if layout == "contiguous":
        q = torch.randn(batch, seqlen_q, num_heads, head_dim, device="cuda", dtype=dtype)
        k, v = (torch.randn(batch, seqlen_k, num_heads_k, head_dim, device="cuda", dtype=dtype) for _ in range(2))
        return q, k, v
    packed = torch.randn(batch, max(seqlen_q, seqlen_k), 3, num_heads, head_dim + 8, device="cuda", dtype=dtype)
    q = packed[:, :seqlen_q, 0, :, :head_dim]
    k = packed[:, :seqlen_k, 1, :num_heads_k, :head_dim]
    v = packed[:, :seqlen_k, 2, :num_heads_k, :head_dim]
    return q, k, v


# KV-cache calls (flash_attn_with_kvcache: the append, decoding and tiled forward, combine kernels):
# (head_dim, page size or None, seqlen_q, seqlen_new, num_splits, rotary, causal). Caches of 203
# rows, ragged lengths, GQA 4/2.
# (head_dim, page size or None, seqlen_q, seqlen_new, num_splits, rotary, causal,
# leftpad): up to 16 rows per head (the GQA pair of Sq = 1 included) run the
# decoding kernel, Sq = 20 the tiled KV-cache forward.
KVCACHE_CASES = [
    (64, None, 1, 1, 0, True, False, False),
    (128, 16, 1, 0, 3, False, True, True),
    (72, 64, 7, 3, 1, True, True, True),
    (256, 5, 2, 2, 0, False, False, False),
    (128, None, 20, 4, 2, True, True, False),
    (192, 32, 20, 0, 0, False, False, True),
]


def kvcache_calls(dtype) -> int:
    """Runs every KVCACHE_CASES case on dtype; returns the number of calls."""
    from flashattn import flash_attn_with_kvcache

    batch, capacity, heads, heads_k = 2, 203, 4, 2
    for head_dim, page, seqlen_q, seqlen_new, splits, rotary, causal, leftpad in KVCACHE_CASES:
        if page is None:
            k_cache = torch.randn(batch, capacity, heads_k, head_dim, device="cuda", dtype=dtype)
            table = None
        else:
            pages = -(-capacity // page)
            k_cache = torch.randn(batch * pages, page, heads_k, head_dim, device="cuda", dtype=dtype)
            table = torch.randperm(batch * pages, device="cuda").to(torch.int32).reshape(batch, pages)
        v_cache = torch.randn_like(k_cache)
        seqlens = torch.tensor([capacity - seqlen_new, 17], device="cuda", dtype=torch.int32)
        q = torch.randn(batch, seqlen_q, heads, head_dim, device="cuda", dtype=dtype)
        new = [torch.randn(batch, seqlen_new, heads_k, head_dim, device="cuda", dtype=dtype) for _ in range(2)]
        angles = torch.rand(capacity + seqlen_q, head_dim // 4, device="cuda")
        flash_attn_with_kvcache(q, k_cache, v_cache, *(new if seqlen_new else (None, None)),
                                rotary_cos=angles.cos() if rotary else None,
                                rotary_sin=angles.sin() if rotary else None, cache_seqlens=seqlens,
                                cache_leftpad=seqlens // 3 if leftpad else None, block_table=table, causal=causal,
                                num_splits=splits)
    # One-row pages over 2600 rows, one split: the decoding kernel copies the block table into shared
    # memory 512 entries at a time, so this walks five windows (the copies past the first two included).
    table = torch.randperm(batch * 2600, device="cuda").to(torch.int32).reshape(batch, 2600)
    k_cache = torch.randn(batch * 2600, 1, heads_k, 128, device="cuda", dtype=dtype)
    seqlens = torch.tensor([2600, 1100], device="cuda", dtype=torch.int32)
    flash_attn_with_kvcache(torch.randn(batch, 1, heads, 128, device="cuda", dtype=dtype), k_cache,
                            torch.randn_like(k_cache), cache_seqlens=seqlens, cache_leftpad=seqlens // 5,
                            block_table=table, num_splits=1)
    return len(KVCACHE_CASES) + 1


# KV-cache calls over an FP8 (e4m3) cache, 16-bit q (the FP8 KV-cache kernel: the decoding kernel
# on 8-bit tiles, and the FP8 append): (head_dim, v head dim, page size or None, seqlen_q, seqlen_new,
# num_splits, rotary, causal). Caches of 203 rows, ragged lengths, GQA 4/2 (packed at Sq = 1).
KVCACHE_FP8_CASES = [
    (64, 64, None, 1, 1, 0, True, False),
    (128, 128, 16, 1, 0, 3, False, True),
    (80, 80, 64, 7, 3, 1, True, True),
    (256, 256, 5, 2, 2, 0, False, False),
    (192, 128, 32, 16, 0, 0, False, True),
    (96, 96, None, 3, 2, 5, False, False),
]


def kvcache_fp8_calls(dtype) -> int:
    """Runs every KVCACHE_FP8_CASES case with q in dtype; returns the number of calls."""
    from flashattn import flash_attn_with_kvcache, fp8

    e4m3 = torch.float8_e4m3fn
    batch, capacity, heads, heads_k = 2, 203, 4, 2
    for head_dim, v_head_dim, page, seqlen_q, seqlen_new, splits, rotary, causal in KVCACHE_FP8_CASES:
        rows, per = (batch, capacity) if page is None else (batch * -(-capacity // page), page)
        k_cache = torch.randn(rows, per, heads_k, head_dim, device="cuda").to(e4m3)
        v_cache = torch.randn(rows, per, heads_k, v_head_dim, device="cuda").to(e4m3)
        table = None if page is None else torch.randperm(rows, device="cuda").to(torch.int32).reshape(batch, -1)
        seqlens = torch.tensor([capacity - seqlen_new, 17], device="cuda", dtype=torch.int32)
        q = torch.randn(batch, seqlen_q, heads, head_dim, device="cuda", dtype=dtype)
        new = [torch.randn(batch, seqlen_new, heads_k, d, device="cuda").to(e4m3) for d in (head_dim, v_head_dim)]
        angles = torch.rand(capacity + seqlen_q, head_dim // 4, device="cuda")
        descale = torch.rand(batch, heads_k, device="cuda") + 0.5
        assert fp8.runs_kvcache_kernel(q, k_cache, v_cache, *new), "the FP8 KV-cache kernel takes these calls"
        flash_attn_with_kvcache(q, k_cache, v_cache, *(new if seqlen_new else (None, None)),
                                rotary_cos=angles.cos() if rotary else None,
                                rotary_sin=angles.sin() if rotary else None, cache_seqlens=seqlens,
                                block_table=table, causal=causal, num_splits=splits, k_descale=descale,
                                v_descale=descale)
    return len(KVCACHE_FP8_CASES)


# Paged variable-length batches (the forward reading k and v through a block table, and the backward
# on the gathered pages): (head_dim, page size), three sequences of ragged lengths, GQA 4/2, pages
# shuffled, the block table's entries past each sequence out of range (never read).
PAGED_CASES = [(32, 16), (64, 1), (96, 5), (128, 64), (192, 7), (256, 256), (72, 16), (512, 16)]


def paged_calls(dtype) -> int:
    """Runs every PAGED_CASES case on dtype, forward and backward (causal, then with seqused_k and a
    window); returns the number of calls."""
    from flashattn import flash_attn_varlen_func

    lengths_q, lengths_k = [7, 0, 130], [200, 3, 130]
    for i, (head_dim, page) in enumerate(PAGED_CASES):
        counts = [-(-n // page) for n in lengths_k]
        pages = torch.randperm(sum(counts), device="cuda").to(torch.int32)
        table = torch.full((3, max(counts) + 1), 10**6, device="cuda", dtype=torch.int32)
        for b, start in enumerate([0, counts[0], counts[0] + counts[1]]):
            table[b, : counts[b]] = pages[start : start + counts[b]]
        k, v = (torch.randn(sum(counts), page, 2, head_dim, device="cuda", dtype=dtype, requires_grad=True)
                for _ in range(2))
        q = torch.randn(sum(lengths_q), 4, head_dim, device="cuda", dtype=dtype, requires_grad=True)
        cu_q = torch.tensor([0, 7, 7, 137], device="cuda", dtype=torch.int32)
        cu_k = torch.tensor([0, 200, 203, 333], device="cuda", dtype=torch.int32)
        extra = {"seqused_k": torch.tensor([150, 3, 1], device="cuda", dtype=torch.int32),
                 "window_size": (33, 4)} if i % 2 else {"causal": True}  # fmt: skip
        out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 130, 200, block_table=table, deterministic=i % 3 == 0,
                                     **extra)
        run_backward(head_dim, lambda: out.backward(torch.randn_like(out)))
    return 2 * len(PAGED_CASES)


def model_feature_calls(dtype) -> int:
    """Learnable sinks (forward, and backward through out and the LSE: dsink and dlse), a KV-cache
    decode with a sink over split-KV, flash_attn_combine with head dims that leave lanes of a warp
    without a column, and v narrower than q and k; returns the number of calls."""
    from flashattn import flash_attn_combine, flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

    calls = 0
    for head_dim, causal in itertools.product((64, 128, 200), (False, True)):
        q, k, v = (torch.randn(2, s, 4, head_dim, device="cuda", dtype=dtype, requires_grad=True)
                   for s in (190, 211, 211))
        sink = torch.randn(4, device="cuda", requires_grad=True)
        out, lse, _ = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True, learnable_sink=sink)
        torch.autograd.backward((out, lse), (torch.randn_like(out), torch.randn_like(lse)))
        calls += 2
    cache_k, cache_v = (torch.randn(2, 300, 2, 128, device="cuda", dtype=dtype) for _ in range(2))
    q = torch.randn(2, 1, 4, 128, device="cuda", dtype=dtype)
    flash_attn_with_kvcache(q, cache_k, cache_v, cache_seqlens=torch.tensor([300, 17], device="cuda",
                                                                            dtype=torch.int32),
                            num_splits=3, learnable_sink=torch.randn(4, device="cuda"))
    calls += 1
    for splits, shape in ((3, (2, 5, 4, 8)), (5, (1, 7, 3, 200)), (37, (1, 3, 2, 128))):
        out_partial = torch.randn(splits, *shape, device="cuda")
        lse_partial = torch.randn(splits, *shape[:-1], device="cuda")
        flash_attn_combine(out_partial, lse_partial, out_dtype=dtype)
        calls += 1
    # v narrower than q and k (issue 21): sm90's forward compiled for 192 / 128, and kernels whose V tiles
    # have whole column blocks past v's head dim (192 / 40, 128 / 8: not copied on sm90), forward and
    # backward, padded and packed rows, and a split-KV decode and an append with a narrower v_cache.
    # Head dim 512 with v of 200 (one chunk of V's columns) and 392 (a partial second chunk).
    for (head_dim, v_head_dim), causal in itertools.product(((192, 128), (192, 40), (128, 8), (64, 24), (512, 200),
                                                             (488, 392)), (False, True)):
        q, k = (torch.randn(2, s, 4, head_dim, device="cuda", dtype=dtype, requires_grad=True) for s in (190, 211))
        v = torch.randn(2, 211, 4, v_head_dim, device="cuda", dtype=dtype, requires_grad=True)
        out = flash_attn_func(q, k, v, causal=causal)
        run_backward(head_dim, lambda: out.backward(torch.randn_like(out)))
        cu = torch.tensor([0, 100, 190], device="cuda", dtype=torch.int32)
        out = flash_attn_varlen_func(q[0], k[0, :190], v[0, :190], cu, cu, 90, 100, causal=causal)
        run_backward(head_dim, lambda: out.backward(torch.randn_like(out)))
        calls += 4
    cache_k = torch.randn(2, 300, 2, 192, device="cuda", dtype=dtype)
    cache_v = torch.randn(2, 300, 2, 128, device="cuda", dtype=dtype)
    flash_attn_with_kvcache(torch.randn(2, 1, 4, 192, device="cuda", dtype=dtype), cache_k, cache_v,
                            k=torch.randn(2, 1, 2, 192, device="cuda", dtype=dtype),
                            v=torch.randn(2, 1, 2, 128, device="cuda", dtype=dtype),
                            cache_seqlens=torch.tensor([290, 17], device="cuda", dtype=torch.int32), num_splits=3)
    calls += 1
    return calls


def fp8_calls(out_dtype) -> int:
    """flash_attn_func and flash_attn_varlen_func on e4m3 q, k, v (the sm90 FP8 kernel where the family
    has it, else the dequantising path): head dims 64 and 128 (its d128 kernel, whose producer warps
    transpose v), 192 and 256 (its d256 one, after the transposing kernel), causal and not, a window,
    GQA, key counts that end inside a tile and walk several (stages written again after they were
    read), and a packed batch with a sequence without keys; then the dequantising route's kernel on
    aligned, unaligned and strided values; returns the number of calls."""
    from flashattn import flash_attn_func, flash_attn_varlen_func

    fp8 = torch.float8_e4m3fn
    calls = 0
    for head_dim, (seqlen_q, seqlen_k), causal in itertools.product((64, 128, 192, 256), ((130, 1000), (333, 301)),
                                                                    (False, True)):
        q = torch.randn(2, seqlen_q, 4, head_dim, device="cuda").to(fp8)
        k, v = (torch.randn(2, seqlen_k, 2, head_dim, device="cuda").to(fp8) for _ in range(2))
        descale = torch.rand(2, 2, device="cuda") + 0.5
        flash_attn_func(q, k, v, causal=causal, q_descale=descale, k_descale=descale, v_descale=descale,
                        out_dtype=out_dtype)
        flash_attn_func(q, k, v, window_size=(77, 20), out_dtype=out_dtype)
        calls += 2
    for head_dim in (128, 256):
        lengths_q, lengths_k = [37, 5, 129], [91, 0, 403]
        q = torch.randn(sum(lengths_q), 4, head_dim, device="cuda").to(fp8)
        k, v = (torch.randn(sum(lengths_k), 2, head_dim, device="cuda").to(fp8) for _ in range(2))
        cu_q, cu_k = (torch.tensor([0, *itertools.accumulate(n)], device="cuda", dtype=torch.int32)
                      for n in (lengths_q, lengths_k))
        for causal in (False, True):
            flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=causal,
                                   out_dtype=out_dtype)
            calls += 1
    # The dequantising route's kernel (dequantize_fp8): 16 values a thread (head dims 64, 128), one
    # (head dim 40, a strided view), packed rows, a tensor of fewer values than a block.
    for shape, view in (((2, 33, 3, 64), False), ((3, 17, 2, 40), False), ((2, 9, 4, 128), True),
                        ((1, 1, 1, 16), False)):
        t = torch.randn(shape, device="cuda").to(fp8)
        if view:
            t = t[:, :, :, 8:72]
        factor = torch.rand(shape[0], shape[2], device="cuda")
        torch.ops.flashattn.dequantize_fp8(t, factor, out_dtype)
        torch.ops.flashattn.dequantize_fp8(t[:, 0].unsqueeze(1), factor, out_dtype)
        calls += 2
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", choices=["full", "small"], default="full")
    parser.add_argument("--kvcache-only", action="store_true",
                        help="only the KV-cache calls, 16-bit and FP8 caches (kernel work on the KV-cache kernels)")
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.kvcache_only:
        calls = sum(kvcache_calls(dtype) + kvcache_fp8_calls(dtype) for dtype in DTYPES)
        torch.cuda.synchronize()
        flashattn.check_faults()
        print(f"sanitize driver: {calls} KV-cache calls completed (16-bit and FP8 caches)")
        return
    forward_calls = backward_calls = 0
    for dtype, head_dim, seqlens, causal, heads, layout, batch, options in sweep(args.sweep):
        q, k, v, kwargs = operator_kwargs(options, *inputs(dtype, head_dim, seqlens, heads, layout, batch))
        scale = head_dim**-0.5
        out, lse = torch.ops.flashattn.fwd(q, k, v, scale, causal, **kwargs)
        dout = torch.randn_like(out)
        forward_calls += 1
        for deterministic in (False, True):
            backward_calls += run_backward(head_dim, lambda: torch.ops.flashattn.bwd(
                dout, q, k, v, out, lse, scale, causal, deterministic, **kwargs))
    kvcache = sum(kvcache_calls(dtype) + kvcache_fp8_calls(dtype) for dtype in DTYPES)
    paged = sum(paged_calls(dtype) for dtype in DTYPES)
    features = sum(model_feature_calls(dtype) for dtype in DTYPES)
    fp8 = sum(fp8_calls(dtype) for dtype in DTYPES)
    torch.cuda.synchronize()
    flashattn.check_faults()  # the block tables' out-of-range entries past each sequence were never read
    print(f"sanitize driver: {forward_calls} forward and {backward_calls} backward calls completed "
          f"(sweep {args.sweep}), {kvcache} KV-cache calls, {paged} paged varlen calls, {features} "
          f"calls of sinks, combine and narrower v and {fp8} FP8 calls")


if __name__ == "__main__":
    main()
