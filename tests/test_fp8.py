"""FP8 inputs (float8_e4m3fn q, k, v with q_descale, k_descale, v_descale; FlashAttention-3's API).

Two routes (flashattn/fp8.py): the FP8 kernel (flashattn::fwd_fp8 on the sm90 family) for the calls
it takes, and 16-bit attention on the dequantised values for every other call and device.

- The dequantising path (CPU; on CUDA with the kernel's route switched off: the dequantising_path
  fixture): attention on round(stored x descale) in out_dtype, held to the fp32 reference with the
  16-bit bound (assert_matches_reference) on inputs the test dequantises itself, with its own head
  mapping: a wrong descale, head or sequence shows as an error far past the bound.
- flashattn::fwd_fp8 on CPU (fwd on the dequantised values) and its fake implementation: opcheck.
- The FP8 kernel (marked gpu, skipped where the GPU's family has no FP8 kernel): against the fp32
  reference on the dequantised values with a per-element bound stated from FP8 arithmetic
  (fp8_error_bound, which a CPU test checks against simulated FP8 arithmetic and a wrong descale),
  the error of a 16-bit run on the same values printed beside it (pytest -s shows it); the kernel
  seen in the profiler; the calls it does not take running dequantised; bad arguments, then a good
  call. Inputs are quantised as FP8 recipes do (descale = amax / 448 per sequence and KV head).
Errors name the argument.
"""

import itertools
import math
import os
import re
import subprocess
import sys

import pytest
import torch
from helpers import DEVICES, assert_matches_reference, case_seed, max_abs_diff, poisoned_allocations
from torch import Tensor
from torch.library import opcheck

import flashattn
from flashattn import flash_attn_func, flash_attn_varlen_func, fp8
from flashattn.reference import _diagonal_distance, _visible, attention_probs, attention_ref

FP8 = torch.float8_e4m3fn
OUT_DTYPES = [torch.bfloat16, torch.float16]


@pytest.fixture
def dequantising_path(monkeypatch):
    """The FP8 kernel's route switched off: every call takes the dequantising path (as on CPU and on
    GPUs without the kernel), which the tests using this fixture hold to the 16-bit bound."""
    monkeypatch.setattr(fp8, "runs_kernel", lambda *args, **kwargs: False)


def fp8_inputs(shape_q, shape_k, shape_v, gen, device, outliers=False):
    """q, k, v stored in e4m3 (values of N(0, 2^2), clipped to e4m3's range by the cast) on device.
    outliers: a few keys' entries at e4m3's largest magnitude, 448."""
    q, k, v = (torch.randn(s, generator=gen) * 2 for s in (shape_q, shape_k, shape_v))
    if outliers:
        flat = k.view(-1)
        picks = torch.randint(0, flat.numel(), (max(1, flat.numel() // 500),), generator=gen)
        flat[picks] = 448.0 * torch.sign(torch.randn(picks.shape, generator=gen))
    stored = tuple(t.to(FP8) for t in (q, k, v))
    return tuple(t.to(device) for t in stored)


def descales(batch, heads_k, gen, device):
    """Three fp32 (batch, nheads_k) factors in [1/16, 1/2): values of typical e4m3 scaling."""
    return tuple((torch.rand(batch, heads_k, generator=gen) * 0.4375 + 0.0625).to(device) for _ in range(3))


def dequantised(stored, factor, heads_of, dtype):
    """stored x factor per (batch, head) rounded to dtype, written out independently of flashattn:
    stored (B, S, heads, D), factor (B, heads_k), heads_of[h] the factor's column of head h."""
    return (stored.float() * factor[:, heads_of][:, None, :, None]).to(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("layout", ["padded-d16", "packed-d64", "d40", "strided-d32"])
def test_fp8_times_rounds_the_fp32_product_once(device, out_dtype, layout):
    """fp8.times (the dequantising path's stored x descale; CUDA: dequantize_fp8's kernel, 16 values a
    thread where the layout allows, one where it does not) is bit for bit the fp32 product rounded to
    out_dtype (NaN where it is NaN), for every e4m3 byte (zeros and subnormals included), per (row,
    head) factors and none: factors of typical e4m3 scaling, tiny ones (16-bit subnormal results) and
    huge ones (fp16 overflow to inf); padded (rows, seqlen, heads, dim) and packed (rows, heads, dim),
    head dims a multiple of 16 and not, a view with strides that are not."""
    gen = torch.Generator().manual_seed(case_seed("fp8 times", out_dtype, layout))
    every_byte = torch.arange(256, dtype=torch.uint8).view(FP8)
    head_dim = {"padded-d16": 16, "packed-d64": 64, "d40": 40, "strided-d32": 32}[layout]
    stored = every_byte[torch.randint(0, 256, (3, 40, 4, head_dim), generator=gen)]
    stored[:, :16, :, :16] = every_byte.view(1, 16, 1, 16)  # every byte, in order, under every factor
    if layout == "packed-d64":
        stored = stored[:, 0]  # (rows, heads, dim)
    elif layout == "strided-d32":
        stored = stored.transpose(1, 2).contiguous().transpose(1, 2)[:, :, :, 3:29]  # strides of 1040, 26, ...
    stored = stored.to(device)
    factors = torch.rand(3, 4, generator=gen) * 0.4375 + 0.0625
    factors[1] = torch.tensor([2.0**-30, 1e-3, 300.0, 7e3])
    for factor in (factors.to(device), None):
        got = fp8.times(stored, factor, out_dtype)
        if factor is None:
            want = stored.float().to(out_dtype)
        else:
            want = (stored.float() * (factor[:, :, None] if stored.dim() == 3 else factor[:, None, :, None])).to(out_dtype)
        what = f"factor {'none' if factor is None else 'per head'}"
        assert got.dtype == out_dtype and got.shape == stored.shape
        assert got.is_contiguous() or factor is None  # dequantize_fp8's output; t.to(dtype) keeps t's strides
        assert torch.equal(got.isnan(), want.isnan()), what  # NaN's sign and payload may differ
        numbers = ~want.isnan()
        assert torch.equal(got[numbers].view(torch.int16), want[numbers].view(torch.int16)), what


@pytest.mark.parametrize("device", DEVICES)
def test_dequantize_fp8_bad_arguments_raise_errors_that_name_them(device):
    """dequantize_fp8's checks (the CUDA binding's and the CPU implementation's, one set of
    messages), then a good call in the same process."""
    t = torch.zeros(2, 3, 4, 16, device=device).to(FP8)
    scale = torch.ones(2, 4, device=device)
    op = torch.ops.flashattn.dequantize_fp8
    for call, error, text in [
        (lambda: op(t[0], scale, torch.bfloat16), ValueError, "t must be 4-D"),
        (lambda: op(t.to(torch.bfloat16), scale, torch.bfloat16), TypeError, "t must be float8_e4m3fn"),
        (lambda: op(t, scale[:, :3], torch.bfloat16), ValueError, "scale must have shape (rows, nheads)"),
        (lambda: op(t, scale.double(), torch.bfloat16), TypeError, "scale must be float32"),
        (lambda: op(t, scale, torch.float32), TypeError, "out_dtype must be torch.float16 or torch.bfloat16"),
    ]:
        with pytest.raises(error, match=re.escape(text)):
            call()
    assert torch.equal(op(t, scale * 2, torch.float16), torch.zeros(2, 3, 4, 16, device=device, dtype=torch.float16))


@pytest.mark.parametrize("device", DEVICES)
def test_dequantize_fp8_opcheck(device):
    """dequantize_fp8's fake implementation, dispatch and AOT tracing agree with the device's
    implementation (opcheck; test_schema as fwd_fp8's test says), its input is left as it was and
    its output is fresh."""
    gen = torch.Generator().manual_seed(case_seed("dequantize opcheck"))
    t = (torch.randn(2, 5, 3, 32, generator=gen) * 8).to(FP8).to(device)
    scale = torch.rand(2, 3, generator=gen).to(device)
    results = opcheck(torch.ops.flashattn.dequantize_fp8.default, (t, scale, torch.bfloat16),
                      test_utils=FP8_OPCHECK_UTILS)
    assert results == dict.fromkeys(FP8_OPCHECK_UTILS, "SUCCESS")
    before = t.view(torch.uint8).clone()
    out = torch.ops.flashattn.dequantize_fp8(t, scale, torch.bfloat16)
    assert torch.equal(t.view(torch.uint8), before)
    assert out.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()


@pytest.mark.usefixtures("dequantising_path")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", ["gqa", "mha-d40", "outliers-d128", "no-descale"])
def test_fp8_is_16_bit_attention_on_the_dequantised_values(device, out_dtype, causal, case):
    """The dequantising path: out (and lse) of float8_e4m3fn q, k, v with descales within the
    16-bit bound of the fp32 reference on the values the test dequantises itself (rounded to
    out_dtype); out in out_dtype; no NaN or Inf, outliers in k included (e4m3's largest values)."""
    batch, seqlen_q, seqlen_k, heads, heads_k, head_dim = {
        "gqa": (2, 37, 61, 6, 2, 64), "mha-d40": (1, 50, 33, 3, 3, 40),
        "outliers-d128": (2, 45, 90, 4, 2, 128), "no-descale": (1, 17, 29, 4, 1, 64),
    }[case]  # fmt: skip
    gen = torch.Generator().manual_seed(case_seed("fp8", device, out_dtype, causal, case))
    q, k, v = fp8_inputs((batch, seqlen_q, heads, head_dim), (batch, seqlen_k, heads_k, head_dim),
                         (batch, seqlen_k, heads_k, head_dim), gen, device, outliers=case.startswith("outliers"))
    if case == "no-descale":
        qd = kd = vd = None
        ones = torch.ones(batch, heads_k, device=device)
        factors = (ones, ones, ones)
    else:
        factors = qd, kd, vd = descales(batch, heads_k, gen, device)
    heads_of = torch.arange(heads, device=device) // (heads // heads_k)  # a query head's KV head
    q16 = dequantised(q, factors[0], heads_of, out_dtype)
    k16, v16 = (dequantised(t, f, torch.arange(heads_k, device=device), out_dtype) for t, f in zip((k, v), factors[1:]))
    with poisoned_allocations():
        out, lse, _ = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True, q_descale=qd, k_descale=kd,
                                      v_descale=vd, out_dtype=None if out_dtype == torch.bfloat16 else out_dtype)
    assert out.dtype == out_dtype and lse.dtype == torch.float32
    assert out.isfinite().all() and lse[lse != -torch.inf].isfinite().all()
    assert_matches_reference(out, lse, q16, k16, v16, head_dim**-0.5, causal)


@pytest.mark.usefixtures("dequantising_path")
@pytest.mark.parametrize("device", DEVICES)
def test_fp8_varlen_takes_one_descale_per_sequence(device):
    """The dequantising path on packed sequences (one empty, rows past the last sequence) with
    descales (sequences, nheads_k): each sequence's out matches the reference on its own dequantised
    values; rows no sequence owns are 0."""
    lengths_q, lengths_k, heads, heads_k, head_dim = [5, 0, 40, 17], [9, 3, 40, 60], 4, 2, 64
    total_q, total_k = sum(lengths_q) + 3, sum(lengths_k)
    gen = torch.Generator().manual_seed(case_seed("fp8 varlen", device))
    q, k, v = fp8_inputs((total_q, heads, head_dim), (total_k, heads_k, head_dim), (total_k, heads_k, head_dim),
                         gen, device)
    qd, kd, vd = descales(len(lengths_q), heads_k, gen, device)
    cu_q = torch.tensor([0, *torch.tensor(lengths_q).cumsum(0).tolist()], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, *torch.tensor(lengths_k).cumsum(0).tolist()], dtype=torch.int32, device=device)
    with poisoned_allocations():
        out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=True,
                                             return_attn_probs=True, q_descale=qd, k_descale=kd, v_descale=vd)
    heads_of = torch.arange(heads, device=device) // (heads // heads_k)
    for b in range(len(lengths_q)):
        rows, keys = slice(cu_q[b].item(), cu_q[b + 1].item()), slice(cu_k[b].item(), cu_k[b + 1].item())
        if rows.stop == rows.start:
            continue
        q16 = dequantised(q[rows][None], qd[b : b + 1], heads_of, torch.bfloat16)
        k16 = dequantised(k[keys][None], kd[b : b + 1], torch.arange(heads_k, device=device), torch.bfloat16)
        v16 = dequantised(v[keys][None], vd[b : b + 1], torch.arange(heads_k, device=device), torch.bfloat16)
        assert_matches_reference(out[rows][None], lse[:, rows][None], q16, k16, v16, head_dim**-0.5, True)
    assert torch.equal(out[sum(lengths_q):], torch.zeros_like(out[sum(lengths_q):]))


@pytest.mark.usefixtures("dequantising_path")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("page", [16, 5])
@pytest.mark.parametrize("lengths", ["cu_seqlens_k", "seqused_k"])
def test_fp8_paged_varlen_is_the_16_bit_paged_varlen_on_the_dequantised_values(device, page, lengths):
    """flash_attn_varlen_func over FP8 pages (block_table; pages shuffled, some unused, a sequence
    with no keys): bit for bit the output and LSE of the 16-bit function on copies this test
    dequantises (each page that sequence b uses times b's descales, found by its own walk of the
    block table; unused pages untouched), with the key lengths given by cu_seqlens_k or by
    seqused_k."""
    lengths_q, lengths_k, heads, heads_k, head_dim = [5, 3, 17], [23, 0, 40], 4, 2, 32
    gen = torch.Generator().manual_seed(case_seed("fp8 paged varlen", page, lengths))
    per_seq = -(-max(lengths_k) // page)
    num_pages = len(lengths_k) * per_seq + 2
    table = torch.randperm(num_pages, generator=gen)[: len(lengths_k) * per_seq].view(-1, per_seq).to(torch.int32)
    q, k, v = fp8_inputs((sum(lengths_q), heads, head_dim), (num_pages, page, heads_k, head_dim),
                         (num_pages, page, heads_k, head_dim), gen, "cpu")
    qd, kd, vd = descales(len(lengths_q), heads_k, gen, "cpu")
    cu_q = torch.tensor([0, *itertools.accumulate(lengths_q)], dtype=torch.int32)
    if lengths == "seqused_k":  # the lengths from seqused_k; cu_seqlens_k's ranges longer
        cu_k, index = torch.tensor([0, 41, 50, 97], dtype=torch.int32), {"seqused_k": torch.tensor(lengths_k).int()}
    else:
        cu_k, index = torch.tensor([0, *itertools.accumulate(lengths_k)], dtype=torch.int32), {}
    heads_of = torch.arange(heads) // (heads // heads_k)
    q16 = torch.cat([dequantised(q[cu_q[b] : cu_q[b + 1]][None], qd[b : b + 1], heads_of, torch.bfloat16)[0]
                     for b in range(len(lengths_q))])  # fmt: skip
    copies = []
    for stored, factor in ((k, kd), (v, vd)):
        copy = stored.float()
        for b, length in enumerate(lengths_k):
            for p in {int(table[b, r // page]) for r in range(length)}:
                copy[p] = stored[p].float() * factor[b][:, None]
        copies.append(copy.to(torch.bfloat16))
    move = lambda t: t.to(device)  # noqa: E731
    common = dict(block_table=move(table), causal=True, return_attn_probs=True,
                  **{name: move(t) for name, t in index.items()})  # fmt: skip
    ref_out, ref_lse, _ = flash_attn_varlen_func(move(q16), move(copies[0]), move(copies[1]), move(cu_q), move(cu_k),
                                                 max(lengths_q), 47, **common)
    out, lse, _ = flash_attn_varlen_func(move(q), move(k), move(v), move(cu_q), move(cu_k), max(lengths_q), 47,
                                         q_descale=move(qd), k_descale=move(kd), v_descale=move(vd), **common)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


def _bad_calls(device):
    """(what, call, exception, words the message holds): each bad FP8 argument."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = fp8_inputs((2, 8, 4, 64), (2, 8, 2, 64), (2, 8, 2, 64), gen, device)
    good = torch.ones(2, 2, device=device)
    bf16 = q.float().to(torch.bfloat16)
    other = "cpu" if device == "cuda" else "meta"
    cu = torch.tensor([0, 8, 16], dtype=torch.int32, device=device)
    pages = torch.zeros(4, 8, 2, 64, device=device).to(FP8)
    table = torch.zeros(2, 2, dtype=torch.int32, device=device)
    return [
        ("descale of (batch, nheads)", lambda: flash_attn_func(q, k, v, k_descale=torch.ones(2, 4, device=device)),
         ValueError, "k_descale must have shape (batch, nheads_k) = (2, 2)"),
        ("bf16 descale", lambda: flash_attn_func(q, k, v, q_descale=good.bfloat16()), TypeError,
         "q_descale must be float32"),
        ("descale not a tensor", lambda: flash_attn_func(q, k, v, v_descale=1.0), TypeError,
         "v_descale must be a tensor or None"),
        ("descale elsewhere", lambda: flash_attn_func(q, k, v, v_descale=good.to(other)), RuntimeError,
         "v_descale is on"),
        ("fp8 q, bf16 k", lambda: flash_attn_func(q, k.float().bfloat16(), v), TypeError, "k is torch.bfloat16"),
        ("e5m2", lambda: flash_attn_func(q.float().to(torch.float8_e5m2), k, v), TypeError,
         "q is torch.float8_e5m2"),
        ("fp32 out_dtype", lambda: flash_attn_func(q, k, v, out_dtype=torch.float32), ValueError, "out_dtype must be"),
        ("descale with 16-bit inputs", lambda: flash_attn_func(bf16, bf16[:, :, :2], bf16[:, :, :2], q_descale=good),
         ValueError, "q_descale apply to float8_e4m3fn"),
        ("out_dtype with 16-bit inputs",
         lambda: flash_attn_func(bf16, bf16[:, :, :2], bf16[:, :, :2], out_dtype=torch.float16), ValueError,
         "out_dtype apply to float8_e4m3fn"),
        ("gradients", lambda: flash_attn_func(q.clone().requires_grad_(), k, v), NotImplementedError, "forward-only"),
        ("varlen descale of the wrong batch",
         lambda: flash_attn_varlen_func(q.view(16, 4, 64), k.view(16, 2, 64), v.view(16, 2, 64), cu, cu, 8, 8,
                                        q_descale=torch.ones(3, 2, device=device)),
         ValueError, "q_descale must have shape (batch, nheads_k) = (2, 2)"),
        ("fp8 pages of the wrong rank",
         lambda: flash_attn_varlen_func(q.view(16, 4, 64), pages.flatten(0, 1), pages, cu, cu, 8, 8, block_table=table),
         ValueError, "k must be (num_blocks, page_block_size, nheads_k, headdim)"),
        ("wrong rank", lambda: flash_attn_func(q.view(16, 4, 64), k, v), ValueError, "q must be (batch, seqlen"),
    ]


@pytest.mark.usefixtures("dequantising_path")
@pytest.mark.parametrize("device", DEVICES)
def test_bad_fp8_arguments_raise_errors_that_name_them(device):
    """Each bad FP8 argument raises at the call, naming it, before any kernel runs; then a good
    FP8 call in the same process gives its result (on CUDA: the context is intact)."""
    for what, call, error, words in _bad_calls(device):
        with pytest.raises(error) as caught:
            call()
        assert words in str(caught.value), (what, str(caught.value))
    gen = torch.Generator().manual_seed(1)
    q, k, v = fp8_inputs((1, 9, 2, 64), (1, 9, 2, 64), (1, 9, 2, 64), gen, device)
    out = flash_attn_func(q, k, v)
    assert_matches_reference(out, None, *(t.float().to(torch.bfloat16) for t in (q, k, v)), 64**-0.5, False)

# ---------------------------------------------------------------------------------------------- the operator on CPU


def _op_case(layout, gen):
    """fwd_fp8's arguments on CPU: q, k, v, the descales and the options after them (softmax_scale,
    causal, window_left, window_right[, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k]), and
    the sequences of a packed batch (None for padded)."""
    if layout == "padded":
        q, k, v = fp8_inputs((2, 19, 4, 48), (2, 23, 2, 48), (2, 23, 2, 32), gen, "cpu")
        return (q, k, v, *descales(2, 2, gen, "cpu")[:2], None), (0.2, True, 5, -1), None
    lengths_q, lengths_k = [7, 0, 12], [9, 4, 15]
    q, k, v = fp8_inputs((sum(lengths_q) + 2, 4, 32), (sum(lengths_k), 1, 32), (sum(lengths_k), 1, 32), gen, "cpu")
    cu_q, cu_k = (torch.tensor([0, *itertools.accumulate(n)], dtype=torch.int32) for n in (lengths_q, lengths_k))
    qd, _, vd = descales(3, 1, gen, "cpu")
    return (q, k, v, qd, None, vd), (0.3, False, -1, -1, cu_q, cu_k, 12, 15), 3


@pytest.mark.parametrize("layout", ["padded", "varlen"])
def test_fwd_fp8_cpu_is_fwd_on_the_dequantised_values(layout):
    """flashattn::fwd_fp8 on CPU gives exactly flashattn::fwd on the values flashattn.fp8.dequantize
    makes (what the public functions compute wherever the FP8 kernel does not run), out in out_dtype
    and both outputs contiguous, and exactly what flash_attn_func / flash_attn_varlen_func return."""
    gen = torch.Generator().manual_seed(case_seed("fwd_fp8 cpu", layout))
    tensors, options, sequences = _op_case(layout, gen)
    q, k, v, *scales = tensors
    names = dict(zip(("q_descale", "k_descale", "v_descale"), scales))
    out, lse = torch.ops.flashattn.fwd_fp8(*tensors, *options, out_dtype=torch.float16)
    assert out.dtype == torch.float16 and lse.dtype == torch.float32 and out.is_contiguous() and lse.is_contiguous()
    varlen = options[4:] if sequences else (None, None, 0, 0)
    q16, k16, v16 = fp8.dequantize(q, k, v, names, torch.float16, sequences, *varlen[:2])
    want = torch.ops.flashattn.fwd(q16, k16, v16, options[0], options[1], False, *options[2:4], 0.0, None, 0.0, None,
                                   *varlen)  # fmt: skip
    assert torch.equal(out, want[0]) and torch.equal(lse, want[1])
    window = options[2:4]
    if sequences is None:
        public = flash_attn_func(q, k, v, softmax_scale=options[0], causal=options[1], window_size=window,
                                 return_attn_probs=True, out_dtype=torch.float16, **names)
    else:
        public = flash_attn_varlen_func(q, k, v, *varlen, softmax_scale=options[0], causal=options[1],
                                        window_size=window, return_attn_probs=True, out_dtype=torch.float16, **names)
    assert torch.equal(public[0], out) and torch.equal(public[1], lse)


# test_schema is left out: its SchemaCheckMode compares the inputs before and after the call with
# torch.allclose, which has no float8 kernel on CPU; the test checks the same itself (inputs
# unchanged bit for bit, outputs fresh).
FP8_OPCHECK_UTILS = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


@pytest.mark.parametrize("layout", ["padded", "varlen"])
def test_fwd_fp8_opcheck(layout):
    """fwd_fp8's fake (meta) implementation, dispatch and AOT tracing agree with its CPU
    implementation (opcheck), and the call leaves its inputs as they were and returns fresh tensors."""
    gen = torch.Generator().manual_seed(case_seed("fwd_fp8 opcheck", layout))
    tensors, options, _ = _op_case(layout, gen)
    results = opcheck(torch.ops.flashattn.fwd_fp8.default, (*tensors, *options), {"out_dtype": torch.bfloat16},
                      test_utils=FP8_OPCHECK_UTILS)
    assert results == dict.fromkeys(FP8_OPCHECK_UTILS, "SUCCESS")
    inputs = [t for t in (*tensors, *options) if isinstance(t, torch.Tensor)]
    before = [t.view(torch.uint8).clone() if t.dtype == FP8 else t.clone() for t in inputs]
    outputs = torch.ops.flashattn.fwd_fp8(*tensors, *options)
    after = [t.view(torch.uint8) if t.dtype == FP8 else t for t in inputs]
    assert all(torch.equal(b, a) for b, a in zip(before, after))
    assert not any(o.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() for o in outputs for t in inputs)


def test_fwd_fp8_fake_checks_as_the_cpu_implementation():
    """The fake implementation (meta tensors, torch.compile's tracing) refuses what the CPU one
    refuses, with the same error, and gives the shapes and dtypes the CPU one gives."""
    gen = torch.Generator().manual_seed(case_seed("fwd_fp8 fake"))
    (q, k, v, qd, kd, vd), options, _ = _op_case("padded", gen)
    bad = [
        ((q, k, v, qd, torch.ones(2, 4), vd), ValueError, "k_descale must have shape"),
        ((q, k.float().bfloat16(), v, qd, kd, vd), TypeError, "k is torch.bfloat16"),
        ((q.float().bfloat16(), k, v, None, None, None), TypeError, "q is torch.bfloat16"),
        ((*(t.float().bfloat16() for t in (q, k, v)), None, None, None), TypeError, "fwd_fp8 takes float8_e4m3fn"),
        ((q, k[:, :, :1].expand(2, 23, 3, 48), v[:, :, :1].expand(2, 23, 3, 32), None, None, None), ValueError,
         "multiple of the number of key/value heads"),
        ((q, k, cat_fp8([v, v], dim=-1), None, None, None), ValueError, "v has headdim 64"),
    ]
    for tensors, error, words in bad:
        for device in ("cpu", "meta"):
            moved = tuple(t if t is None else t.to(device) for t in tensors)
            with pytest.raises(error, match=re.escape(words)):
                torch.ops.flashattn.fwd_fp8(*moved, *options)
    tensors = (q, k, v, qd, kd, vd)
    meta = tuple(t if t is None else t.to("meta") for t in tensors)
    for out_dtype in (None, torch.float16):
        fake, real = (torch.ops.flashattn.fwd_fp8(*t, *options, out_dtype=out_dtype) for t in (meta, tensors))
        assert [(f.shape, f.dtype) for f in fake] == [(r.shape, r.dtype) for r in real]


# ---------------------------------------------------------------------------------------------- the FP8 error bound

E4M3_MAX = 448.0  # e4m3's largest magnitude
# e4m3 keeps 3 mantissa bits: a normal value (>= 2^-6) rounds to within 2^-4 of itself, relative;
# subnormals are multiples of 2^-9, so they round to within 2^-10, absolute.
E4M3_RELATIVE_ERROR = 2.0**-4
E4M3_SUBNORMAL_ERROR = 2.0**-10
# The kernel's P before rounding: 2^6 * exp2(s - m) with m the row max the kernel's offset was
# last taken at, which it keeps while the max grows by at most 2 (base 2) past it
# (csrc/common/softmax.cuh: kExpBias, kSlack): a row's largest P is between 2^6 and 2^8, in
# e4m3's range (448). The bound takes the smallest, 2^6: subnormals weigh most against it.
P_OFFSET = 2.0**6
# The tensor cores' FP8 MMA adds its products in fewer bits than fp32 (about 13-14, DeepSeek-V3's
# measurement): error <= 2^-13 of the sum of the products' magnitudes. The bound takes 32x that:
# the seventh session's FP8 kernel (benchmarks/NOTES.md) measured up to 8.4x it with outliers in K,
# and round 29 up to 2^-8.6 (21x) at head dim 256 with products all of one sign and near e4m3's
# largest values (the rising-maxima test's scores: sums past 2^25 in stored units), where cuBLAS's
# FP8 product with fast accumulation is off by as much and at head dim 128 both are within 2^-16.
FP8_MMA_ERROR = 2.0**-8
# The LSE's fp32 steps (exp2 / log2 approximations, the row sum): relative to |lse|, taken as at least 1.
LSE_FP32_ERROR = 1e-5


def fp8_error_bound(q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, causal: bool, window_size=(-1, -1),
                    out_dtype=torch.bfloat16) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The fp32 reference on the dequantised values q, k, v (fp32, padded layout: (B, Sq, H, D),
    (B, Sk, Hk, D), (B, Sk, Hk, Dv)) and per-element bounds on the FP8 kernel's error against it:
    (out_ref, lse_ref, out_bound, lse_bound), the bounds shaped like the references.

    The kernel computes S = Q K^T with e4m3 products on the tensor cores (softmax_scale x q_descale x
    k_descale folded into the exp2 scale), P' = 2^6..2^8 exp(s - m) rounded to e4m3 for P V, the row sum
    l of the fp32 P' before rounding (FlashAttention-3's order: rounding P moves out, not the LSE),
    O = v_descale x (P' V) / l in fp32, rounded to out_dtype. With A = attn(q, k, |v|) (the
    reference attention on |v|), per query row i, head h and column d:

    1. Scores: the FP8 MMA's sums are off by |dS_ij| <= 2^-8 softmax_scale sum_d |q_id k_jd|
       (FP8_MMA_ERROR); d_i = max_j |dS_ij| over the keys row i sees. A probability exp(s_ij) /
       sum_k exp(s_ik) then moves by a factor within e^(+-2 d_i) (its numerator and the
       normaliser each by e^(+-d_i)), the LSE by at most d_i.
    2. P rounded to e4m3: a P' of 2^-6 or more within 2^-4 of itself, a subnormal one within 2^-10,
       which is 2^-16 of P once divided by l >= 2^6 (the row max's own term is 2^6 at least; a running
       max that grows later scales the error down with P'). So sum_j round(P~_ij) v_jd is within
       ((1 + 2^-4) e^(2 d_i) - 1) A_id + 2^-16 sum_{j seen} |v_jd| of sum_j P_ij v_jd.
    3. P V's FP8 MMA: 2^-8 of the sum of its products' magnitudes, a factor (1 + 2^-8) on step 2.
    4. out rounded to out_dtype: within eps(out_dtype) (|ref| + steps 1-3), one unit in the last
       place (rounding to nearest, and the fp32 steps before it that may tip it), plus out_dtype's
       subnormal spacing for results below its normal range.
    The LSE: d_i + 1e-5 max(|lse_ref|, 1) (LSE_FP32_ERROR: the fp32 exp2/log2 and the row sum).

    So |out - out_ref| <= ((1 + 2^-4)(1 + 2^-8) e^(2 d_i) - 1) A + (1 + 2^-8) 2^-16 sum_j |v_jd|,
    plus the rounding: about 2^-4 A + 2 d_i A + Sk 2^-16 max|v| + eps |ref| for small d_i. Rows
    that see no key have out 0 and LSE -inf in both."""
    batch, seqlen_q, heads, _ = q.shape
    seqlen_k, heads_k = k.shape[1:3]
    out_ref, lse_ref = attention_ref(q, k, v, softmax_scale, causal, window_size)
    probs, v_abs, _ = attention_probs(q, k, v.abs(), softmax_scale, causal, window_size)
    abs_attn = torch.einsum("bhqk,bkhd->bqhd", probs, v_abs)  # A, [B, Sq, H, Dv]
    visible = _visible(_diagonal_distance(seqlen_q, seqlen_k, q.device), causal, window_size)  # [Sq, Sk]
    if seqlen_k:
        k_abs = k.abs().repeat_interleave(heads // heads_k, dim=2)
        score_error = FP8_MMA_ERROR * softmax_scale * torch.einsum("bqhd,bkhd->bhqk", q.abs(), k_abs)
        delta = score_error.masked_fill(~visible, 0.0).amax(dim=-1)  # d_i, [B, H, Sq]
    else:
        delta = q.new_zeros(batch, heads, seqlen_q)
    subnormal = E4M3_SUBNORMAL_ERROR / P_OFFSET * torch.einsum("qk,bkhd->bqhd", visible.float(), v_abs)
    growth = torch.exp(2 * delta).transpose(1, 2).unsqueeze(-1)  # e^(2 d_i), [B, Sq, H, 1]
    mma = 1 + FP8_MMA_ERROR
    factor = (1 + E4M3_RELATIVE_ERROR) * mma * growth - 1
    # Where e^(2 d_i) overflows (scores of ~1e4) the bound says nothing: infinite, not inf * 0 = NaN.
    scores_and_p = torch.where(factor.isinf(), math.inf, factor * abs_attn)
    before_rounding = scores_and_p + mma * subnormal
    finfo = torch.finfo(out_dtype)
    out_bound = before_rounding + finfo.eps * (out_ref.abs() + before_rounding) + finfo.eps * finfo.smallest_normal
    lse_bound = delta + LSE_FP32_ERROR * lse_ref.abs().nan_to_num(posinf=1.0).clamp_min(1.0)
    return out_ref, lse_ref, out_bound, lse_bound


def assert_within_fp8_bound(out: Tensor, lse: Tensor, q: Tensor, k: Tensor, v: Tensor, softmax_scale: float,
                            causal: bool, window_size=(-1, -1), what: str = "") -> tuple[float, Tensor, Tensor]:
    """out (out_dtype) and lse of the FP8 kernel on the dequantised values q, k, v (fp32, padded) within
    fp8_error_bound, element by element, with no NaN or Inf (an unwritten, poisoned element fails) and
    -inf LSEs where the reference's are. Returns the largest error / bound of out, out_ref and lse_ref."""
    out_ref, lse_ref, out_bound, lse_bound = fp8_error_bound(q, k, v, softmax_scale, causal, window_size, out.dtype)
    assert out.shape == out_ref.shape and lse.shape == lse_ref.shape and lse.dtype == torch.float32
    assert not out.isnan().any() and not lse.isnan().any(), f"{what}: NaN (an element never written, or 0/0)"
    assert not out.isinf().any(), f"{what}: out has an infinity"
    err = (out.float() - out_ref).abs()
    ratio = err / out_bound  # out_bound > 0: its subnormal-spacing term
    worst = ratio.max().item() if ratio.numel() else 0.0
    if worst > 1:
        at = tuple(i.item() for i in torch.unravel_index(ratio.argmax(), ratio.shape))
        raise AssertionError(f"{what}: out off by {err[at].item():.3g} at {at} (b, i, h, d) > bound "
                             f"{out_bound[at].item():.3g} (ref {out_ref[at].item():.3g}); "
                             f"max error {err.max().item():.3g}")
    assert torch.equal(lse == -math.inf, lse_ref == -math.inf), f"{what}: softmax_lse's -inf in other places"
    finite = lse_ref.isfinite()
    lse_err = (lse - lse_ref).abs().masked_fill(~finite, 0.0)
    assert (lse_err <= lse_bound).all(), (f"{what}: softmax_lse off by {lse_err.max().item():.3g} > bound "
                                          f"{lse_bound.masked_fill(lse_err <= lse_bound, math.inf).min().item():.3g}")
    return worst, out_ref, lse_ref


def test_fp8_bound_holds_for_simulated_fp8_arithmetic_and_rejects_a_wrong_descale():
    """fp8_error_bound on the CPU against attention computed as the kernel computes it (scores off by
    the FP8 MMA's 2^-13 model, P' = 2^6 exp(s - m) rounded to e4m3, the row sum of the unrounded P'):
    within the bound everywhere; the same with one KV head's v_descale swapped for another's (a
    factor of 2 off) exceeds it: the bound is tight enough to see a wrong descale."""
    gen = torch.Generator().manual_seed(case_seed("fp8 bound"))
    batch, seqlen_q, seqlen_k, heads, heads_k, head_dim = 2, 70, 150, 4, 2, 128
    stored, scales = quantised_inputs(batch, seqlen_q, seqlen_k, heads, heads_k, head_dim, head_dim, gen, "cpu")
    scales[2][:, 0], scales[2][:, 1] = 0.02, 0.04  # v_descale: KV head 1's twice KV head 0's
    q, k, v = dequantised_fp32(stored, scales, heads)
    scale = head_dim**-0.5
    for causal in (False, True):
        out, lse = simulated_fp8_attention(q, k, v, scale, causal, gen)
        assert_within_fp8_bound(out, lse, q, k, v, scale, causal, what="simulated")
        wrong = v.clone()
        wrong[:, :, 0], wrong[:, :, 1] = v[:, :, 0] * 2, v[:, :, 1] / 2
        out_wrong, lse_wrong = simulated_fp8_attention(q, k, wrong, scale, causal, gen)
        with pytest.raises(AssertionError, match="out off by"):
            assert_within_fp8_bound(out_wrong, lse_wrong, q, k, v, scale, causal, what="wrong v_descale")


def simulated_fp8_attention(q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, causal: bool,
                            gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """Attention as the FP8 kernel computes it, in PyTorch (for testing the bound): scores plus noise
    within the FP8 MMA's 2^-13 model, P' = 2^6 exp(s - m) rounded to e4m3, out = P' V / l with l the
    sum of the unrounded P', rounded to bf16; padded fp32 inputs."""
    group = q.shape[2] // k.shape[2]
    k, v = (t.repeat_interleave(group, dim=2) for t in (k, v))
    scores = softmax_scale * torch.einsum("bqhd,bkhd->bhqk", q, k)
    sums = softmax_scale * torch.einsum("bqhd,bkhd->bhqk", q.abs(), k.abs())
    scores = scores + sums * 2.0**-13 * (2 * torch.rand(scores.shape, generator=gen) - 1)
    visible = _visible(_diagonal_distance(q.shape[1], k.shape[1], q.device), causal, (-1, -1))
    scores = scores.masked_fill(~visible, -math.inf)
    row_max = scores.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).min)  # rows that see no key
    probs = P_OFFSET * torch.exp(scores - row_max)
    row_sum = probs.sum(dim=-1, keepdim=True)
    out = torch.einsum("bhqk,bkhd->bqhd", probs.to(FP8).float() / row_sum.clamp_min(1.0), v)
    lse = (row_max + torch.log(row_sum / P_OFFSET)).squeeze(-1)
    return out.to(torch.bfloat16), lse


# ---------------------------------------------------------------------------------------------- the FP8 kernel (CUDA)

DESCALE_NAMES = ("q_descale", "k_descale", "v_descale")


def quantise(real: Tensor, heads_k: int) -> tuple[Tensor, Tensor]:
    """real (B, S, heads, D) fp32 stored as FP8 recipes store it: descale = amax / 448 (e4m3's
    largest) per (batch, KV head), a query head's amax its KV head's group's; stored = real /
    descale in e4m3. Returns (stored, descale (B, heads_k))."""
    heads = real.shape[2]
    grouped = real.abs().unflatten(2, (heads_k, heads // heads_k)).transpose(1, 2).flatten(2)  # [B, Hk, S*G*D]
    amax = grouped.amax(dim=-1) if grouped.shape[-1] else grouped.new_zeros(grouped.shape[:2])
    descale = amax.clamp_min(2.0**-20) / E4M3_MAX
    return (real / descale[:, None, kv_heads(heads, heads_k), None]).to(FP8), descale


def kv_heads(heads: int, heads_k: int, device="cpu") -> Tensor:
    """The KV head of each of `heads` heads (itself for KV heads)."""
    return torch.arange(heads, device=device) // (heads // heads_k)


def quantised_inputs(batch, seqlen_q, seqlen_k, heads, heads_k, head_dim, v_head_dim, gen, device,
                     outlier_channels=0):
    """Stored e4m3 q, k, v and [q_descale, k_descale, v_descale], quantised (quantise) from real values:
    standard normal times a factor per (batch, KV head) in [1/2, 2), so that a wrong descale, head or
    sequence shows, and scores of standard deviation 1/4 to 4 at the default scale; with
    outlier_channels, that many channels of k (the same in every head) times 100 (the outlier
    channels of LLM keys: the descale follows them and the other channels get e4m3's small and
    subnormal values)."""
    real = []
    for shape, count in (((batch, seqlen_q, heads, head_dim), heads), ((batch, seqlen_k, heads_k, head_dim), heads_k),
                         ((batch, seqlen_k, heads_k, v_head_dim), heads_k)):
        factor = 2.0 ** (2 * torch.rand(batch, heads_k, generator=gen) - 1)
        real.append(torch.randn(shape, generator=gen) * factor[:, None, kv_heads(count, heads_k), None])
    if outlier_channels:
        real[1][..., torch.randperm(head_dim, generator=gen)[:outlier_channels]] *= 100
    stored, scales = zip(*(quantise(x, heads_k) for x in real))
    return tuple(t.to(device) for t in stored), [s.to(device) for s in scales]


def cat_fp8(tensors: list[Tensor], dim: int = 0) -> Tensor:
    """torch.cat of e4m3 tensors, through their bytes (which every device concatenates)."""
    return torch.cat([t.view(torch.uint8) for t in tensors], dim=dim).view(FP8)


def dequantised_fp32(stored, scales, heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """The values stored q, k, v (padded) stand for, in fp32: stored x descale (None: 1) per (batch, KV head)."""
    heads_k = stored[1].shape[2]
    factors = [torch.ones(stored[0].shape[0], heads_k, device=stored[0].device) if s is None else s for s in scales]
    return tuple(dequantised(t, f, kv_heads(t.shape[2], heads_k, t.device), torch.float32)
                 for t, f in zip(stored, factors))  # fmt: skip


def report_16_bit_error(out: Tensor, lse: Tensor, real, softmax_scale, causal, window_size, checked, what) -> None:
    """Prints the FP8 kernel's errors (checked: assert_within_fp8_bound's result) beside those of a
    16-bit run (flash_attn_func) on the same values rounded to out's dtype, against the same fp32
    reference (for comparison; nothing asserted)."""
    worst, out_ref, lse_ref = checked
    out16, lse16, _ = flash_attn_func(*(t.to(out.dtype) for t in real), softmax_scale=softmax_scale, causal=causal,
                                      window_size=window_size, return_attn_probs=True)
    finite = lse_ref.isfinite()
    print(f"{what}: FP8 out error {max_abs_diff(out, out_ref):.3g} (worst error / bound {worst:.2f}), LSE error "
          f"{max_abs_diff(lse[finite], lse_ref[finite]):.3g}; 16-bit on the same values: out "
          f"{max_abs_diff(out16, out_ref):.3g}, LSE {max_abs_diff(lse16[finite], lse_ref[finite]):.3g}")


def check_fp8_kernel(stored, scales, causal, out_dtype, window_size=(-1, -1), softmax_scale=None, what=""):
    """flash_attn_func on stored FP8 q, k, v with the descales `scales` (None: not given), poisoned
    outputs: out in out_dtype and the LSE within fp8_error_bound of the fp32 reference on the
    dequantised values, S_dmask empty; the error printed beside a 16-bit run's."""
    q, k, v = stored
    names = dict(zip(DESCALE_NAMES, scales))
    with poisoned_allocations():
        out, lse, s_dmask = flash_attn_func(q, k, v, softmax_scale=softmax_scale, causal=causal,
                                            window_size=window_size, return_attn_probs=True, out_dtype=out_dtype,
                                            **names)  # fmt: skip
    assert out.dtype == out_dtype and s_dmask.numel() == 0
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    real = dequantised_fp32(stored, scales, q.shape[2])
    checked = assert_within_fp8_bound(out, lse, *real, scale, causal, window_size, what)
    report_16_bit_error(out, lse, real, scale, causal, window_size, checked, what)


@pytest.fixture
def fp8_kernel_family():
    """Skips where the GPU's kernel family has no FP8 kernel (the calls run dequantised there)."""
    family = flashattn.kernel_family()
    if family != fp8.KERNEL_FAMILY:
        pytest.skip(f"the FP8 kernel is the {fp8.KERNEL_FAMILY} family's; this GPU runs the {family} family")


def needs_fp8_kernel(test):
    """Marks a test gpu and skips it where the GPU's kernel family has no FP8 kernel."""
    return pytest.mark.gpu(pytest.mark.usefixtures("fp8_kernel_family")(test))


# Head dims of the kernel: 64 and 96 run on its d128 kernel, 192 on its d256 one.
KERNEL_HEAD_DIMS = [64, 96, 128, 192, 256]
KERNEL_SEQLENS = [(1, 1), (17, 129), (128, 128), (129, 1000), (1000, 129)]
# (H, Hk, out dtype)
KERNEL_GROUPS = {"mha-bf16": (4, 4, torch.bfloat16), "gqa-fp16": (6, 2, torch.float16),
                 "mqa-bf16": (4, 1, torch.bfloat16)}  # fmt: skip


@needs_fp8_kernel
@pytest.mark.parametrize("group", list(KERNEL_GROUPS))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlens", KERNEL_SEQLENS, ids=lambda s: f"q{s[0]}k{s[1]}")
@pytest.mark.parametrize("head_dim", KERNEL_HEAD_DIMS, ids=lambda d: f"d{d}")
def test_fp8_kernel_is_within_the_fp8_bound(head_dim, seqlens, causal, group):
    """The FP8 kernel's out and LSE within the FP8 bound of the fp32 reference on the dequantised
    values, over head dims, awkward lengths (Sq != Sk both ways: rows that see no key under causal),
    MHA, GQA and MQA, both out dtypes."""
    heads, heads_k, out_dtype = KERNEL_GROUPS[group]
    gen = torch.Generator().manual_seed(case_seed("fp8 kernel", head_dim, seqlens, causal, group))
    stored, scales = quantised_inputs(2, *seqlens, heads, heads_k, head_dim, head_dim, gen, "cuda")
    check_fp8_kernel(stored, scales, causal, out_dtype, what=f"d{head_dim} {seqlens} {group} causal={causal}")


@needs_fp8_kernel
@pytest.mark.parametrize("head_dim, causal", [(128, False), (256, True)], ids=["d128-full", "d256-causal"])
def test_fp8_kernel_long_sequences(head_dim, causal):
    """Sq = Sk = 2049: many key tiles and a partial last one, the online softmax's rescaling."""
    gen = torch.Generator().manual_seed(case_seed("fp8 kernel long", head_dim, causal))
    stored, scales = quantised_inputs(1, 2049, 2049, 4, 2, head_dim, head_dim, gen, "cuda")
    check_fp8_kernel(stored, scales, causal, torch.bfloat16, what=f"d{head_dim} S 2049 causal={causal}")


@needs_fp8_kernel
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("window_size, causal", [((32, 8), False), ((100, -1), True), ((0, 0), False),
                                                 ((-1, 40), False)], ids=["32-8", "100-causal", "0-0", "none-40"])
@pytest.mark.parametrize("head_dim", [64, 192], ids=lambda d: f"d{d}")
def test_fp8_kernel_sliding_window(head_dim, window_size, causal, out_dtype):
    """Sliding windows (window_size as flash_attn_func takes it, causal setting the right side to 0),
    Sq != Sk: the kernel's local variant."""
    gen = torch.Generator().manual_seed(case_seed("fp8 kernel window", head_dim, window_size, causal, out_dtype))
    stored, scales = quantised_inputs(2, 300, 511, 4, 2, head_dim, head_dim, gen, "cuda")
    check_fp8_kernel(stored, scales, causal, out_dtype, window_size=window_size,
                     what=f"d{head_dim} window {window_size} causal={causal}")


@needs_fp8_kernel
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim, v_head_dim", [(192, 128), (128, 64)], ids=["d192-dv128", "d128-dv64"])
def test_fp8_kernel_narrow_v(head_dim, v_head_dim, causal):
    """v's head dim below q's and k's (DeepSeek MLA's 192 / 128): out has v's."""
    gen = torch.Generator().manual_seed(case_seed("fp8 kernel dv", head_dim, v_head_dim, causal))
    stored, scales = quantised_inputs(2, 77, 203, 4, 2, head_dim, v_head_dim, gen, "cuda")
    check_fp8_kernel(stored, scales, causal, torch.bfloat16, what=f"d{head_dim} dv{v_head_dim} causal={causal}")


@needs_fp8_kernel
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim, out_dtype", [(64, torch.bfloat16), (128, torch.float16), (256, torch.bfloat16)],
                         ids=["d64-bf16", "d128-fp16", "d256-bf16"])
def test_fp8_kernel_varlen(head_dim, out_dtype, causal):
    """flash_attn_varlen_func on the kernel: three sequences of odd lengths, one without keys, and
    rows past the last sequence, descales (sequences, nheads_k): each sequence within the bound on
    its own dequantised values; rows that see no key and rows no sequence owns: out 0, LSE -inf."""
    lengths_q, lengths_k, heads, heads_k = [37, 5, 129], [91, 0, 203], 6, 2
    gen = torch.Generator().manual_seed(case_seed("fp8 kernel varlen", head_dim, out_dtype, causal))
    sequences = [quantised_inputs(1, n_q, n_k, heads, heads_k, head_dim, head_dim, gen, "cuda")
                 for n_q, n_k in zip(lengths_q, lengths_k)]  # fmt: skip
    unused = 3  # rows past cu_seqlens_q[-1]
    q = cat_fp8([s[0][0][0] for s in sequences] + [torch.ones(unused, heads, head_dim, device="cuda").to(FP8)])
    k, v = (cat_fp8([s[0][i][0] for s in sequences]) for i in (1, 2))
    scales = [torch.cat([s[1][i] for s in sequences]) for i in range(3)]
    cu_q, cu_k = (torch.tensor([0, *itertools.accumulate(n)], dtype=torch.int32, device="cuda")
                  for n in (lengths_q, lengths_k))  # fmt: skip
    with poisoned_allocations():
        out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=causal,
                                             return_attn_probs=True, out_dtype=out_dtype,
                                             **dict(zip(DESCALE_NAMES, scales)))  # fmt: skip
    assert out.dtype == out_dtype and out.shape == (q.shape[0], heads, head_dim) and lse.shape == (heads, q.shape[0])
    scale = head_dim**-0.5
    for b, (stored, seq_scales) in enumerate(sequences):
        rows = slice(cu_q[b].item(), cu_q[b + 1].item())
        real = dequantised_fp32(stored, seq_scales, heads)
        what = f"d{head_dim} varlen sequence {b} causal={causal}"
        checked = assert_within_fp8_bound(out[rows][None], lse[:, rows][None], *real, scale, causal, what=what)
        if lengths_k[b]:
            report_16_bit_error(out[rows][None], lse[:, rows][None], real, scale, causal, (-1, -1), checked, what)
    assert torch.equal(out[-unused:], torch.zeros_like(out[-unused:]))
    assert (lse[:, -unused:] == -math.inf).all()


@needs_fp8_kernel
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [128, 256], ids=lambda d: f"d{d}")
def test_fp8_kernel_a_nan_in_one_sequences_values_stays_there(head_dim, causal):
    """A packed batch whose second sequence's first value rows are e4m3 NaN bytes: the first
    sequence's last key tile reaches into them (91 keys, tiles of 128 or 192), where its P is 0, and
    0 * NaN would be NaN. Its out stays within the bound of its own values. (The second sequence's
    out is NaN by its own values and is not checked.)"""
    lengths_q, lengths_k, heads, heads_k = [37, 20], [91, 150], 4, 2
    gen = torch.Generator().manual_seed(case_seed("fp8 kernel nan in values", head_dim, causal))
    sequences = [quantised_inputs(1, n_q, n_k, heads, heads_k, head_dim, head_dim, gen, "cuda")
                 for n_q, n_k in zip(lengths_q, lengths_k)]  # fmt: skip
    q, k, v = (cat_fp8([s[0][i][0] for s in sequences]) for i in range(3))
    v.view(torch.uint8)[lengths_k[0] : lengths_k[0] + 3] = 0x7F  # e4m3's NaN
    scales = [torch.cat([s[1][i] for s in sequences]) for i in range(3)]
    cu_q, cu_k = (torch.tensor([0, *itertools.accumulate(n)], dtype=torch.int32, device="cuda")
                  for n in (lengths_q, lengths_k))  # fmt: skip
    with poisoned_allocations():
        out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=causal,
                                             return_attn_probs=True, **dict(zip(DESCALE_NAMES, scales)))
    assert out[lengths_q[0] :].isnan().any(), "the NaN values were not read where they belong"
    stored, seq_scales = sequences[0]
    real = dequantised_fp32(stored, seq_scales, heads)
    assert_within_fp8_bound(out[: lengths_q[0]][None], lse[:, : lengths_q[0]][None], *real, head_dim**-0.5, causal,
                            what=f"d{head_dim} the sequence before the NaN values, causal={causal}")


@needs_fp8_kernel
@pytest.mark.parametrize("layout", ["qkv-packed", "q-head-slice"])
def test_fp8_kernel_strided_views(layout):
    """q, k, v as views of larger tensors, read in place: slices of one packed (B, S, 3, H, D) FP8 qkv,
    or q the first H heads of a (B, S, H + 3, D) tensor."""
    batch, seqlen, heads, head_dim = 2, 211, 4, 128
    gen = torch.Generator().manual_seed(case_seed("fp8 kernel strided", layout))
    (q, k, v), scales = quantised_inputs(batch, seqlen, seqlen, heads, heads, head_dim, head_dim, gen, "cuda")
    if layout == "qkv-packed":
        packed = torch.stack([t.view(torch.uint8) for t in (q, k, v)], dim=2).view(FP8)  # [B, S, 3, H, D]
        views = packed.unbind(dim=2)
    else:
        wide = cat_fp8([q, q[:, :, :3]], dim=2)  # [B, S, H + 3, D]
        views = (wide[:, :, :heads], k, v)
    assert not views[0].is_contiguous()
    check_fp8_kernel(views, scales, True, torch.bfloat16, what=layout)


@needs_fp8_kernel
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=lambda d: f"d{d}")
def test_fp8_kernel_outliers_in_k(head_dim, causal):
    """Keys with outlier channels (4 channels x 100 before quantisation: the descale follows them,
    the other channels get e4m3's small and subnormal values; the scores are large and peaked): within
    the bound, no NaN or Inf."""
    gen = torch.Generator().manual_seed(case_seed("fp8 kernel outliers", head_dim, causal))
    stored, scales = quantised_inputs(2, 150, 300, 4, 2, head_dim, head_dim, gen, "cuda", outlier_channels=4)
    check_fp8_kernel(stored, scales, causal, torch.bfloat16, what=f"d{head_dim} outliers causal={causal}")


# Row maxima that rise at chosen keys, per block of 96 keys (half of the d128 kernel's 192-key tile),
# listed in key order; the kernels walk keys from the last. Each level is 2.5 (base 2) above the last,
# past the softmax's slack of 2 (OnlineSoftmax's kSlack), so every rise must move the rows' offsets,
# and three rises (7.5) stay below 8, e4m3's range of P above its bias: a kernel that missed them
# would take the top keys' p up to 2^13.5 and saturate them at 448. In the walk, 192-key tiles see:
# level 0 (blocks 8, 9), a rise in the first half of a tile (6, 7), in the second half (4, 5), in the
# first half again with the second half below it (2, 3), and none (0, 1).
RISING_LEVELS = [3, 3, 3, 2, 1, 2, 1, 0, 0, 0]


@needs_fp8_kernel
@pytest.mark.parametrize("head_dim", [128, 256], ids=lambda d: f"d{d}")
def test_fp8_kernel_row_max_rising_inside_key_tiles(head_dim):
    """The online softmax when the row max rises past its slack at several key tiles, in either half
    of one (RISING_LEVELS): out and LSE within the FP8 bound. Every query row has the same pattern (q
    near 1 in every channel, each key's channels near its level), so that all 16 rows of a warp take
    the same path. (A kernel whose slack is 8 fails here: round 29, NOTES.md.)"""
    gen = torch.Generator().manual_seed(case_seed("fp8 kernel rising maxima", head_dim))
    block = 96
    seqlen_q, seqlen_k, heads = 130, block * len(RISING_LEVELS), 2
    levels = torch.tensor(RISING_LEVELS, dtype=torch.float32).repeat_interleave(block)  # [Sk]
    q = 1 + 0.05 * torch.randn(1, seqlen_q, heads, head_dim, generator=gen)
    k = 0.25 * levels[None, :, None, None] + 0.01 * torch.randn(1, seqlen_k, heads, head_dim, generator=gen)
    v = torch.randn(1, seqlen_k, heads, head_dim, generator=gen)
    stored, scales = zip(*(quantise(x, heads) for x in (q, k, v)))
    # One level, 0.25 in every channel of k against q ~ 1: 0.25 * head_dim * scale * log2(e) = 2.5.
    softmax_scale = 2.5 / (0.25 * head_dim * math.log2(math.e))
    check_fp8_kernel(tuple(t.cuda() for t in stored), [s.cuda() for s in scales], False, torch.bfloat16,
                     softmax_scale=softmax_scale, what=f"d{head_dim} rising maxima")


@needs_fp8_kernel
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=["bf16", "fp16"])
def test_fp8_kernel_without_descales(out_dtype):
    """No descale given: every factor 1, the stored values are the real ones (fp8_inputs' N(0, 2^2))."""
    gen = torch.Generator().manual_seed(case_seed("fp8 kernel no descale", out_dtype))
    stored = fp8_inputs((2, 100, 4, 128), (2, 180, 2, 128), (2, 180, 2, 128), gen, "cuda")
    check_fp8_kernel(stored, (None, None, None), False, out_dtype, what="no descales")


@needs_fp8_kernel
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=["bf16", "fp16"])
def test_fp8_kernel_large_scores_stay_finite(out_dtype):
    """Scores up to about 1e4 (softmax_scale 50 on fp8_inputs' values: a standard deviation of about
    2000), the magnitudes README guarantees finite for 16-bit inputs: out and the LSE finite (the
    softmax runs on s - m, so no exponent overflows). The bound is loose there (its score term grows
    with the scores), so finiteness is what this case checks."""
    gen = torch.Generator().manual_seed(case_seed("fp8 kernel large scores", out_dtype))
    stored = fp8_inputs((1, 64, 2, 128), (1, 96, 2, 128), (1, 96, 2, 128), gen, "cuda")
    check_fp8_kernel(stored, (None, None, None), True, out_dtype, softmax_scale=50.0, what="large scores")


def kernels_run_by(fn) -> list[str]:
    """The names of the CUDA kernels fn() launches (torch.profiler)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [event.name for event in prof.events() if event.device_type == torch.autograd.DeviceType.CUDA]


@needs_fp8_kernel
@pytest.mark.parametrize("function", ["flash_attn_func", "flash_attn_varlen_func"])
def test_fp8_kernel_runs(function):
    """The public functions' FP8 calls run the FP8 kernel: a forward kernel over e4m3 (its traits
    hold __nv_fp8_e4m3) and no 16-bit forward kernel."""
    gen = torch.Generator().manual_seed(case_seed("fp8 kernel runs", function))
    (q, k, v), scales = quantised_inputs(2, 300, 300, 4, 2, 128, 128, gen, "cuda")
    names = dict(zip(DESCALE_NAMES, scales))
    if function == "flash_attn_func":
        call = lambda: flash_attn_func(q, k, v, causal=True, **names)  # noqa: E731
    else:
        cu = torch.tensor([0, 300, 600], dtype=torch.int32, device="cuda")
        call = lambda: flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu,  # noqa: E731
                                              300, 300, causal=True, **names)
    call()  # warm-up: module loading outside the profile
    torch.cuda.synchronize()
    forward = [name for name in kernels_run_by(call) if "fwd_kernel" in name]
    assert forward and all("fp8" in name for name in forward), forward


REFUSED_BY_THE_KERNEL = ["softcap", "d72", "alibi", "sink", "seqused_k", "strided-last-dim", "broadcast-k"]


@needs_fp8_kernel
@pytest.mark.parametrize("case", REFUSED_BY_THE_KERNEL)
def test_fp8_calls_the_kernel_refuses_run_dequantised(case):
    """What the FP8 kernel does not take (softcap, a head dim that is not a multiple of 16, ALiBi,
    a learnable sink, seqused_k, a last dimension that is not contiguous, a broadcast (stride 0)
    view) still runs, on the
    dequantising path: exactly the 16-bit call on flashattn.fp8.dequantize's values, and no FP8
    kernel in the profile."""
    head_dim = 72 if case == "d72" else 64
    gen = torch.Generator().manual_seed(case_seed("fp8 refused", case))
    (q, k, v), scales = quantised_inputs(2, 90, 130, 4, 2, head_dim, head_dim, gen, "cuda")
    names = dict(zip(DESCALE_NAMES, scales))
    options = {"softcap": {"softcap": 5.0}, "alibi": {"alibi_slopes": torch.rand(4, device="cuda")},
               "sink": {"learnable_sink": torch.randn(4, device="cuda")}}.get(case, {})  # fmt: skip
    if case == "strided-last-dim":
        q = torch.stack([q.view(torch.uint8)] * 2, dim=-1).view(FP8)[..., 0]
        assert q.stride(-1) == 2
    if case == "broadcast-k":
        k = k[:, :1].expand(-1, k.shape[1], -1, -1)
        assert k.stride(1) == 0
    if case == "seqused_k":
        cu_q, cu_k = (torch.tensor([0, n, 2 * n], dtype=torch.int32, device="cuda") for n in (90, 130))
        seqused_k = torch.tensor([100, 130], dtype=torch.int32, device="cuda")
        packed = (q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1))
        call = lambda t, **kw: flash_attn_varlen_func(*t, cu_q, cu_k, 90, 130, causal=True,  # noqa: E731
                                                      seqused_k=seqused_k, **kw)
        sixteen = fp8.dequantize(*packed, names, torch.bfloat16, 2, cu_q, cu_k)
        stored = packed
    else:
        call = lambda t, **kw: flash_attn_func(*t, causal=True, **options, **kw)  # noqa: E731
        sixteen = fp8.dequantize(q, k, v, names, torch.bfloat16)
        stored = (q, k, v)
    out = call(stored, **names)
    assert torch.equal(out, call(sixteen))
    forward = [name for name in kernels_run_by(lambda: call(stored, **names)) if "fwd_kernel" in name]
    assert forward and not any("fp8" in name for name in forward), forward


FAMILY_WITHOUT_FP8_SCRIPT = """
import torch, flashattn
from flashattn import fp8
gen = torch.Generator(device="cuda").manual_seed(0)
q, k, v = ((torch.randn(2, 100, 4, 128, generator=gen, device="cuda") * 2).to(torch.float8_e4m3fn) for _ in range(3))
scales = {name: torch.rand(2, 4, generator=gen, device="cuda") + 0.5
          for name in ("q_descale", "k_descale", "v_descale")}
out = flashattn.flash_attn_func(q, k, v, causal=True, **scales)
want = flashattn.flash_attn_func(*fp8.dequantize(q, k, v, scales, torch.bfloat16), causal=True)
print("family", flashattn.kernel_family(), "dequantised", torch.equal(out, want))
try:
    torch.ops.flashattn.fwd_fp8(q, k, v, *scales.values(), 128**-0.5, True)
    print("fwd_fp8 ran")
except RuntimeError as err:
    print("fwd_fp8 refused:", type(err).__name__, str(err).splitlines()[0])
"""


@pytest.mark.gpu
def test_fp8_on_a_family_without_the_kernel():
    """Under the sm80 family (FLASHATTN_FAMILY=sm80, in a child process: the binding reads it once),
    which has no FP8 kernel, flash_attn_func runs FP8 inputs dequantised (the 16-bit call's result
    exactly) and flashattn::fwd_fp8 raises, saying so."""
    env = {**os.environ, "FLASHATTN_FAMILY": "sm80"}
    result = subprocess.run([sys.executable, "-c", FAMILY_WITHOUT_FP8_SCRIPT], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "family sm80 dequantised True", result.stdout
    assert lines[1].startswith("fwd_fp8 refused: NotImplementedError") and "FP8" in lines[1], result.stdout


def _bad_kernel_calls():
    """(what, call, exception, words its message holds): calls of flashattn::fwd_fp8 on CUDA that the
    binding refuses (the public functions send it none of them) and bad FP8 arguments of the public
    functions on CUDA inputs that the kernel would otherwise take."""
    gen = torch.Generator().manual_seed(case_seed("fp8 bad kernel calls"))
    (q, k, v), (qd, kd, vd) = quantised_inputs(2, 40, 50, 4, 2, 64, 64, gen, "cuda")
    (q72, k72, v72), _ = quantised_inputs(2, 40, 50, 4, 2, 72, 72, gen, "cuda")
    (q288, k288, v288), _ = quantised_inputs(1, 8, 8, 2, 2, 288, 288, gen, "cuda")
    wide_v = cat_fp8([v, v], dim=-1)
    op = torch.ops.flashattn.fwd_fp8
    cu = torch.tensor([0, 40, 80], dtype=torch.int32, device="cuda")
    return [
        ("head dim 72", lambda: op(q72, k72, v72, None, None, None, 0.1, False), ValueError, "multiple of 16"),
        ("head dim 288", lambda: op(q288, k288, v288, None, None, None, 0.1, False), ValueError, "FP8 kernel"),
        ("v wider than q", lambda: op(q, k, wide_v, None, None, None, 0.1, False), ValueError, "v has headdim 128"),
        ("heads", lambda: op(q[:, :, :3], k, v, None, None, None, 0.1, False), ValueError,
         "multiple of the number of key/value heads"),
        ("bf16 q", lambda: op(q.float().bfloat16(), k, v, None, None, None, 0.1, False), TypeError, "q has dtype"),
        ("bf16 k", lambda: op(q, k.float().bfloat16(), v, None, None, None, 0.1, False), TypeError, "k has dtype"),
        ("k_descale (batch, nheads)", lambda: op(q, k, v, qd, torch.ones(2, 4, device="cuda"), vd, 0.1, False),
         ValueError, "k_descale"),
        ("bf16 q_descale", lambda: op(q, k, v, qd.bfloat16(), kd, vd, 0.1, False), TypeError, "q_descale"),
        ("v_descale on the CPU", lambda: op(q, k, v, qd, kd, vd.cpu(), 0.1, False), RuntimeError, "v_descale"),
        ("fp32 out_dtype", lambda: op(q, k, v, qd, kd, vd, 0.1, False, out_dtype=torch.float32), ValueError,
         "out_dtype"),
        ("cu_seqlens_q alone", lambda: op(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), None, None, None, 0.1,
                                          False, cu_seqlens_q=cu), RuntimeError, "cu_seqlens_q and cu_seqlens_k"),
        ("public: descale of (batch, nheads)",
         lambda: flash_attn_func(q, k, v, k_descale=torch.ones(2, 4, device="cuda")), ValueError,
         "k_descale must have shape (batch, nheads_k) = (2, 2)"),
        ("public: fp32 out_dtype", lambda: flash_attn_func(q, k, v, out_dtype=torch.float32), ValueError,
         "out_dtype must be"),
        ("public: gradients", lambda: flash_attn_func(q, k, v, q_descale=qd.clone().requires_grad_()),
         NotImplementedError, "forward-only"),
        ("public: descale elsewhere", lambda: flash_attn_func(q, k, v, v_descale=vd.cpu()), RuntimeError,
         "v_descale is on"),
    ]


@needs_fp8_kernel
def test_bad_fp8_kernel_arguments_then_a_good_call():
    """Each bad call on the kernel's route raises an error of its type that names the argument, before
    any kernel runs; then a good call in the same process is within the FP8 bound (the CUDA context
    is intact)."""
    for what, call, error, words in _bad_kernel_calls():
        with pytest.raises(error) as caught:
            call()
        assert words in str(caught.value), (what, str(caught.value))
    gen = torch.Generator().manual_seed(case_seed("fp8 good call after bad ones"))
    stored, scales = quantised_inputs(2, 65, 97, 4, 2, 128, 128, gen, "cuda")
    check_fp8_kernel(stored, scales, True, torch.bfloat16, what="after the bad calls")


# flash_attn_with_kvcache over FP8 caches (the dequantising path on every device: no FP8 KV-cache kernel).

CACHE_CAPACITY = 48  # rows per sequence of the test caches


def fp8_cache_case(layout, device, gen, batch=3, seqlen_q=2, heads=4, heads_k=2, head_dim=40, seqlen_new=3):
    """FP8 caches of `layout` (contiguous; batch_idx: a cache row per sequence, shuffled; paged16 /
    paged8: pages of 16 / 8 rows, shuffled, two pages unused), new keys and values, descales,
    cache_seqlens and the index arguments on device; and `where(b, row)`, written out independently
    of flashattn: the (cache row or page, row) of sequence b's row."""
    seqlens = torch.tensor([5, 0, 30], dtype=torch.int32)[:batch]
    q8 = fp8_inputs((batch, seqlen_q, heads, head_dim), (1,), (1,), gen, "cpu")[0]
    k_new, v_new = fp8_inputs((1,), (batch, seqlen_new, heads_k, head_dim), (batch, seqlen_new, heads_k, head_dim),
                              gen, "cpu")[1:]
    index = {}
    if layout.startswith("paged"):
        page = int(layout[5:])
        per_seq = CACHE_CAPACITY // page
        num_rows, rows = batch * per_seq + 2, page
        block_table = torch.randperm(num_rows, generator=gen)[: batch * per_seq].view(batch, per_seq).to(torch.int32)
        index["block_table"] = block_table
        where = lambda b, r: (int(block_table[b, r // page]), r % page)  # noqa: E731
    elif layout == "batch_idx":
        num_rows, rows = batch + 1, CACHE_CAPACITY
        batch_idx = torch.randperm(num_rows, generator=gen)[:batch].to(torch.int32)
        index["cache_batch_idx"] = batch_idx
        where = lambda b, r: (int(batch_idx[b]), r)  # noqa: E731
    else:
        num_rows, rows = batch, CACHE_CAPACITY
        where = lambda b, r: (b, r)  # noqa: E731
    k_cache, v_cache = fp8_inputs((1,), (num_rows, rows, heads_k, head_dim), (num_rows, rows, heads_k, head_dim),
                                  gen, "cpu")[1:]
    qd, kd, vd = descales(batch, heads_k, gen, "cpu")
    move = lambda t: t.to(device)  # noqa: E731
    return dict(q=move(q8), k_cache=move(k_cache), v_cache=move(v_cache), k=move(k_new), v=move(v_new),
                q_descale=move(qd), k_descale=move(kd), v_descale=move(vd), cache_seqlens=move(seqlens),
                index={name: move(t) for name, t in index.items()}, where=where)  # fmt: skip


def kvcache_reference(c, **kwargs):
    """The 16-bit flash_attn_with_kvcache on copies of case c dequantised here (each sequence's cache
    rows, found by c["where"], times its descales; rows no sequence uses keep factor 1): its result
    with kwargs, and the copies after it (the 16-bit k cache holds the appended keys)."""
    batch, heads, heads_k = c["q"].shape[0], c["q"].shape[2], c["k_cache"].shape[2]
    copies = []
    for cache, factor in ((c["k_cache"], c["k_descale"]), (c["v_cache"], c["v_descale"])):
        copy, stored, factor = cache.float().cpu(), cache.cpu(), factor.cpu()
        for b in range(batch):
            for r in range(CACHE_CAPACITY):
                page, row = c["where"](b, r)
                copy[page, row] = stored[page, row].float() * factor[b][:, None]
        copies.append(copy.to(torch.bfloat16).to(c["q"].device))
    new = [dequantised(t, d, torch.arange(heads_k), torch.bfloat16)
           for t, d in ((c["k"], c["k_descale"]), (c["v"], c["v_descale"]))]
    q = dequantised(c["q"], c["q_descale"], torch.arange(heads) * heads_k // heads, torch.bfloat16)
    result = flashattn.flash_attn_with_kvcache(q, *copies, *new, cache_seqlens=c["cache_seqlens"], **c["index"],
                                               **kwargs)
    return result, copies


def fp8_kvcache_call(c, fp8_query=True, **kwargs):
    """flash_attn_with_kvcache on case c's FP8 caches: q FP8 with its descale, or dequantised to bf16 (a
    16-bit query over FP8 caches)."""
    heads, heads_k = c["q"].shape[2], c["k_cache"].shape[2]
    q = c["q"] if fp8_query else dequantised(c["q"], c["q_descale"], torch.arange(heads) * heads_k // heads,
                                             torch.bfloat16)
    return flashattn.flash_attn_with_kvcache(
        q, c["k_cache"], c["v_cache"], c["k"], c["v"], cache_seqlens=c["cache_seqlens"],
        q_descale=c["q_descale"] if fp8_query else None, k_descale=c["k_descale"], v_descale=c["v_descale"],
        **c["index"], **kwargs)


def appended_positions(c):
    """{(cache row or page, row): (b, j)} of the rows the call appends k[b, j], v[b, j] to."""
    return {c["where"](b, int(c["cache_seqlens"][b]) + j): (b, j)
            for b in range(c["q"].shape[0]) for j in range(c["k"].shape[1])}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["contiguous", "batch_idx", "paged16", "paged8"])
@pytest.mark.parametrize("query", ["fp8", "bf16"], ids=["fp8-q", "bf16-q"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fp8_kvcache_is_the_16_bit_kvcache_on_the_dequantised_values(device, layout, query, causal):
    """flash_attn_with_kvcache over FP8 caches (q FP8, or a 16-bit q over them): bit for bit the output
    and LSE of the 16-bit function on copies this test dequantises (kvcache_reference: its own page,
    cache-row and head mapping, so a descale applied to the wrong sequence or head fails); the
    appended rows hold k and v as given, byte for byte; no other cache row changes."""
    gen = torch.Generator().manual_seed(case_seed(layout, query, causal))
    c = fp8_cache_case(layout, device, gen)
    before = [t.view(torch.uint8).cpu().clone() for t in (c["k_cache"], c["v_cache"])]
    (ref_out, ref_lse), _ = kvcache_reference(c, causal=causal, return_softmax_lse=True)
    out, lse = fp8_kvcache_call(c, fp8_query=query == "fp8", causal=causal, return_softmax_lse=True)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    appended = appended_positions(c)
    for cache, new, old in zip((c["k_cache"], c["v_cache"]), (c["k"], c["v"]), before):
        stored, new = cache.view(torch.uint8).cpu(), new.view(torch.uint8).cpu()
        for page in range(stored.shape[0]):
            for row in range(stored.shape[1]):
                b_j = appended.get((page, row))
                expected = old[page, row] if b_j is None else new[b_j]
                assert torch.equal(stored[page, row], expected), (page, row, b_j)


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_kvcache_with_rotary_stores_the_rotated_keys_requantised(device):
    """With rotary embedding the appended keys are the 16-bit function's rotated keys (on the
    dequantised copies) divided by k_descale and rounded to e4m3; values as given; the output is
    that call's."""
    gen = torch.Generator().manual_seed(case_seed("rotary-fp8"))
    c = fp8_cache_case("paged16", device, gen)
    angles = torch.rand(64, c["q"].shape[3] // 4, generator=gen) * 6
    rotary = dict(rotary_cos=angles.cos().to(device), rotary_sin=angles.sin().to(device), causal=True)
    ref_out, (ref_k_cache, _) = kvcache_reference(c, **rotary)
    out = fp8_kvcache_call(c, **rotary)
    assert torch.equal(out, ref_out)
    for (page, row), (b, j) in appended_positions(c).items():
        expected = (ref_k_cache[page, row].float() / c["k_descale"][b][:, None]).to(FP8)
        assert torch.equal(c["k_cache"][page, row].view(torch.uint8), expected.view(torch.uint8))
        assert torch.equal(c["v_cache"][page, row].view(torch.uint8), c["v"][b, j].view(torch.uint8))


@pytest.mark.parametrize("device", DEVICES)
def test_bad_fp8_kvcache_arguments_raise_errors_that_name_them(device):
    gen = torch.Generator().manual_seed(case_seed("bad-fp8-kvcache"))
    c = fp8_cache_case("contiguous", device, gen)

    def call(q=c["q"], k_cache=c["k_cache"], k=c["k"], **kwargs):
        kwargs = {"cache_seqlens": c["cache_seqlens"], "k_descale": c["k_descale"], **kwargs}
        return flashattn.flash_attn_with_kvcache(q, k_cache, c["v_cache"], k, c["v"], **kwargs)

    bf16_q = c["q"].to(torch.bfloat16)
    with pytest.raises(TypeError, match=r"\bk is torch.bfloat16"):
        call(k=c["k"].to(torch.bfloat16))
    with pytest.raises(TypeError, match=r"\bk_cache is torch.bfloat16"):
        call(k_cache=c["k_cache"].to(torch.bfloat16))
    with pytest.raises(ValueError, match="q_descale"):
        call(q=bf16_q, q_descale=c["q_descale"])
    with pytest.raises(ValueError, match="out_dtype"):
        call(q=bf16_q, out_dtype=torch.float16)
    with pytest.raises(ValueError, match="out_dtype"):
        call(out_dtype=torch.float32)
    with pytest.raises(ValueError, match="k_descale"):
        call(k_descale=c["k_descale"][:, :1])
    with pytest.raises(ValueError, match="k_descale"):  # a descale with 16-bit q and caches
        flashattn.flash_attn_with_kvcache(bf16_q, c["k_cache"].to(torch.bfloat16), c["v_cache"].to(torch.bfloat16),
                                          cache_seqlens=c["cache_seqlens"], k_descale=c["k_descale"])
    out = call(out_dtype=torch.float16)  # then a good call
    assert out.dtype == torch.float16 and torch.isfinite(out).all()


@pytest.mark.parametrize("device", DEVICES)
def test_a_bad_block_table_entry_of_an_fp8_kvcache_call_is_caught_then_a_good_call(device):
    """A used block_table entry past the cache's pages: on CPU a ValueError naming block_table; on
    CUDA the 16-bit kernels record it and flashattn.check_faults() raises (the context survives). No
    page is written through the bad entry; then a good call in the same process matches the reference."""
    gen = torch.Generator().manual_seed(case_seed("bad-fp8-block-table"))
    c = fp8_cache_case("paged16", device, gen)
    bad = dict(c, index={"block_table": c["index"]["block_table"].clone()})
    bad["index"]["block_table"][0, 0] = c["k_cache"].shape[0] + 5  # sequence 0's first page: its appended rows
    before = c["k_cache"].view(torch.uint8).cpu().clone()
    if device == "cpu":
        with pytest.raises(ValueError, match="block_table"):
            fp8_kvcache_call(bad)
    else:
        fp8_kvcache_call(bad)
        torch.cuda.synchronize()  # check_faults reads the record without synchronising: the kernel has run
        with pytest.raises(RuntimeError, match="block_table"):
            flashattn.check_faults()
    for (page, row), (b, _) in appended_positions(c).items():
        if b == 0:  # its rows lie behind the bad entry: nothing written for them
            assert torch.equal(c["k_cache"].view(torch.uint8)[page, row].cpu(), before[page, row])
    good = fp8_cache_case("paged16", device, torch.Generator().manual_seed(case_seed("bad-fp8-block-table", 2)))
    ref_out, _ = kvcache_reference(good)
    assert torch.equal(fp8_kvcache_call(good), ref_out)
