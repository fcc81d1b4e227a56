"""FP8 inputs (float8_e4m3fn q, k, v with q_descale, k_descale, v_descale; FlashAttention-3's API).

No FP8 kernel exists yet: every device computes 16-bit attention on the dequantised values
(flashattn/fp8.py). So the function under test is attention on round(stored x descale) in
out_dtype, held to the fp32 reference with the 16-bit bound (assert_matches_reference) on inputs
the test dequantises itself, with its own head mapping: a wrong descale, head or sequence shows
as an error far past the bound. Errors name the argument. Everything runs on CPU; the same cases
run on CUDA where there is one.
"""

import pytest
import torch
from helpers import DEVICES, assert_matches_reference, case_seed, poisoned_allocations

from flashattn import flash_attn_func, flash_attn_varlen_func

FP8 = torch.float8_e4m3fn
OUT_DTYPES = [torch.bfloat16, torch.float16]


def fp8_inputs(shape_q, shape_k, shape_v, gen, device, outliers=False):
    """q, k, v stored in e4m3 (values of N(0, 2^2), clipped to e4m3's range by the cast), and the
    same values as fp32. outliers: a few keys' entries at e4m3's largest magnitude, 448."""
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
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", ["gqa", "mha-d40", "outliers-d128", "no-descale"])
def test_fp8_is_16_bit_attention_on_the_dequantised_values(device, out_dtype, causal, case):
    """out (and lse) of float8_e4m3fn q, k, v with descales: within the 16-bit bound of the fp32
    reference on the values the test dequantises itself; out in out_dtype; no NaN or Inf, outliers
    in k included (e4m3's largest values)."""
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


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_varlen_takes_one_descale_per_sequence(device):
    """Packed sequences (one empty, rows past the last sequence) with descales (sequences,
    nheads_k): each sequence's out matches the reference on its own dequantised values; rows no
    sequence owns are 0."""
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
        ("fp8 pages", lambda: flash_attn_varlen_func(q.view(16, 4, 64), pages, pages, cu, cu, 8, 8, block_table=table),
         NotImplementedError, "block_table"),
        ("wrong rank", lambda: flash_attn_func(q.view(16, 4, 64), k, v), ValueError, "q must be (batch, seqlen"),
    ]


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
