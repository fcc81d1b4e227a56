"""Paged and cut variable-length batches: flash_attn_varlen_func with block_table (chunked prefill
over a paged KV cache), seqused_q / seqused_k, and leftpad_k (through the private
_flash_attn_varlen_forward entry point and the operator).

Each sequence is checked against the reference run on that sequence alone, on exactly the
queries and keys it uses (forward and backward, within the bounds of tests/helpers.py, every
feature of tests/test_features.py, dropout drawn with the sequence's index); rows no sequence
uses get out 0, lse -inf and zero gradients. Pages are shuffled in a pool larger than the batch
needs, pool rows no sequence uses hold random values, and block-table entries past a sequence's
pages hold out-of-range values: reading any of them shows. Values out of range raise on CPU at
the call and on CUDA at the next call (the kernels clamp and record them), the process going on.
On a Hopper GPU the sm90 forward copies paged keys in one of two ways (TMA boxes, or rows gathered
by cp.async), which FLASHATTN_SM90_PAGED_COPY picks at every call: the tests at the end run both.
"""

import itertools
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import (
    DEVICES,
    assert_grads_match_reference,
    assert_matches_reference,
    case_seed,
    poisoned_allocations,
    run_backward,
    run_forward,
)
from test_features import FEATURES, HEADS, MASKS, feature_options
from test_varlen import offsets, sequence_options

import flashattn
from flashattn import flash_attn_varlen_func
from flashattn.cpu import out_shape
from flashattn.flash_attn_interface import _flash_attn_varlen_forward
from flashattn.interface import _flash_attn_forward

# (query lengths, key lengths) of the sequences; keys >= queries where the chunk's own keys are
# in the cache (chunked prefill), and a few the other way.
LENGTHS = {
    "mixed": ([0, 1, 113, 3, 97, 17], [5, 0, 203, 113, 300, 17]),
    "chunks": ([64, 1, 128], [64, 129, 1000]),
}
GPU_LENGTHS = {**LENGTHS, "long": ([512, 0, 777, 1], [2048, 7, 2000, 513])}
PAGE_SIZES = [16, 1, 256, 7, 64]
GPU_HEAD_DIMS = [32, 64, 96, 128, 192, 256, 40]  # 40: padded to 48 on CUDA
CPU_HEAD_DIMS = [32, 59]
GPU_DTYPES = [torch.float16, torch.bfloat16]
CPU_DTYPES = [torch.float32, torch.bfloat16]
COPY_MODES = ["auto", "tma", "gather", "gather8"]  # FLASHATTN_SM90_PAGED_COPY


def sm90_runs_paged(page_size: int) -> bool:
    """Whether the sm90 forward takes paged keys of this page size (a head dim over 32, no ALiBi or
    dropout) under this process's FLASHATTN_SM90_PAGED_COPY: gathered rows take any page size, TMA
    boxes (tma) only multiples of 8 (every tile height is a multiple of 16; csrc/sm90/dispatch.cu)."""
    mode = os.environ.get("FLASHATTN_SM90_PAGED_COPY", "auto") or "auto"
    return flashattn.kernel_family() == "sm90" and (mode != "tma" or page_size % 8 == 0)


def pages_of(keys: list[torch.Tensor], page_size: int, device: str, gen: torch.Generator,
             shared: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The sequences' keys (each [L, Hk, D]) scattered into shuffled pages of a pool with spare pages
    (every pool row no sequence uses random), and the block table that lists them; entries past a
    sequence's pages are out of range (never read). shared > 0: every sequence's first `shared`
    pages are sequence 0's (prefix sharing; their keys are sequence 0's)."""
    counts = [-(-len(k) // page_size) for k in keys]
    num_pages = sum(counts) + 3
    width = max(counts, default=0) + 1
    hk, d = keys[0].shape[1:] if keys else (1, 8)
    dtype = keys[0].dtype if keys else torch.float32
    pool = torch.randn(num_pages, page_size, hk, d, generator=gen, device=device).to(dtype)
    order = torch.randperm(num_pages, generator=torch.Generator().manual_seed(int(gen.initial_seed()) % 2**31))
    table = torch.tensor([[[-7, num_pages + 5][(b + j) % 2] for j in range(width)] for b in range(len(keys))],
                         dtype=torch.int32)
    used = 0
    for b, k in enumerate(keys):
        for j in range(counts[b]):
            if j < shared and b > 0 and j < counts[0]:
                table[b, j] = table[0, j]
                continue
            page = int(order[used])
            used += 1
            rows = k[j * page_size : (j + 1) * page_size]
            pool[page, : len(rows)] = rows
            table[b, j] = page
    return pool, table.to(device)


def sequence_keys(pool: torch.Tensor, table: torch.Tensor, b: int, length: int) -> torch.Tensor:
    """Sequence b's first `length` key rows, gathered from its pages."""
    pages = table[b, : -(-length // pool.shape[1])].long()
    return pool[pages].flatten(0, 1)[:length]


def paged_batch(lengths_q, lengths_k, heads, head_dim, dtype, device, seed, page_size, cut_q=False, v_head_dim=None):
    """q (total_q, H, D), k and v pages (v's of head dim v_head_dim, by default D), the varlen arguments
    with block_table, and per sequence (query rows, key length) that it uses. cut_q: seqused_q cuts
    some sequences' queries."""
    gen = torch.Generator(device=device).manual_seed(seed)
    num_heads, num_heads_k = heads
    v_head_dim = v_head_dim or head_dim
    q = torch.randn(sum(lengths_q), num_heads, head_dim, generator=gen, device=device).to(dtype)
    keys = [torch.randn(n, num_heads_k, head_dim, generator=gen, device=device).to(dtype) for n in lengths_k]
    values = [torch.randn(n, num_heads_k, v_head_dim, generator=gen, device=device).to(dtype) for n in lengths_k]
    k_pages, table = pages_of(keys, page_size, device, gen)
    v_pages = torch.randn((*k_pages.shape[:-1], v_head_dim), generator=gen, device=device).to(dtype)
    for b, v in enumerate(values):  # the same pages as k's
        for j in range(-(-len(v) // page_size)):
            rows = v[j * page_size : (j + 1) * page_size]
            v_pages[table[b, j], : len(rows)] = rows
    used_q = [n - (n // 3 if cut_q and b % 2 == 0 else 0) for b, n in enumerate(lengths_q)]
    varlen = {
        "cu_seqlens_q": offsets(lengths_q, device),
        "cu_seqlens_k": offsets(lengths_k, device),
        "max_seqlen_q": max(lengths_q),
        "max_seqlen_k": max(lengths_k),
        "block_table": table,
    }
    if cut_q:
        varlen["seqused_q"] = torch.tensor(used_q, dtype=torch.int32, device=device)
    starts = varlen["cu_seqlens_q"].tolist()
    uses = [(slice(starts[b], starts[b] + used_q[b]), lengths_k[b]) for b in range(len(lengths_q))]
    return q, k_pages, v_pages, varlen, uses


def assert_unused_rows(out, lse, q_rows_used: list[slice]) -> None:
    """Rows no sequence uses: out exactly 0, lse -inf."""
    unused = torch.ones(out.shape[0], dtype=torch.bool, device=out.device)
    for rows in q_rows_used:
        unused[rows] = False
    assert torch.equal(out[unused], torch.zeros_like(out[unused]))
    assert (lse[:, unused] == -torch.inf).all()


def _case_id(feature, dtype, head_dim, lengths, heads, page_size) -> str:
    return f"{feature}-{str(dtype).removeprefix('torch.')}-d{head_dim}-{lengths}-h{heads[0]}kv{heads[1]}-p{page_size}"


def _cases(device: str) -> list:
    """Every feature x dtype x head dim (GPU) or every feature (CPU), the rest cycling."""
    cases = []
    if device == "cuda":
        grid = itertools.product(enumerate(FEATURES), GPU_DTYPES, enumerate(GPU_HEAD_DIMS))
        for i, ((f, feature), dtype, (d, head_dim)) in enumerate(grid):
            lengths = list(GPU_LENGTHS)[(f + d) % len(GPU_LENGTHS)]
            case = (feature, dtype, head_dim, lengths, HEADS[(f + d) % 3], PAGE_SIZES[i % len(PAGE_SIZES)])
            cases.append(pytest.param(*case, id=_case_id(*case)))
    else:
        for f, feature in enumerate(FEATURES):
            case = (feature, CPU_DTYPES[f % 2], CPU_HEAD_DIMS[f % 2], list(LENGTHS)[f % 2], HEADS[f % 3],
                    PAGE_SIZES[f % len(PAGE_SIZES)])  # fmt: skip
            cases.append(pytest.param(*case, id=_case_id(*case)))
    return cases


def _check_paged_forward(device, feature, dtype, head_dim, lengths, heads, page_size, v_head_dim=None):
    """v_head_dim: v's head dim, when not head_dim (tests/test_mla_head_dims.py)."""
    lengths_q, lengths_k = GPU_LENGTHS[lengths]
    dims = head_dim if v_head_dim is None else (head_dim, v_head_dim)
    seed = case_seed("paged forward", device, feature, dtype, dims, lengths, heads, page_size)
    cut_q = seed % 2 == 0
    q, k, v, varlen, uses = paged_batch(lengths_q, lengths_k, heads, head_dim, dtype, device, seed, page_size, cut_q,
                                        v_head_dim)  # fmt: skip
    causal, scale, options = feature_options(feature, len(lengths_q), heads[0], device, seed)
    scale = head_dim**-0.5 if scale is None else scale
    out, lse = run_forward(q, k, v, scale, causal, **options, **varlen)
    assert out.shape == out_shape(q, v) and lse.shape == (heads[0], q.shape[0])
    table = varlen["block_table"]
    for b, (rows, length) in enumerate(uses):
        k_b, v_b = sequence_keys(k, table, b, length), sequence_keys(v, table, b, length)
        assert_matches_reference(
            out[rows][None], lse[:, rows][None], q[rows][None], k_b[None], v_b[None], scale, causal,
            batch_start=b, **sequence_options(options, b),
        )  # fmt: skip
    assert_unused_rows(out, lse, [rows for rows, _ in uses])
    if device == "cuda":
        flashattn.check_faults()  # the out-of-range entries past each sequence's pages were never read


@pytest.mark.parametrize("feature, dtype, head_dim, lengths, heads, page_size", _cases("cpu"))
def test_paged_forward_cpu(feature, dtype, head_dim, lengths, heads, page_size):
    _check_paged_forward("cpu", feature, dtype, head_dim, lengths, heads, page_size)


@pytest.mark.gpu
@pytest.mark.parametrize("feature, dtype, head_dim, lengths, heads, page_size", _cases("cuda"))
def test_paged_forward_gpu(feature, dtype, head_dim, lengths, heads, page_size):
    _check_paged_forward("cuda", feature, dtype, head_dim, lengths, heads, page_size)


def _check_paged_backward(device, feature, dtype, head_dim, lengths, heads, page_size, deterministic,
                          v_head_dim=None):  # fmt: skip
    lengths_q, lengths_k = GPU_LENGTHS[lengths]
    dims = head_dim if v_head_dim is None else (head_dim, v_head_dim)
    seed = case_seed("paged backward", device, feature, dtype, dims, lengths, heads, page_size)
    q, k, v, varlen, uses = paged_batch(lengths_q, lengths_k, heads, head_dim, dtype, device, seed, page_size,
                                        cut_q=seed % 2 == 0, v_head_dim=v_head_dim)  # fmt: skip
    dout = torch.randn(out_shape(q, v), generator=torch.Generator(device).manual_seed(seed + 1),
                       device=device).to(dtype)
    causal, scale, options = feature_options(feature, len(lengths_q), heads[0], device, seed)
    scale = head_dim**-0.5 if scale is None else scale
    dq, dk, dv = run_backward(q, k, v, dout, scale, causal, deterministic, **options, **varlen)
    assert dk.shape == k.shape and dv.shape == v.shape
    out, _ = _flash_attn_forward(q, k, v, scale, causal, **options, **varlen)
    table = varlen["block_table"]
    touched = torch.zeros(k.shape[:2], dtype=torch.bool, device=device)  # pool rows some sequence uses
    for b, (rows, length) in enumerate(uses):
        pages = table[b, : -(-length // page_size)].long()
        first_rows = page_size * torch.arange(len(pages), device=device)[:, None]
        touched[pages] |= torch.arange(page_size, device=device) < length - first_rows
        k_b, v_b = sequence_keys(k, table, b, length), sequence_keys(v, table, b, length)
        dk_b, dv_b = sequence_keys(dk, table, b, length), sequence_keys(dv, table, b, length)
        if rows.start == rows.stop or length == 0:
            for grad in (dq[rows], dk_b, dv_b):
                assert torch.equal(grad, torch.zeros_like(grad))
            continue
        assert_grads_match_reference(
            (dq[rows][None], dk_b[None], dv_b[None]), q[rows][None], k_b[None], v_b[None], dout[rows][None], scale,
            causal, stored_out=out[rows][None], batch_start=b, **sequence_options(options, b),
        )  # fmt: skip
    for grad in (dk, dv):  # rows of the pool that no sequence uses
        assert torch.equal(grad[~touched], torch.zeros_like(grad[~touched]))
    unused_q = torch.ones(q.shape[0], dtype=torch.bool, device=device)
    for rows, _ in uses:
        unused_q[rows] = False
    assert torch.equal(dq[unused_q], torch.zeros_like(dq[unused_q]))


@pytest.mark.parametrize("feature", ["causal-window", "softcap", "alibi-batch-heads", "dropout"])
def test_paged_backward_cpu(feature):
    _check_paged_backward("cpu", feature, torch.float32, 32, "mixed", (4, 2), 16, False)


def _backward_cases() -> list:
    cases = []
    for i, ((f, feature), dtype) in enumerate(itertools.product(enumerate(FEATURES), GPU_DTYPES)):
        case = (feature, dtype, GPU_HEAD_DIMS[i % len(GPU_HEAD_DIMS)], list(GPU_LENGTHS)[i % 3], HEADS[i % 3],
                PAGE_SIZES[i % len(PAGE_SIZES)])  # fmt: skip
        cases.append(pytest.param(*case, id=_case_id(*case)))
    return cases


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("feature, dtype, head_dim, lengths, heads, page_size", _backward_cases())
def test_paged_backward_gpu(feature, dtype, head_dim, lengths, heads, page_size, deterministic):
    _check_paged_backward("cuda", feature, dtype, head_dim, lengths, heads, page_size, deterministic)


@pytest.mark.parametrize("device", DEVICES)
def test_paged_is_contiguous_varlen_on_the_same_tokens(device):
    """The same tokens packed or paged (page 16, 256 and 1): the same bits of out and lse (one kernel
    per tile of keys either way), and gradients that agree once gathered. On a Hopper GPU where
    FLASHATTN_SM90_PAGED_COPY=tma sends pages of one row to the sm80 family (packed keys run on
    sm90), the two agree to rounding."""
    lengths_q, lengths_k = [100, 1, 37], [300, 20, 37]
    seed = case_seed("paged-vs-packed", device)
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = torch.bfloat16
    q = torch.randn(sum(lengths_q), 4, 64, generator=gen, device=device).to(dtype)
    k, v = (torch.randn(sum(lengths_k), 2, 64, generator=gen, device=device).to(dtype) for _ in range(2))
    cu_q, cu_k = offsets(lengths_q, device), offsets(lengths_k, device)
    args = dict(max_seqlen_q=max(lengths_q), max_seqlen_k=max(lengths_k), causal=True)
    packed = flash_attn_varlen_func(q, k, v, cu_q, cu_k, **args, return_attn_probs=True)
    starts = cu_k.tolist()
    for page_size in (16, 256, 1):
        keys = [k[starts[b] : starts[b + 1]] for b in range(3)]
        k_pages, table = pages_of(keys, page_size, device, gen)
        v_pages = k_pages.clone()
        for b in range(3):
            for j in range(-(-lengths_k[b] // page_size)):
                rows = v[starts[b] + j * page_size : min(starts[b] + (j + 1) * page_size, starts[b + 1])]
                v_pages[table[b, j], : len(rows)] = rows
        paged = flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, **args, return_attn_probs=True,
                                       block_table=table)  # fmt: skip
        if device == "cuda" and flashattn.kernel_family() == "sm90" and not sm90_runs_paged(page_size):
            torch.testing.assert_close(paged[0], packed[0], rtol=2 * torch.finfo(dtype).eps, atol=2 * torch.finfo(dtype).eps)
            torch.testing.assert_close(paged[1], packed[1], rtol=0, atol=1e-5)
        else:
            assert torch.equal(paged[0], packed[0]) and torch.equal(paged[1], packed[1]), page_size


@pytest.mark.parametrize("device", DEVICES)
def test_shared_pages_sum_their_gradients(device):
    """Two sequences listing the same first pages (a shared prompt prefix): dk and dv of a shared page
    are the sum of both sequences' shares, as the packed batch with the prefix copied gives them."""
    seed = case_seed("shared pages", device)
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype, page_size = torch.float16 if device == "cuda" else torch.float32, 16
    lengths_q, lengths_k = [20, 33], [70, 90]
    q = torch.randn(sum(lengths_q), 2, 32, generator=gen, device=device).to(dtype)
    prefix = torch.randn(32, 2, 32, generator=gen, device=device).to(dtype)  # 2 pages
    keys = [torch.cat([prefix, torch.randn(n - 32, 2, 32, generator=gen, device=device).to(dtype)])
            for n in lengths_k]  # fmt: skip
    k_pages, table = pages_of(keys, page_size, device, gen, shared=2)
    v_pages = k_pages.clone()  # values = keys: enough for the sums
    dout = torch.randn(q.shape, generator=gen, device=device).to(dtype)
    cu_q, cu_k = offsets(lengths_q, device), offsets(lengths_k, device)
    leaves = [t.detach().requires_grad_() for t in (q, k_pages, v_pages)]
    out = flash_attn_varlen_func(*leaves, cu_q, cu_k, 33, 90, causal=True, block_table=table)
    dq, dk, dv = torch.autograd.grad(out, leaves, dout)
    packed = [torch.cat(keys).detach().requires_grad_() for _ in range(2)]
    q_leaf = q.detach().requires_grad_()
    out_packed = flash_attn_varlen_func(q_leaf, *packed, cu_q, cu_k, 33, 90, causal=True)
    dq_p, dk_p, dv_p = torch.autograd.grad(out_packed, [q_leaf, *packed], dout)
    assert torch.equal(out, out_packed) and torch.equal(dq, dq_p)
    for grad, grad_packed in ((dk, dk_p), (dv, dv_p)):
        want = torch.zeros(k_pages.shape, dtype=torch.float32, device=device)
        start = 0
        for b, n in enumerate(lengths_k):
            for j in range(-(-n // page_size)):
                rows = grad_packed[start + j * page_size : min(start + (j + 1) * page_size, start + n)].float()
                want[table[b, j], : len(rows)] += rows
            start += n
        torch.testing.assert_close(grad.float(), want.to(dtype).float(), rtol=0, atol=2 * torch.finfo(dtype).eps *
                                   want.abs().max().item())  # fmt: skip


# ---------------------------------------------------------------------- seqused_q, seqused_k, leftpad_k

def _cut_cases(device: str) -> list:
    cases = []
    dtypes, dims = (GPU_DTYPES, GPU_HEAD_DIMS) if device == "cuda" else (CPU_DTYPES, CPU_HEAD_DIMS)
    for i, ((f, feature), dtype) in enumerate(itertools.product(enumerate(FEATURES), dtypes)):
        if device == "cpu" and i % 2:
            continue
        case = (feature, dtype, dims[i % len(dims)], HEADS[i % 3], ["q", "k", "qk", "qk-leftpad"][i % 4])
        cases.append(pytest.param(*case, id=f"{feature}-{str(dtype)[6:]}-d{case[2]}-h{case[3][0]}kv{case[3][1]}-{case[4]}"))
    return cases


def _cut_batch(device, dtype, head_dim, heads, cut, seed):
    """A packed batch whose sequences use part of their cu_seqlens ranges: seqused_q (cut "q"),
    seqused_k ("k"), leftpad_k ("leftpad"); the used (query rows, key rows) of each sequence."""
    lengths_q, lengths_k = [0, 1, 113, 30, 97, 17], [5, 0, 203, 113, 300, 17]
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(sum(lengths_q) + 3, heads[0], head_dim, generator=gen, device=device).to(dtype)
    k, v = (torch.randn(sum(lengths_k), heads[1], head_dim, generator=gen, device=device).to(dtype)
            for _ in range(2))  # fmt: skip
    used_q = [n - n // 4 for n in lengths_q] if "q" in cut else lengths_q
    used_k = [n - n // 5 for n in lengths_k] if "k" in cut else lengths_k
    pads = [u // 3 for u in used_k] if "leftpad" in cut else [0] * len(lengths_k)
    i32 = lambda values: torch.tensor(values, dtype=torch.int32, device=device)  # noqa: E731
    varlen = {"cu_seqlens_q": offsets(lengths_q, device), "cu_seqlens_k": offsets(lengths_k, device),
              "max_seqlen_q": max(lengths_q), "max_seqlen_k": max(lengths_k)}  # fmt: skip
    if "q" in cut:
        varlen["seqused_q"] = i32(used_q)
    if "k" in cut:
        varlen["seqused_k"] = i32(used_k)
    if "leftpad" in cut:
        varlen["leftpad_k"] = i32(pads)
    starts_q, starts_k = varlen["cu_seqlens_q"].tolist(), varlen["cu_seqlens_k"].tolist()
    uses = [(slice(starts_q[b], starts_q[b] + used_q[b]), slice(starts_k[b] + pads[b], starts_k[b] + used_k[b]))
            for b in range(len(lengths_q))]  # fmt: skip
    return q, k, v, varlen, uses


def _check_cut(device, feature, dtype, head_dim, heads, cut, deterministic=None):
    """deterministic None: either backward, by the case's seed."""
    seed = case_seed("cut varlen", device, feature, dtype, head_dim, heads, cut)
    q, k, v, varlen, uses = _cut_batch(device, dtype, head_dim, heads, cut, seed)
    causal, scale, options = feature_options(feature, len(uses), heads[0], device, seed)
    scale = head_dim**-0.5 if scale is None else scale
    out, lse = run_forward(q, k, v, scale, causal, **options, **varlen)
    for b, (rows, keys) in enumerate(uses):
        assert_matches_reference(
            out[rows][None], lse[:, rows][None], q[rows][None], k[keys][None], v[keys][None], scale, causal,
            batch_start=b, **sequence_options(options, b),
        )  # fmt: skip
    assert_unused_rows(out, lse, [rows for rows, _ in uses])
    dout = torch.randn(q.shape, generator=torch.Generator(device).manual_seed(seed + 1), device=device).to(dtype)
    deterministic = seed % 2 == 0 if deterministic is None else deterministic
    dq, dk, dv = run_backward(q, k, v, dout, scale, causal, deterministic, **options, **varlen)
    used_k = torch.zeros(k.shape[0], dtype=torch.bool, device=device)
    for b, (rows, keys) in enumerate(uses):
        used_k[keys] = True
        if rows.start == rows.stop or keys.start == keys.stop:
            for grad in (dq[rows], dk[keys], dv[keys]):
                assert torch.equal(grad, torch.zeros_like(grad))
            continue
        assert_grads_match_reference(
            (dq[rows][None], dk[keys][None], dv[keys][None]), q[rows][None], k[keys][None], v[keys][None],
            dout[rows][None], scale, causal, stored_out=out[rows][None], batch_start=b,
            **sequence_options(options, b),
        )  # fmt: skip
    unused_q = torch.ones(q.shape[0], dtype=torch.bool, device=device)
    for rows, _ in uses:
        unused_q[rows] = False
    for grad, unused in ((dq, unused_q), (dk, ~used_k), (dv, ~used_k)):
        assert torch.equal(grad[unused], torch.zeros_like(grad[unused]))
    if device == "cuda":
        flashattn.check_faults()


@pytest.mark.parametrize("feature, dtype, head_dim, heads, cut", _cut_cases("cpu"))
def test_cut_sequences_cpu(feature, dtype, head_dim, heads, cut):
    _check_cut("cpu", feature, dtype, head_dim, heads, cut)


@pytest.mark.gpu
@pytest.mark.parametrize("feature, dtype, head_dim, heads, cut", _cut_cases("cuda"))
def test_cut_sequences_gpu(feature, dtype, head_dim, heads, cut):
    _check_cut("cuda", feature, dtype, head_dim, heads, cut)


def _cut_mask_cases() -> list:
    """Plain and causal x dtype x head dims of both sm90 backward kernels x every cut; (H, Hk) cycles."""
    cases = []
    grid = itertools.product(MASKS, GPU_DTYPES, [40, 64, 100, 128], ["q", "k", "qk", "qk-leftpad"])
    for i, (feature, dtype, head_dim, cut) in enumerate(grid):
        heads = HEADS[i % 3]
        case_id = f"{feature}-{str(dtype)[6:]}-d{head_dim}-h{heads[0]}kv{heads[1]}-{cut}"
        cases.append(pytest.param(feature, dtype, head_dim, heads, cut, id=case_id))
    return cases


@pytest.mark.gpu
@pytest.mark.parametrize("feature, dtype, head_dim, heads, cut", _cut_mask_cases())
def test_cut_sequences_masks_gpu(feature, dtype, head_dim, heads, cut):
    """seqused_q, seqused_k and leftpad_k without a score feature, by atomics: on the H100 the sm90
    backward (each sequence's lengths after the cuts, the causal diagonal of the cut sequence)."""
    _check_cut("cuda", feature, dtype, head_dim, heads, cut, deterministic=False)


def _assert_same_grads(grads, want_grads, deterministic: bool) -> None:
    """Bitwise, but for dq by atomics (its key tiles' shares added in any order): equal up to that
    rounding, and never NaN."""
    for name, grad, want_grad in zip(("dq", "dk", "dv"), grads, want_grads):
        if name == "dq" and not deterministic:
            torch.testing.assert_close(grad, want_grad, rtol=2 * torch.finfo(grad.dtype).eps, atol=1e-5)
        else:
            assert torch.equal(grad, want_grad), name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "atomic"])
@pytest.mark.parametrize("head_dim", [64, 128, 192, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("cut", ["none", "k", "qk-leftpad"])
def test_keys_no_sequence_uses_never_reach_a_result(device, head_dim, causal, cut, deterministic):
    """NaN and Inf in the key rows that no sequence uses (before leftpad_k, after seqused_k, past
    cu_seqlens_k[-1]) change nothing: a kernel that copies whole tiles of packed rows reads them,
    and only zero weights keep them out of P V, where 0 * Inf is NaN (in the backward also out of
    dP^T = V dO^T and dQ = dS K: on the H100 the atomic backward is sm90's at every head dim here, 192
    and 256 on its split kernels)."""
    if device == "cpu" and not deterministic:
        pytest.skip("the CPU backward is one algorithm whatever deterministic says")
    seed = case_seed("unused keys poisoned", device, head_dim, causal, cut)
    q, k, v, varlen, uses = _cut_batch(device, torch.bfloat16, head_dim, (4, 2), cut, seed)
    k, v = (torch.cat([t, torch.randn_like(t[:9])]) for t in (k, v))  # rows past cu_seqlens_k[-1]
    unused = torch.ones(k.shape[0], dtype=torch.bool, device=device)
    for _, keys in uses:
        unused[keys] = False
    clean_k, clean_v = k.masked_fill(unused[:, None, None], 0), v.masked_fill(unused[:, None, None], 0)
    bad_k, bad_v = k.masked_fill(unused[:, None, None], torch.nan), v.masked_fill(unused[:, None, None], torch.inf)
    bad_v[unused.nonzero()[::2, 0]] = torch.nan
    want, want_lse = run_forward(q, clean_k, clean_v, 0.125, causal, **varlen)
    out, lse = run_forward(q, bad_k, bad_v, 0.125, causal, **varlen)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    dout = torch.randn_like(q)
    want_grads = run_backward(q, clean_k, clean_v, dout, 0.125, causal, deterministic, **varlen)
    grads = run_backward(q, bad_k, bad_v, dout, 0.125, causal, deterministic, **varlen)
    _assert_same_grads(grads, want_grads, deterministic)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "atomic"])
@pytest.mark.parametrize("head_dim", [64, 100, 128, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("cut", ["q", "qk-leftpad"])
def test_queries_no_sequence_uses_never_reach_a_result(device, head_dim, causal, cut, deterministic):
    """NaN and Inf in the rows of q and dout that no sequence uses (after seqused_q, past
    cu_seqlens_q[-1]) change no gradient: a backward that copies whole tiles of packed rows reads
    them, and a zero P^T or dS^T does not cancel them in dV += P^T dO or dK += dS^T Q (0 * NaN is
    NaN); dq of those rows is exactly 0."""
    if device == "cpu" and not deterministic:
        pytest.skip("the CPU backward is one algorithm whatever deterministic says")
    seed = case_seed("unused queries poisoned", device, head_dim, causal, cut)
    q, k, v, varlen, uses = _cut_batch(device, torch.bfloat16, head_dim, (4, 2), cut, seed)
    unused = torch.ones(q.shape[0], dtype=torch.bool, device=device)
    for rows, _ in uses:
        unused[rows] = False
    assert unused.sum() > 3  # rows past seqused_q and the 3 past cu_seqlens_q[-1]
    dout = torch.randn_like(q)
    clean_q, clean_dout = (t.masked_fill(unused[:, None, None], 0) for t in (q, dout))
    bad_q, bad_dout = (t.masked_fill(unused[:, None, None], fill) for t, fill in ((q, torch.nan), (dout, torch.inf)))
    bad_q[unused.nonzero()[::2, 0]] = torch.inf
    bad_dout[unused.nonzero()[::2, 0]] = torch.nan
    want, want_lse = run_forward(clean_q, k, v, 0.125, causal, **varlen)
    out, lse = run_forward(bad_q, k, v, 0.125, causal, **varlen)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    want_grads = run_backward(clean_q, k, v, clean_dout, 0.125, causal, deterministic, **varlen)
    grads = run_backward(bad_q, k, v, bad_dout, 0.125, causal, deterministic, **varlen)
    _assert_same_grads(grads, want_grads, deterministic)
    assert torch.equal(grads[0][unused], torch.zeros_like(grads[0][unused]))


@pytest.mark.parametrize("device", DEVICES)
def test_private_varlen_forward_takes_every_sequence_option(device):
    """flash-attn 2.8's _flash_attn_varlen_forward with block_table, seqused_k or leftpad_k: what the
    operator gives (flash-attn's semantics: leftpad_k starts each sequence's keys, seqused_k ends them)."""
    seed = case_seed("private sequence options", device)
    q, k, v, varlen, uses = _cut_batch(device, torch.bfloat16, 64, (4, 2), "qk-leftpad", seed)
    varlen.pop("seqused_q")
    cu_q, cu_k, max_q, max_k = (varlen[n] for n in ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"))
    out, lse, _, _ = _flash_attn_varlen_forward(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, 0.125, True,
                                                seqused_k=varlen["seqused_k"], leftpad_k=varlen["leftpad_k"])
    want, want_lse = _flash_attn_forward(q, k, v, 0.125, True, **varlen)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    lengths_q, lengths_k = LENGTHS["mixed"]
    q, k_pages, v_pages, paged, _ = paged_batch(lengths_q, lengths_k, (4, 2), 64, torch.bfloat16, device, seed, 16)
    out, lse, _, _ = _flash_attn_varlen_forward(q, k_pages, v_pages, paged["cu_seqlens_q"], paged["cu_seqlens_k"],
                                                paged["max_seqlen_q"], paged["max_seqlen_k"], 0.0, 0.125, False,
                                                block_table=paged["block_table"])  # fmt: skip
    want, want_lse = _flash_attn_forward(q, k_pages, v_pages, 0.125, False, **paged)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)


# ------------------------------------------------------------------------------------------------ errors

def _small_paged(device: str) -> dict:
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(10, 4, 16, generator=gen, device=device, dtype=torch.float16)
    k, v = (torch.randn(6, 4, 2, 16, generator=gen, device=device, dtype=torch.float16) for _ in range(2))
    i32 = lambda *values: torch.tensor(values, dtype=torch.int32, device=device)  # noqa: E731
    return dict(q=q, k=k, v=v, cu_seqlens_q=i32(0, 4, 10), cu_seqlens_k=i32(0, 8, 12), max_seqlen_q=6,
                max_seqlen_k=8, block_table=i32(0, 1, 2, 3, 4, 5).reshape(2, 3))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "change, error, match",
    [
        (lambda a: {**a, "block_table": a["block_table"].long()}, TypeError, r"block_table must be int32"),
        (lambda a: {**a, "block_table": a["block_table"][:1]}, ValueError,
         r"block_table must have shape \(2, max_blocks_per_seq\), got \(1, 3\)"),
        (lambda a: {**a, "k": a["k"].flatten(0, 1)}, ValueError,
         r"k must be 4-D \(num_blocks, page_block_size, nheads_k, headdim\), got shape \(24, 2, 16\)"),
        (lambda a: {**a, "seqused_q": torch.ones(3, dtype=torch.int32, device=a["q"].device)}, ValueError,
         r"seqused_q must have shape \(2,\), got \(3,\)"),
        (lambda a: {**a, "seqused_k": torch.ones(2, device=a["q"].device)}, TypeError, r"seqused_k must be int32"),
        (lambda a: {**a, "seqused_k": [4, 4]}, TypeError, r"seqused_k must be None or an int32 tensor, got list"),
        (lambda a: {**a, "k": a["k"][:0], "v": a["v"][:0]}, ValueError,
         r"k holds no page but block_table lists 3 per sequence"),
    ],
    ids=["table-dtype", "table-rows", "k-rank", "seqused_q-shape", "seqused_k-dtype", "seqused_k-list", "no-pages"],
)
def test_paged_argument_errors(device, change, error, match):
    with pytest.raises(error, match=match):
        flash_attn_varlen_func(**change(_small_paged(device)))


@pytest.mark.parametrize("device", DEVICES)
def test_sequence_options_need_varlen(device):
    q = torch.randn(2, 5, 4, 16, device=device, dtype=torch.float16)
    used = torch.ones(2, dtype=torch.int32, device=device)
    for name in ("seqused_q", "seqused_k", "leftpad_k", "block_table"):
        value = used[:, None] if name == "block_table" else used
        with pytest.raises(ValueError, match=f"{name} needs a variable-length batch"):
            _flash_attn_forward(q, q, q, 0.25, False, **{name: value})
    args = _small_paged(device)
    with pytest.raises(ValueError, match="leftpad_k cannot be combined with block_table"):
        _flash_attn_forward(args["q"], args["k"], args["v"], 0.25, False, leftpad_k=used,
                            **{n: args[n] for n in ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k",
                                                    "block_table")})  # fmt: skip


def _call(a: dict) -> torch.Tensor:
    """The operator's forward on _small_paged's arguments (flash_attn_varlen_func takes no leftpad_k)."""
    a = dict(a)
    q, k, v = a.pop("q"), a.pop("k"), a.pop("v")
    return _flash_attn_forward(q, k, v, 0.25, False, **a)[0]


# name -> (how the bad call differs, the CUDA error's words, the CPU error's): values only the device
# reads (sequence 0 has 4 queries and 8 keys in 2 pages, sequence 1 6 and 4 in 1; 3 pages of 4 rows each).
BAD_VALUES = {
    "block_table": ("a['block_table'] = a['block_table'].clone(); a['block_table'][0, 1] = 99",
                    "block_table[0][1] = 99, outside [0, 5]", "block_table[0][1] = 99 is outside [0, 5]"),
    "length": ("a['cu_seqlens_k'] = i32(0, 8, 22); a['max_seqlen_k'] = 14",
               "the length (cu_seqlens_k[b + 1] - cu_seqlens_k[b]) of sequence[1] = 14, outside [0, 12]",
               "the length (cu_seqlens_k[b + 1] - cu_seqlens_k[b]) of sequence 1 is 14, past the 12 rows"),
    "seqused_k": ("a['seqused_k'] = i32(3, 13)", "seqused_k[1] = 13, outside [0, 12]",
                  "seqused_k[1] = 13 is outside [0, 12]"),
    "seqused_q": ("a['seqused_q'] = i32(5, 2)", "seqused_q[0] = 5, outside [0, 4]",
                  "seqused_q[0] = 5 is outside [0, 4]"),
    "leftpad_k": ("a.pop('block_table'); a['k'] = a['k'].flatten(0, 1); a['v'] = a['v'].flatten(0, 1); "
                  "a['leftpad_k'] = i32(0, 5)", "leftpad_k[1] = 5, outside [0, 4]", "leftpad_k[1] = 5 is outside [0, 4]"),
}


@pytest.mark.parametrize("name", list(BAD_VALUES))
def test_bad_values_raise_at_the_call_on_cpu(name):
    change, _, words = BAD_VALUES[name]
    a = _small_paged("cpu")
    i32 = lambda *values: torch.tensor(values, dtype=torch.int32)  # noqa: E731, F841 (used by `change`)
    exec(change)
    with pytest.raises(ValueError, match=re.escape(words)):
        _call(a)
    _call(_small_paged("cpu"))  # the arguments as they were still run


SURVIVE = textwrap.dedent("""
    import sys
    import torch
    import flashattn
    sys.path.insert(0, {tests!r})
    from test_paged_varlen import _call, _small_paged

    def i32(*values):
        return torch.tensor(values, dtype=torch.int32, device="cuda")

    before = _call(_small_paged("cuda"))
    a = _small_paged("cuda")
    {change}
    _call(a)
    torch.cuda.synchronize()
    print("bad call returned", flush=True)
    try:
        _call(_small_paged("cuda"))
        print("no error", flush=True)
    except RuntimeError as error:
        print(f"caught: {{error}}", flush=True)
    after = _call(_small_paged("cuda"))
    torch.cuda.synchronize()
    print("same result after" if torch.equal(before, after) else "DIFFERENT RESULT AFTER", flush=True)
    flashattn.check_faults()
    print("clean", flush=True)
""")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(BAD_VALUES))
def test_bad_values_never_kill_the_context(name):
    """The bad call returns (its value clamped), the next call raises naming the argument, and a
    correct call afterwards gives what it gave before; in a fresh interpreter, so that a trap could
    not take the suite's context with it."""
    change, words, _ = BAD_VALUES[name]
    script = SURVIVE.format(tests=str(Path(__file__).parent), change=change)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stdout + result.stderr
    assert lines[0] == "bad call returned", lines
    assert lines[1].startswith("caught: ") and words in lines[1], lines
    assert lines[2:] == ["same result after", "clean"], lines


# ------------------------------------------------------------------ sm90: how paged keys are copied

# FLASHATTN_SM90_PAGED_COPY (csrc/sm90/dispatch.cu, read at every call): tma copies a key tile in TMA
# boxes of gcd(page size, tile height) rows; gather has the producer warpgroup copy its rows with
# cp.async, each row's page looked up once per tile (4 lanes a row; gather8: 8, for A/B); auto
# gathers where a tile would take more than one box per column block. Pages of 12 have no boxes (gathered, or sm80 under tma).
COPY_PAGE_SIZES = [8, 16, 32, 48, 256, 12]
COPY_HEAD_DIMS = [64, 96, 128, 256]
COPY_CASES = {  # name -> (query lengths, key lengths, (H, Hk), options)
    "causal-gqa": ([100, 1, 37, 64], [300, 17, 37, 1000], (4, 2), {"causal": True}),
    "window-mqa": ([64, 200, 3], [64, 700, 250], (4, 1), {"window_size": (30, 5)}),
    "full-mha": ([129, 16, 0], [129, 401, 5], (2, 2), {}),
}


def poison_unused_rows(k_pages: torch.Tensor, v_pages: torch.Tensor, table: torch.Tensor,
                       lengths_k: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """k and v pools with NaN in every k row and NaN or Inf in every v row no sequence uses (spare
    pages, the tail of a sequence's last page): a copy that reads them, or leaves them in a stage the
    consumers take as keys, shows in out."""
    page_size = k_pages.shape[1]
    used = torch.zeros(k_pages.shape[:2], dtype=torch.bool, device=k_pages.device)
    for b, n in enumerate(lengths_k):
        for j in range(-(-n // page_size)):
            used[table[b, j], : min(page_size, n - j * page_size)] = True
    k = k_pages.masked_fill(~used[..., None, None], torch.nan)
    v = v_pages.masked_fill(~used[..., None, None], torch.inf)
    unused = (~used).nonzero()[::2]
    v[unused[:, 0], unused[:, 1]] = torch.nan
    return k, v


@pytest.mark.gpu
@pytest.mark.parametrize("mode", COPY_MODES)
@pytest.mark.parametrize("page_size", COPY_PAGE_SIZES)
@pytest.mark.parametrize("head_dim", COPY_HEAD_DIMS)
def test_paged_copy_modes_give_the_packed_bits(mode, page_size, head_dim, monkeypatch):
    """Under each FLASHATTN_SM90_PAGED_COPY, paged keys (shuffled pages, NaN and Inf in every pool
    row no sequence uses) give the bits of the same keys packed, where the sm90 forward serves both
    (one kernel, the same tiles in shared memory); under tma, pages TMA cannot take run on sm80 and
    are held to the reference. GQA/MQA, causal/window, sequences shorter than a tile, tails."""
    monkeypatch.setenv("FLASHATTN_SM90_PAGED_COPY", mode)
    i = COPY_PAGE_SIZES.index(page_size) + COPY_HEAD_DIMS.index(head_dim)
    name = list(COPY_CASES)[i % len(COPY_CASES)]
    lengths_q, lengths_k, heads, options = COPY_CASES[name]
    dtype = GPU_DTYPES[i % 2]
    seed = case_seed("paged copy modes", mode, page_size, head_dim)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(sum(lengths_q), heads[0], head_dim, generator=gen, device="cuda").to(dtype)
    k, v = (torch.randn(sum(lengths_k), heads[1], head_dim, generator=gen, device="cuda").to(dtype)
            for _ in range(2))  # fmt: skip
    cu_q, cu_k = offsets(lengths_q, "cuda"), offsets(lengths_k, "cuda")
    starts = cu_k.tolist()
    keys = [k[starts[b] : starts[b + 1]] for b in range(len(lengths_k))]
    k_pages, table = pages_of(keys, page_size, "cuda", gen)
    v_pages = torch.empty_like(k_pages)
    for b, n in enumerate(lengths_k):
        for j in range(-(-n // page_size)):
            rows = v[starts[b] + j * page_size : min(starts[b] + (j + 1) * page_size, starts[b + 1])]
            v_pages[table[b, j], : len(rows)] = rows
    k_pages, v_pages = poison_unused_rows(k_pages, v_pages, table, lengths_k)
    causal = options.get("causal", False)
    window = {"window_size": options["window_size"]} if "window_size" in options else {}
    varlen = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lengths_q), max_seqlen_k=max(lengths_k))
    scale = head_dim**-0.5
    out, lse = run_forward(q, k_pages, v_pages, scale, causal, **window, **varlen, block_table=table)
    flashattn.check_faults()  # no entry past a sequence's pages was read
    if sm90_runs_paged(page_size):
        want, want_lse = run_forward(q, k, v, scale, causal, **window, **varlen)
        assert torch.equal(out, want) and torch.equal(lse, want_lse)
        return
    starts_q = cu_q.tolist()
    for b in range(len(lengths_q)):
        rows = slice(starts_q[b], starts_q[b + 1])
        assert_matches_reference(out[rows][None], lse[:, rows][None], q[rows][None], keys[b][None],
                                 v[starts[b] : starts[b + 1]][None], scale, causal, **window)  # fmt: skip


@pytest.mark.gpu
def test_an_unknown_paged_copy_mode_fails_calls_by_name(monkeypatch):
    """FLASHATTN_SM90_PAGED_COPY is read at every call: a value it does not know fails the next call
    on sm90, paged or not, with a ValueError that names the variable (so that an A/B run cannot
    silently time the default), and the process runs the calls after it once the value is fixed."""
    if flashattn.kernel_family() != "sm90":
        pytest.skip("the switch is the sm90 family's")
    q, k, v, paged, _ = paged_batch([37, 5], [100, 40], (4, 2), 64, torch.bfloat16, "cuda", 0, 16)
    contiguous = {n: paged[n] for n in ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")}
    k_packed, v_packed = (torch.randn(140, 2, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    monkeypatch.setenv("FLASHATTN_SM90_PAGED_COPY", "boxes")
    with pytest.raises(ValueError, match="FLASHATTN_SM90_PAGED_COPY"):
        _flash_attn_forward(q, k, v, 0.125, True, **paged)
    with pytest.raises(ValueError, match="FLASHATTN_SM90_PAGED_COPY"):
        _flash_attn_forward(q, k_packed, v_packed, 0.125, True, **contiguous)
    monkeypatch.setenv("FLASHATTN_SM90_PAGED_COPY", "gather")
    _flash_attn_forward(q, k_packed, v_packed, 0.125, True, **contiguous)
    _flash_attn_forward(q, k, v, 0.125, True, **paged)
    torch.cuda.synchronize()


# A paged call the sm90 forward serves (head dim 64), with one block-table entry out of range, in a
# fresh interpreter under each copy mode: pages of 16 (TMA boxes under tma, gathered otherwise) and
# of 12 (gathered; sm80 under tma).
SM90_SURVIVE = textwrap.dedent("""
    import torch
    import flashattn
    from flashattn.interface import _flash_attn_forward

    def i32(*values):
        return torch.tensor(values, dtype=torch.int32, device="cuda")

    page = {page_size}
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(40, 4, 64, generator=gen, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(12, page, 2, 64, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    table = torch.arange(12, dtype=torch.int32, device="cuda").reshape(2, 6)  # sequence 1 uses all 6
    args = dict(cu_seqlens_q=i32(0, 30, 40), cu_seqlens_k=i32(0, 5 * page, 11 * page - 3),
                max_seqlen_q=30, max_seqlen_k=6 * page - 3)

    def call(t):
        return _flash_attn_forward(q, k, v, 0.125, True, block_table=t, **args)[0]

    before = call(table)
    bad = table.clone()
    bad[1, 2] = 10_000
    call(bad)
    torch.cuda.synchronize()
    print("bad call returned", flush=True)
    try:
        call(table)
        print("no error", flush=True)
    except RuntimeError as error:
        print(f"caught: {{error}}", flush=True)
    after = call(table)
    torch.cuda.synchronize()
    print("same result after" if torch.equal(before, after) else "DIFFERENT RESULT AFTER", flush=True)
    flashattn.check_faults()
    print("clean", flush=True)
""")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", COPY_MODES)
@pytest.mark.parametrize("page_size", [16, 12])
def test_a_bad_block_table_entry_is_recorded_under_each_copy_mode(mode, page_size):
    """The sm90 forward (TMA boxes or gathered rows) clamps an out-of-range block-table entry and
    records it; the next call raises naming it, and the process goes on with the same results."""
    script = SM90_SURVIVE.format(page_size=page_size)
    env = {**os.environ, "FLASHATTN_SM90_PAGED_COPY": mode}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stdout + result.stderr
    assert lines[0] == "bad call returned", lines
    assert lines[1].startswith("caught: ") and "block_table[1][2] = 10000, outside [0, 11]" in lines[1], lines
    assert lines[2:] == ["same result after", "clean"], lines
