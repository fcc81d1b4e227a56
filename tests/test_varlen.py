"""Variable-length batches: flash_attn_varlen_func and its packed twins, unpad_input and pad_input.

Each sequence of a packed batch is checked against the reference run on that sequence alone
(forward and backward, within the bounds of tests/helpers.py, with every feature of
tests/test_features.py, dropout drawn with the sequence's index), including sequences of
length 0 and 1 and Sq != Sk both ways; uniform batches give exactly what the padded function
gives on the same tokens.
"""

import itertools
import math

import numpy as np
import pytest
import torch
from helpers import (
    DEVICES,
    assert_grads_match_reference,
    assert_matches_reference,
    case_seed,
    decode_s_dmask,
    max_abs_diff,
    poisoned_allocations,
    reference_options,
    run_backward,
    run_forward,
)
from test_features import FEATURES, HEADS, MASKS, _reference_probs, feature_options
from torch._dynamo.backends.common import aot_autograd

from flashattn import (
    flash_attn_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    pad_input,
    unpad_input,
)
from flashattn.cpu import out_shape
from flashattn.interface import _flash_attn_forward
from flashattn.philox import dropout_keep_mask

# name -> (query lengths, key lengths) of the sequences of a batch.
LENGTHS = {
    "mixed": ([0, 1, 113, 3, 203, 17], [5, 0, 203, 113, 1, 17]),
    "equal": ([130, 1, 64], [130, 1, 64]),
    "single": ([1], [1]),
}
GPU_LENGTHS = {
    **LENGTHS,
    "long": ([1023, 0, 1, 777, 2048, 129], [1024, 7, 1, 300, 2048, 2000]),
}
CPU_DTYPES = [torch.float16, torch.bfloat16, torch.float32]
GPU_DTYPES = [torch.float16, torch.bfloat16]
CPU_HEAD_DIMS = [32, 59, 64]
GPU_HEAD_DIMS = [40, 64, 128, 256]
# Head dims of the masks-only backward sweep: each rounding of the sm90 backward's two (64, 128),
# 65..96 (padded on the d128 kernel, whose last dQ reduce box is then not issued) among them.
MASK_HEAD_DIMS = [40, 64, 80, 100, 128]


def _case_id(feature, dtype, head_dim, lengths, heads) -> str:
    return f"{feature}-{str(dtype).removeprefix('torch.')}-d{head_dim}-{lengths}-h{heads[0]}kv{heads[1]}"


def _cpu_cases() -> list:
    """Every feature x batch of lengths; dtype, head dim and (H, Hk) cycle with the indices."""
    cases = []
    for (f, feature), (s, lengths) in itertools.product(enumerate(FEATURES), enumerate(LENGTHS)):
        case = (feature, CPU_DTYPES[(f + s) % 3], CPU_HEAD_DIMS[(f + 2 * s) % 3], lengths, HEADS[(f + s + 1) % 3])
        cases.append(pytest.param(*case, id=_case_id(*case)))
    return cases


def _gpu_cases() -> list:
    cases = []
    for (f, feature), dtype, (d, head_dim), (s, lengths) in itertools.product(
        enumerate(FEATURES), GPU_DTYPES, enumerate(GPU_HEAD_DIMS), enumerate(GPU_LENGTHS)
    ):
        case = (feature, dtype, head_dim, lengths, HEADS[(f + d + s) % 3])
        cases.append(pytest.param(*case, id=_case_id(*case)))
    return cases


def _mask_cases() -> list:
    """Plain and causal x dtype x MASK_HEAD_DIMS x batch of lengths; (H, Hk) cycles."""
    cases = []
    for (f, feature), dtype, (d, head_dim), (s, lengths) in itertools.product(
        enumerate(MASKS), GPU_DTYPES, enumerate(MASK_HEAD_DIMS), enumerate(GPU_LENGTHS)
    ):
        case = (feature, dtype, head_dim, lengths, HEADS[(f + d + s) % 3])
        cases.append(pytest.param(*case, id=_case_id(*case)))
    return cases


def offsets(lengths: list[int], device: str) -> torch.Tensor:
    """cu_seqlens of the lengths: int32 (B + 1,) from 0."""
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=device)


def packed_batch(lengths_q, lengths_k, heads, head_dim, dtype, device, seed, v_head_dim=None):
    """Standard normal q (total_q, H, D), k (total_k, Hk, D) and v (total_k, Hk, Dv), Dv = v_head_dim (by
    default D), and the varlen arguments."""
    gen = torch.Generator(device=device).manual_seed(seed)
    num_heads, num_heads_k = heads
    q = torch.randn(sum(lengths_q), num_heads, head_dim, generator=gen, dtype=dtype, device=device)
    k, v = (torch.randn(sum(lengths_k), num_heads_k, dim, generator=gen, dtype=dtype, device=device)
            for dim in (head_dim, v_head_dim or head_dim))  # fmt: skip
    varlen = {
        "cu_seqlens_q": offsets(lengths_q, device),
        "cu_seqlens_k": offsets(lengths_k, device),
        "max_seqlen_q": max(lengths_q),
        "max_seqlen_k": max(lengths_k),
    }
    return q, k, v, varlen


def sequences(varlen: dict) -> list[tuple[slice, slice]]:
    """(query rows, keys) of each sequence."""
    starts_q, starts_k = varlen["cu_seqlens_q"].tolist(), varlen["cu_seqlens_k"].tolist()
    return [
        (slice(starts_q[b], starts_q[b + 1]), slice(starts_k[b], starts_k[b + 1])) for b in range(len(starts_q) - 1)
    ]


def sequence_options(options: dict, b: int) -> dict:
    """The options of sequence b run as a batch of one: its row of (batch, nheads) ALiBi slopes."""
    slopes = options.get("alibi_slopes")
    if slopes is not None and slopes.dim() == 2:
        return {**options, "alibi_slopes": slopes[b : b + 1]}
    return options


def _check_forward(device, feature, dtype, head_dim, lengths, heads, v_head_dim=None) -> None:
    """v_head_dim: v's head dim, when not head_dim (tests/test_mla_head_dims.py)."""
    lengths_q, lengths_k = LENGTHS.get(lengths) or GPU_LENGTHS[lengths]
    dims = head_dim if v_head_dim is None else (head_dim, v_head_dim)
    seed = case_seed("varlen forward", device, feature, dtype, dims, lengths, heads)
    q, k, v, varlen = packed_batch(lengths_q, lengths_k, heads, head_dim, dtype, device, seed, v_head_dim)
    causal, scale, options = feature_options(feature, len(lengths_q), heads[0], device, seed)
    scale = head_dim**-0.5 if scale is None else scale
    out, lse = run_forward(q, k, v, scale, causal, **options, **varlen)
    assert out.shape == out_shape(q, v) and lse.shape == (heads[0], q.shape[0])
    for b, (rows, keys) in enumerate(sequences(varlen)):
        assert_matches_reference(
            out[rows][None], lse[:, rows][None], q[rows][None], k[keys][None], v[keys][None], scale, causal,
            batch_start=b, **sequence_options(options, b),
        )  # fmt: skip


def _check_backward(device, feature, dtype, head_dim, lengths, heads, deterministic=False, v_head_dim=None) -> None:
    lengths_q, lengths_k = LENGTHS.get(lengths) or GPU_LENGTHS[lengths]
    dims = head_dim if v_head_dim is None else (head_dim, v_head_dim)
    seed = case_seed("varlen backward", device, feature, dtype, dims, lengths, heads)
    q, k, v, varlen = packed_batch(lengths_q, lengths_k, heads, head_dim, dtype, device, seed, v_head_dim)
    dout = torch.randn(out_shape(q, v), generator=torch.Generator(device).manual_seed(seed + 1), dtype=dtype,
                       device=device)
    causal, scale, options = feature_options(feature, len(lengths_q), heads[0], device, seed)
    scale = head_dim**-0.5 if scale is None else scale
    dq, dk, dv = run_backward(q, k, v, dout, scale, causal, deterministic, **options, **varlen)
    out, _ = _flash_attn_forward(q, k, v, scale, causal, **options, **varlen)
    for b, (rows, keys) in enumerate(sequences(varlen)):
        if rows.start == rows.stop or keys.start == keys.stop:  # nothing flows: zero gradients
            for grad in (dq[rows], dk[keys], dv[keys]):
                assert torch.equal(grad, torch.zeros_like(grad))
            continue
        assert_grads_match_reference(
            (dq[rows][None], dk[keys][None], dv[keys][None]), q[rows][None], k[keys][None], v[keys][None],
            dout[rows][None], scale, causal, stored_out=out[rows][None], batch_start=b,
            **sequence_options(options, b),
        )  # fmt: skip


@pytest.mark.parametrize("feature, dtype, head_dim, lengths, heads", _cpu_cases())
def test_forward_cpu(feature, dtype, head_dim, lengths, heads):
    _check_forward("cpu", feature, dtype, head_dim, lengths, heads)


@pytest.mark.parametrize("feature, dtype, head_dim, lengths, heads", _cpu_cases())
def test_backward_cpu(feature, dtype, head_dim, lengths, heads):
    _check_backward("cpu", feature, dtype, head_dim, lengths, heads)


@pytest.mark.gpu
@pytest.mark.parametrize("feature, dtype, head_dim, lengths, heads", _gpu_cases())
def test_forward_gpu(feature, dtype, head_dim, lengths, heads):
    _check_forward("cuda", feature, dtype, head_dim, lengths, heads)


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("feature, dtype, head_dim, lengths, heads", _gpu_cases())
def test_backward_gpu(feature, dtype, head_dim, lengths, heads, deterministic):
    _check_backward("cuda", feature, dtype, head_dim, lengths, heads, deterministic)


@pytest.mark.gpu
@pytest.mark.parametrize("feature, dtype, head_dim, lengths, heads", _mask_cases())
def test_backward_masks_gpu(feature, dtype, head_dim, lengths, heads):
    """The backward without a score feature, full and causal (each sequence's own bottom-right
    diagonal), by atomics: on the H100 the sm90 kernels at every head dim here (serves_bwd()), with
    packed tiles that reach into the next sequence's rows, sequences of 0 and 1 rows, and key
    tiles past a sequence's end."""
    _check_backward("cuda", feature, dtype, head_dim, lengths, heads)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "atomic"])
@pytest.mark.parametrize("feature", ["plain", "causal", "everything", "dropout", "alibi-batch-heads"])
@pytest.mark.parametrize("seqlens", [(113, 203), (203, 113), (1, 1)], ids=lambda s: f"q{s[0]}k{s[1]}")
def test_uniform_batch_is_the_padded_batch(device, feature, seqlens, deterministic):
    """A batch of equal lengths packed for flash_attn_varlen_func gives the padded function's bits:
    out, lse (in its (nheads, total_q) layout), S_dmask and the gradients; dropout draws the same
    mask (sequence b is batch entry b). By atomics (on the H100, plain and causal: the sm90
    backward, whose packed tiles read the next sequence's rows where the padded ones read zeros)
    dq sums its key tiles' shares in any order: equal up to that rounding, dk and dv bitwise."""
    if device == "cpu" and not deterministic:
        pytest.skip("the CPU backward is one algorithm whatever deterministic says")
    batch, (seqlen_q, seqlen_k), head_dim = 3, seqlens, 59
    seed = case_seed("uniform", device, feature, seqlens)
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(batch, seqlen_q, 4, head_dim, generator=gen, dtype=torch.bfloat16, device=device)
    kv = torch.randn(batch, seqlen_k, 2, 2, head_dim, generator=gen, dtype=torch.bfloat16, device=device)
    dout = torch.randn(q.shape, generator=gen, dtype=torch.bfloat16, device=device)
    if feature in ("plain", "causal"):
        causal, scale, options = feature == "causal", None, {}
    else:
        causal, scale, options = feature_options(feature, batch, 4, device, seed)
    options.pop("rng_state", None)
    kwargs = {"softmax_scale": scale, "causal": causal, "deterministic": deterministic, "return_attn_probs": True,
              **options}  # fmt: skip

    def run(func, q, k, v, *args):
        leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
        torch.manual_seed(seed)
        out, lse, probs = func(*leaves, *args, **kwargs)
        return (out, lse, probs, *torch.autograd.grad(out, leaves, dout.reshape(out.shape)))

    k, v = kv.unbind(dim=2)
    padded = run(flash_attn_func, q, k, v)
    cu_q = torch.arange(0, (batch + 1) * seqlen_q, seqlen_q, dtype=torch.int32, device=device)
    cu_k = torch.arange(0, (batch + 1) * seqlen_k, seqlen_k, dtype=torch.int32, device=device)
    packed = run(flash_attn_varlen_func, *(t.flatten(0, 1) for t in (q, k, v)), cu_q, cu_k, seqlen_q, seqlen_k)
    out, lse, probs, dq, dk, dv = packed
    assert torch.equal(out, padded[0].flatten(0, 1))
    assert torch.equal(lse, padded[1].transpose(0, 1).flatten(1, 2))
    assert torch.equal(probs, padded[2])
    for name, grad, want in zip(("dq", "dk", "dv"), (dq, dk, dv), padded[3:]):
        if name == "dq" and not deterministic:
            eps = torch.finfo(grad.dtype).eps
            torch.testing.assert_close(grad, want.flatten(0, 1), rtol=2 * eps, atol=1e-5)
        else:
            assert torch.equal(grad, want.flatten(0, 1)), name


# Query lengths on both sides of the sm90 forward's 64-row warpgroups and 128-row tiles, packed
# back to back. Where O goes through shared memory (d64, d96, causal d128), a warpgroup whose 64
# rows lie inside its sequence stores them with one bulk copy; one that reaches past the end stores
# from registers, since the rows after it are the next sequence's.
EDGE_LENGTHS_Q = [64, 65, 127, 128, 129, 1, 191, 192, 63, 300]
EDGE_LENGTHS_K = [200, 64, 1, 128, 300, 17, 191, 256, 63, 129]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cut", [False, True], ids=["whole", "seqused_q"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 96, 128], ids=lambda d: f"d{d}")
def test_sequences_that_end_at_warpgroup_edges(device, head_dim, causal, cut):
    """Each sequence within the bound of its reference; the rows no sequence uses (those past
    seqused_q, and 5 past cu_seqlens_q[-1]) keep out 0 and lse -inf: no store reaches them."""
    seed = case_seed("warpgroup edges", device, head_dim, causal, cut)
    q, k, v, varlen = packed_batch(EDGE_LENGTHS_Q, EDGE_LENGTHS_K, (4, 2), head_dim, torch.bfloat16, device, seed)
    past_end = torch.randn(5, *q.shape[1:], generator=torch.Generator(device).manual_seed(seed + 1), device=device)
    q = torch.cat([q, past_end.to(q.dtype)])
    used_q = [n - n // 3 if cut and b % 2 == 0 else n for b, n in enumerate(EDGE_LENGTHS_Q)]  # 64 -> 43, 127 -> 85
    if cut:
        varlen["seqused_q"] = torch.tensor(used_q, dtype=torch.int32, device=device)
    out, lse = run_forward(q, k, v, head_dim**-0.5, causal, **varlen)
    unused = torch.ones(q.shape[0], dtype=torch.bool, device=device)
    for b, (rows, keys) in enumerate(sequences(varlen)):
        rows = slice(rows.start, rows.start + used_q[b])
        unused[rows] = False
        assert_matches_reference(out[rows][None], lse[:, rows][None], q[rows][None], k[keys][None], v[keys][None],
                                 head_dim**-0.5, causal)  # fmt: skip
    assert torch.equal(out[unused], torch.zeros_like(out[unused]))
    assert (lse[:, unused] == -math.inf).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_unpadded_tokens_attend_as_each_sequence_alone(device, causal):
    """The way models use it: unpad_input on a right-padded batch, flash_attn_varlen_func, pad_input.
    Each sequence's valid tokens get what flash_attn_func gives on them alone (bitwise), padding 0;
    lengths 0, 1 and full included."""
    batch, seqlen, heads, head_dim = 5, 150, 4, 64
    seed = case_seed("unpad", device, causal)
    gen = torch.Generator(device=device).manual_seed(seed)
    qkv = torch.randn(batch, seqlen, 3, heads, head_dim, generator=gen, dtype=torch.float16, device=device)
    lengths = [150, 0, 1, 77, 149]
    mask = torch.arange(seqlen, device=device) < torch.tensor(lengths, device=device)[:, None]
    packed, indices, cu_seqlens, max_seqlen, seqused = unpad_input(qkv, mask)
    assert max_seqlen == 150 and torch.equal(seqused.cpu(), torch.tensor(lengths, dtype=torch.int32))
    out = flash_attn_varlen_qkvpacked_func(packed, cu_seqlens, max_seqlen, causal=causal)
    out = pad_input(out, indices, batch, seqlen)
    assert out.shape == (batch, seqlen, heads, head_dim)
    for b, length in enumerate(lengths):
        alone = flash_attn_func(*qkv[b : b + 1, :length].unbind(dim=2), causal=causal)
        assert torch.equal(out[b : b + 1, :length], alone)
        assert torch.equal(out[b, length:], torch.zeros_like(out[b, length:]))


@pytest.mark.parametrize("device", DEVICES)
def test_unpad_input_and_pad_input(device):
    """FlashAttention-2's bert_padding semantics (>= 2.6): the five values of unpad_input, unused_mask,
    pad_input as its inverse up to the padding, and gradients through both."""
    gen = torch.Generator(device=device).manual_seed(case_seed("padding", device))
    hidden = torch.randn(3, 6, 4, 2, generator=gen, device=device, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]], device=device)
    unused = torch.tensor([[0, 0, 0, 1, 0, 0], [1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]], device=device)

    packed, indices, cu_seqlens, max_seqlen, seqused = unpad_input(hidden, mask)
    assert torch.equal(packed, hidden.flatten(0, 1)[mask.flatten().bool()])
    assert indices.dtype == torch.int64 and indices.tolist() == [0, 1, 2, 12, 13, 14, 15, 16, 17]
    assert cu_seqlens.dtype == torch.int32 and cu_seqlens.tolist() == [0, 3, 3, 9]
    assert isinstance(max_seqlen, int) and max_seqlen == 6
    assert seqused.dtype == torch.int32 and seqused.tolist() == [3, 0, 6]
    padded = pad_input(packed, indices, 3, 6)
    assert torch.equal(padded, hidden * mask[..., None, None])
    (grad,) = torch.autograd.grad(padded, hidden, torch.ones_like(padded))
    assert torch.equal(grad, mask[..., None, None].float().expand_as(hidden))

    packed, indices, cu_seqlens, max_seqlen, seqused = unpad_input(hidden, mask, unused)
    assert indices.tolist() == [0, 1, 2, 3, 6, 12, 13, 14, 15, 16, 17]
    assert cu_seqlens.tolist() == [0, 4, 5, 11] and max_seqlen == 6 and seqused.tolist() == [3, 0, 6]
    assert packed.shape == (11, 4, 2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("feature", ["everything", "window-softcap", "alibi-batch-heads"])
def test_packed_functions_equal_varlen_func(device, feature):
    """flash_attn_varlen_qkvpacked_func and flash_attn_varlen_kvpacked_func with every option (dropout
    under one torch seed) equal flash_attn_varlen_func on the slices: out, lse, S_dmask and gradients."""
    lengths = [5, 0, 130, 1, 64]
    seed = case_seed("varlen packed", device, feature)
    gen = torch.Generator(device=device).manual_seed(seed)
    qkv = torch.randn(sum(lengths), 3, 4, 64, generator=gen, dtype=torch.bfloat16, device=device)
    dout = torch.randn(sum(lengths), 4, 64, generator=gen, dtype=torch.bfloat16, device=device)
    cu = offsets(lengths, device)
    causal, scale, options = feature_options(feature, len(lengths), 4, device, seed)
    options.pop("rng_state", None)
    kwargs = {"softmax_scale": scale, "causal": causal, "deterministic": True, **options}

    def run(func, tensors, *args):
        leaves = tuple(t.detach().requires_grad_() for t in tensors)
        torch.manual_seed(seed)
        out, lse, probs = func(*leaves, *args, return_attn_probs=True, **kwargs)
        return (out, lse, probs, *torch.autograd.grad(out, leaves, dout))

    out, lse, probs, dq, dk, dv = run(flash_attn_varlen_func, qkv.unbind(dim=1), cu, cu, 130, 130)
    packed = run(flash_attn_varlen_qkvpacked_func, (qkv,), cu, 130)
    assert all(torch.equal(a, b) for a, b in zip(packed, (out, lse, probs, torch.stack((dq, dk, dv), dim=1))))
    kv_packed = run(flash_attn_varlen_kvpacked_func, (qkv[:, 0], qkv[:, 1:]), cu, cu, 130, 130)
    assert all(torch.equal(a, b) for a, b in zip(kv_packed, (out, lse, probs, dq, torch.stack((dk, dv), dim=1))))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "max_seqlen_q, max_seqlen_k",
    [(130, 64), (500, 300), (torch.tensor(130), torch.tensor(64, dtype=torch.int32)), (np.int64(130), np.int32(64))],
    ids=["exact", "larger", "0d-tensors", "numpy"],
)
def test_max_seqlen_forms(device, max_seqlen_q, max_seqlen_k):
    """max_seqlen_* may exceed the longest sequence and may be a 0-d tensor or a NumPy integer."""
    q, k, v, varlen = packed_batch([130, 3, 0], [2, 64, 9], (4, 2), 32, torch.float16, device, 7)
    expected = flash_attn_varlen_func(q, k, v, *varlen.values(), causal=True)
    out = flash_attn_varlen_func(
        q, k, v, varlen["cu_seqlens_q"], varlen["cu_seqlens_k"], max_seqlen_q, max_seqlen_k, causal=True
    )
    assert torch.equal(out, expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("feature", ["dropout", "everything"])
def test_return_attn_probs_varlen(device, feature):
    """S_dmask of a variable-length batch: (batch, nheads, max_seqlen_q and max_seqlen_k rounded up
    to 128) in q's dtype, 0 outside each sequence; inside, decoded as FlashAttention-2's tests do, the
    sequence's probabilities within the bound, dropped ones (drawn with the sequence's index) marked
    by the sign bit."""
    lengths_q, lengths_k = [3, 0, 70, 1], [40, 6, 70, 0]
    seed = case_seed("varlen probs", device, feature)
    q, k, v, varlen = packed_batch(lengths_q, lengths_k, (4, 2), 32, torch.bfloat16, device, seed)
    causal, scale, options = feature_options(feature, len(lengths_q), 4, device, seed)
    options.pop("rng_state")
    torch.manual_seed(seed)
    out, lse, probs = flash_attn_varlen_func(
        q, k, v, *varlen.values(), softmax_scale=scale, causal=causal, return_attn_probs=True, **options
    )
    scale = 32**-0.5 if scale is None else scale
    torch.manual_seed(seed)
    options["rng_state"] = torch.randint(0, 2**62, (2,), dtype=torch.int64, device=device)
    assert probs.shape == (4, 4, 128, 128) and probs.dtype == q.dtype
    for b, (rows, keys) in enumerate(sequences(varlen)):
        seqlen_q, seqlen_k = rows.stop - rows.start, keys.stop - keys.start
        inside = probs[b, :, :seqlen_q, :seqlen_k]
        outside = probs[b].clone()
        outside[:, :seqlen_q, :seqlen_k] = 0
        assert torch.equal(outside, torch.zeros_like(outside))
        q_b, k_b = q[rows][None], k[keys][None]
        ref_options = {key: value for key, value in reference_options(q_b, k_b, sequence_options(options, b)).items()
                       if "dropout" not in key}  # fmt: skip
        accurate = _reference_probs(q_b.float(), k_b.float(), scale, causal, **ref_options)[0]
        lowp = _reference_probs(q_b, k_b, scale, causal, upcast=False, **ref_options)[0]
        assert max_abs_diff(decode_s_dmask(inside, accurate, 32), accurate) <= 2 * max_abs_diff(lowp, accurate) + 1e-5
        keep = dropout_keep_mask(options["rng_state"], options["dropout_p"], range(seqlen_q), range(seqlen_k), 4,
                                 range(b, b + 1))[0]  # fmt: skip
        assert torch.equal(torch.signbit(inside), ~keep)


@pytest.mark.parametrize("device", DEVICES)
def test_tokens_past_the_last_sequence(device):
    """Rows and keys past cu_seqlens_*[-1] belong to no sequence (serving stacks pad batches for CUDA
    graphs): the sequences' results are those of the trimmed batch, the rows past the end get out 0,
    lse -inf and dq 0, and the keys past the end zero gradients, on every path."""
    q, k, v, varlen = packed_batch([20, 0, 33], [17, 5, 40], (4, 1), 64, torch.float16, device, 3)
    trimmed = (q[:-6], k[:-9], v[:-9])
    cu_q, cu_k = offsets([20, 0, 27], device), offsets([17, 5, 31], device)
    args = (cu_q, cu_k, 33, 40, 0.0, None, True)
    leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
    with poisoned_allocations():
        out = flash_attn_varlen_func(*leaves, *args, deterministic=True)
    dout = torch.randn_like(out)
    with poisoned_allocations():
        dq, dk, dv = torch.autograd.grad(out, leaves, dout)
    trimmed_leaves = tuple(t.detach().requires_grad_() for t in trimmed)
    want = flash_attn_varlen_func(*trimmed_leaves, *args, deterministic=True)
    want_grads = torch.autograd.grad(want, trimmed_leaves, dout[:-6])
    assert torch.equal(out[:-6], want)
    for grad, want_grad in zip((dq[:-6], dk[:-9], dv[:-9]), want_grads):
        assert torch.equal(grad, want_grad)
    assert torch.equal(dk[-9:], torch.zeros_like(dk[-9:])) and torch.equal(dv[-9:], torch.zeros_like(dv[-9:]))
    _, lse = run_forward(q, k, v, 0.125, True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=33,
                         max_seqlen_k=40)  # fmt: skip
    assert torch.equal(out[-6:], torch.zeros_like(out[-6:])) and torch.equal(dq[-6:], torch.zeros_like(dq[-6:]))
    assert torch.equal(lse[:, -6:], torch.full_like(lse[:, -6:], -math.inf))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lengths", [[], [0], [0, 0, 0]], ids=["no-sequence", "one-empty", "three-empty"])
def test_empty_batches(device, lengths):
    """No sequence, or only empty ones: correctly shaped empty results and gradients."""
    q, k, v, varlen = packed_batch(lengths or [0], lengths or [0], (4, 2), 40, torch.float16, device, 0)
    if not lengths:
        varlen["cu_seqlens_q"] = varlen["cu_seqlens_k"] = torch.zeros(1, dtype=torch.int32, device=device)
    leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
    out, lse, probs = flash_attn_varlen_func(*leaves, *varlen.values(), causal=True, return_attn_probs=True)
    assert out.shape == (0, 4, 40) and lse.shape == (4, 0) and probs.shape == (0,)  # no dropout: no S_dmask
    grads = torch.autograd.grad(out, leaves, torch.ones_like(out))
    assert [grad.shape for grad in grads] == [(0, 4, 40), (0, 2, 40), (0, 2, 40)]


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph_varlen(device):
    """flash_attn_varlen_func with Python-int max_seqlen traces into one graph (no graph break), forward
    and backward, and computes what eager computes (the backward through AOT autograd's eager backend,
    which keeps the CPU test quick)."""

    def loss_of(q, k, v, cu_q, cu_k):
        out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 70, 90, causal=True, window_size=(20, -1),
                                     deterministic=True)  # fmt: skip
        return (out * 2).sum(), out

    q, k, v, varlen = packed_batch([70, 0, 13], [90, 4, 1], (4, 2), 59, torch.bfloat16, device, 5)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    cu = (varlen["cu_seqlens_q"], varlen["cu_seqlens_k"])
    compiled = torch.compile(loss_of, fullgraph=True, backend=aot_autograd(fw_compiler=lambda gm, _: gm))
    loss, out = compiled(*leaves, *cu)
    want_loss, want_out = loss_of(*leaves, *cu)
    assert torch.equal(out, want_out)
    for grad, want in zip(torch.autograd.grad(loss, leaves), torch.autograd.grad(want_loss, leaves)):
        assert torch.equal(grad, want)
    forward_only = torch.compile(lambda *args: loss_of(*args)[1], fullgraph=True)
    with torch.no_grad():
        assert torch.equal(forward_only(*leaves, *cu), want_out)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_takes_tensor_max_seqlen(device):
    """Under torch.compile(fullgraph=True) a 0-d tensor max_seqlen is not read (that would break the
    graph): the packed row count bounds it, and the result is eager's with the int."""
    q, k, v, varlen = packed_batch([9, 3, 0], [4, 7, 2], (2, 2), 16, torch.bfloat16, device, 1)
    want = flash_attn_varlen_func(q, k, v, *varlen.values(), causal=True)
    as_tensors = {**varlen, "max_seqlen_q": torch.tensor(9), "max_seqlen_k": torch.tensor(7)}
    compiled = torch.compile(lambda *args: flash_attn_varlen_func(*args, causal=True), fullgraph=True,
                             backend="eager")
    assert torch.equal(compiled(q, k, v, *as_tensors.values()), want)
