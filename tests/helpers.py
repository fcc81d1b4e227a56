"""What the tests share: random inputs, poisoned outputs, and the error bounds.

The bound (the project's testing rule): our error against an accurate reference may be at
most twice the error of PyTorch doing the same math in the same low precision,
plus a tiny epsilon for cases where PyTorch happens to be exact:
    max|ours - ref| <= 2 * max|torch_same_dtype - ref| + eps
and three times for gradients, whose low-precision error compounds over more products.

Refinements, all found by tests/test_property.py failing a correct implementation on
small or peaked cases (PyTorch's error there can be ~0 by luck): in 16-bit dtypes the
factor times PyTorch's error is raised to at least one unit in the last place of the
result (see rounding_floor); dq and dk may add the error that FlashAttention's backward
takes over from the forward's out (see inherited_grad_errors), which PyTorch's backward
does not have, grown by one rounding of dS to the input dtype (found on the H100 with
dropout and one key per query, where that error is nearly all of dk's); they may also add
the fp32 rounding left in dS = P * (dP - D) where dP and D cancel (see
cancellation_grad_errors; one key per query again, on the H100 and H200); and the gradient
epsilon grows with softmax_scale * sqrt(headdim), the factor by which the terms summed into
dq and dk outgrow those of the default scale (see grad_eps).
"""

import contextlib
import math
import zlib
from collections.abc import Iterator, Sequence

import pytest
import torch
from torch import Tensor

from flashattn import flash_attn_func
from flashattn.cpu import s_dmask_block_n
from flashattn.interface import _flash_attn_forward
from flashattn.philox import dropout_keep_mask
from flashattn.reference import attention_probs, attention_ref

# The bound itself is flashattn.testing's, shared with the benchmarks; the names stay importable from here.
from flashattn.testing import (  # noqa: F401
    GRAD_EPS,
    GRAD_FACTOR,
    LSE_EPS,
    OUT_EPS,
    grad_bound,
    grad_eps,
    grads_rounding_floors,
    max_abs_diff,
    output_bound,
    probs_rounding_floor,
    rounding_floor,
)

# Parametrize a test with `device` to run it on CPU and, where there is one, on the GPU.
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]


def case_seed(*params: object) -> int:
    """A seed derived from a case's parameters: fresh inputs per case, and a failure reproduces."""
    return zlib.crc32(repr(params).encode())


def random_qkv(
    batch: int,
    seqlen_q: int,
    seqlen_k: int,
    num_heads: int,
    num_heads_k: int,
    head_dim: int,
    dtype: torch.dtype,
    device: str,
    seed: int,
    layout: str = "contiguous",
    v_head_dim: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Standard normal q (B, Sq, H, D), k (B, Sk, Hk, D) and v (B, Sk, Hk, Dv), Dv = v_head_dim (by
    default D), in one of these memory layouts:

    contiguous: three separate contiguous tensors.
    packed: slices of one (B, S, 3, H, D) tensor, as a fused qkv projection makes them.
    transposed: (B, H, S, D) tensors seen as (B, S, H, D).
    offset: views starting one element into a (B, S, H, D + 1) tensor: rows that are
        not 16-byte aligned, which the CUDA path must copy.
    """
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape: int) -> Tensor:
        return torch.randn(shape, generator=gen, dtype=dtype, device=device)

    v_head_dim = head_dim if v_head_dim is None else v_head_dim
    if layout == "contiguous":
        return (randn(batch, seqlen_q, num_heads, head_dim), randn(batch, seqlen_k, num_heads_k, head_dim),
                randn(batch, seqlen_k, num_heads_k, v_head_dim))  # fmt: skip
    if layout == "packed":  # v: its first Dv columns
        packed = randn(batch, max(seqlen_q, seqlen_k), 3, num_heads, head_dim)
        return (
            packed[:, :seqlen_q, 0],
            packed[:, :seqlen_k, 1, :num_heads_k],
            packed[:, :seqlen_k, 2, :num_heads_k, :v_head_dim],
        )
    if layout == "transposed":
        return (randn(batch, num_heads, seqlen_q, head_dim).transpose(1, 2),
                randn(batch, num_heads_k, seqlen_k, head_dim).transpose(1, 2),
                randn(batch, num_heads_k, seqlen_k, v_head_dim).transpose(1, 2))  # fmt: skip
    if layout == "offset":
        return (randn(batch, seqlen_q, num_heads, head_dim + 1)[..., 1:],
                randn(batch, seqlen_k, num_heads_k, head_dim + 1)[..., 1:],
                randn(batch, seqlen_k, num_heads_k, v_head_dim + 1)[..., 1:])  # fmt: skip
    raise ValueError(f"unknown layout {layout!r}")


@contextlib.contextmanager
def poisoned_allocations() -> Iterator[None]:
    """Every tensor allocated inside starts out NaN, so an output element never written fails.

    The operator allocates its own outputs, so they cannot be filled before the
    call. Torch's deterministic mode fills each uninitialised allocation with
    NaN (torch.utils.deterministic.fill_uninitialized_memory), on CPU and CUDA
    alike and including the C++ binding's at::empty: exactly the op's outputs,
    unlike pre-filling the allocator's cache, which a fresh allocation may miss.
    It stays off outside, where the reference's cuBLAS calls would refuse it.
    """
    was_on = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = fill
        torch.use_deterministic_algorithms(was_on, warn_only=warn_only)


def run_forward(
    q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, causal: bool, **options: object
) -> tuple[Tensor, Tensor]:
    """Our forward, (out, softmax_lse), with poisoned outputs. options: _flash_attn_forward's
    (window_size, softcap, alibi_slopes, dropout_p with rng_state, cu_seqlens_q/k, max_seqlen_q/k)."""
    with poisoned_allocations():
        return _flash_attn_forward(q, k, v, softmax_scale, causal, **options)


def run_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dout: Tensor,
    softmax_scale: float,
    causal: bool,
    deterministic: bool = False,
    **options: object,
) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv of flash_attn_func's out against dout, the backward with poisoned outputs.

    The leaves are detached views of q, k, v: the backward sees their strides.
    With options (as run_forward's), the forward is _flash_attn_forward, which
    takes the rng_state of dropout from the caller; its out is differentiable alike.
    """
    leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
    if options:
        out, _ = _flash_attn_forward(*leaves, softmax_scale, causal, deterministic, **options)
    else:
        out = flash_attn_func(*leaves, softmax_scale=softmax_scale, causal=causal, deterministic=deterministic)
    with poisoned_allocations():
        return torch.autograd.grad(out, leaves, dout)


def reference_options(q: Tensor, k: Tensor, options: dict, batch_start: int = 0) -> dict:
    """attention_ref's keyword arguments for our options on padded q, k: dropout's rng_state becomes
    the keep mask the kernels draw (flashattn.philox), of sequences batch_start, batch_start + 1, ..."""
    ref = {name: options[name] for name in ("window_size", "softcap", "alibi_slopes") if name in options}
    dropout_p = options.get("dropout_p", 0.0)
    if dropout_p > 0:
        batch, seqlen_q, num_heads = q.shape[:3]
        ref["dropout_p"] = dropout_p
        ref["dropout_mask"] = dropout_keep_mask(
            options["rng_state"], dropout_p, range(seqlen_q), range(k.shape[1]), num_heads,
            range(batch_start, batch_start + batch),
        )  # fmt: skip
    return ref


def reference_grads(
    q: Tensor, k: Tensor, v: Tensor, dout: Tensor, softmax_scale: float, causal: bool, upcast: bool, **ref_options
) -> tuple[Tensor, ...]:
    """dq, dk, dv of attention_ref's out against dout through PyTorch's autograd, in the inputs' dtype.
    ref_options: attention_ref's keyword arguments (see reference_options)."""
    leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
    out, _ = attention_ref(*leaves, softmax_scale, causal, upcast=upcast, **ref_options)
    return torch.autograd.grad(out, leaves, dout.to(out.dtype))


def assert_matches_reference(
    out: Tensor,
    lse: Tensor | None,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    softmax_scale: float,
    causal: bool,
    batch_start: int = 0,
    **options: object,
) -> None:
    """out and lse of our forward on (q, k, v) are within the error bound, with no NaN (lse None:
    out alone, for a path that returns no LSE).

    The accurate reference computes in fp32 (in float64 for fp32 inputs, whose
    "same precision" PyTorch run is the fp32 reference itself). The LSE's
    low-precision yardstick is the log-sum-exp of the scores PyTorch computes
    in the input dtype; -inf (rows that see no key) must sit in the same places.
    options: those our forward ran with (see run_forward); with dropout, both
    references drop what the kernels' mask drops (batch_start: the index of the
    first sequence of q, for sequences cut out of a larger batch).
    """
    ref_options = reference_options(q, k, options, batch_start)
    accurate = (q, k, v) if q.dtype != torch.float32 else (q.double(), k.double(), v.double())
    out_ref, lse_ref = attention_ref(*accurate, softmax_scale, causal, **ref_options)
    out_lowp, lse_lowp = attention_ref(q, k, v, softmax_scale, causal, upcast=False, **ref_options)
    assert out.shape == out_ref.shape and out.dtype == q.dtype, (out.shape, out.dtype)
    assert not out.isnan().any(), "out has NaN: an element was never written, or 0/0"
    out_err = max_abs_diff(out, out_ref)
    floor = rounding_floor(out_ref, q.dtype)
    out_bound = output_bound(max_abs_diff(out_lowp, out_ref), floor)
    if out_err > out_bound:  # out may cancel: the probabilities' own rounding (computed only here, it costs a GEMM)
        floor = max(floor, probs_rounding_floor(q, k, v, softmax_scale, causal, **ref_options))
        out_bound = output_bound(max_abs_diff(out_lowp, out_ref), floor)
    assert out_err <= out_bound, f"out: max error {out_err:.3g} > bound {out_bound:.3g}"
    if lse is None:
        return

    assert lse.shape == lse_ref.shape and lse.dtype == torch.float32, (lse.shape, lse.dtype)
    assert not lse.isnan().any(), "softmax_lse has NaN"

    assert torch.equal(lse == -math.inf, lse_ref == -math.inf), "softmax_lse: -inf in other places"
    finite = lse_ref.isfinite()
    assert lse[finite].isfinite().all(), "softmax_lse: an infinity where the reference is finite"
    lse_err = max_abs_diff(lse[finite], lse_ref[finite])
    lse_bound = output_bound(max_abs_diff(lse_lowp[finite], lse_ref[finite]), eps=LSE_EPS)
    assert lse_err <= lse_bound, f"softmax_lse: max error {lse_err:.3g} > bound {lse_bound:.3g}"


def blind_rows(seqlen_q: int, seqlen_k: int, causal: bool, window_size: tuple[int, int] = (-1, -1)) -> int:
    """How many query rows see no key: always the leading ones. Query i sees some key iff
    Sk > 0 and i + Sk - Sq + right >= 0 (right = 0 if causal): a window's left side never
    empties a row, since the diagonal key of the last row is Sk - 1."""
    right = 0 if causal else window_size[1]
    if seqlen_k == 0:
        return seqlen_q
    return min(seqlen_q, max(0, seqlen_q - seqlen_k - right)) if right >= 0 else 0


def inherited_grad_errors(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dout: Tensor,
    softmax_scale: float,
    causal: bool,
    stored_out: Tensor | None = None,
    batch_start: int = 0,
    **options: object,
) -> tuple[float, float]:
    """max |error| of dq and dk that the FlashAttention backward takes over from the forward.

    The backward computes D = rowsum(dO * O) from the forward's out, which carries the
    forward's error (at least its rounding to the input dtype; the forward's tests bound
    the rest). With D off by e_i on row i, dS = P * (dP - D) is off by -P * e_i, the
    gradient of -sum_i e_i * lse_i with respect to the scores: the errors of dq and dk
    are that sum's gradients, here through attention_ref in fp32 (float64 for fp32
    inputs). dv = P^T dO does not involve D.
    """
    accurate_dtype = torch.float64 if q.dtype == torch.float32 else torch.float32
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    # Rows that see no key have no D to speak of, and lse -inf, whose gradient is NaN.
    blind = blind_rows(seqlen_q, seqlen_k, causal, options.get("window_size", (-1, -1)))
    if blind == seqlen_q:
        return 0.0, 0.0
    ref_options = reference_options(q, k, options, batch_start)
    if stored_out is None:
        stored_out, _ = _flash_attn_forward(q, k, v, softmax_scale, causal, **options)
    # Dropping leading query rows keeps the bottom-right mask (and ALiBi's distances) of the others.
    q, dout, stored_out = q[:, blind:], dout[:, blind:], stored_out[:, blind:]
    if "dropout_mask" in ref_options:
        ref_options["dropout_mask"] = ref_options["dropout_mask"][:, :, blind:]
    leaves = tuple(t.detach().to(accurate_dtype).requires_grad_() for t in (q, k))
    out, lse = attention_ref(*leaves, v.to(accurate_dtype), softmax_scale, causal, **ref_options)  # lse [B, H, Sq]
    d_error = (dout.to(accurate_dtype) * (stored_out.to(accurate_dtype) - out.detach())).sum(dim=-1)
    dq_error, dk_error = torch.autograd.grad(lse, leaves, d_error.transpose(1, 2))
    return dq_error.abs().max().item(), dk_error.abs().max().item()


def cancellation_grad_errors(
    q: Tensor, k: Tensor, v: Tensor, dout: Tensor, softmax_scale: float, causal: bool, **ref_options: object
) -> tuple[float, float]:
    """max |error| of dq and dk from the cancellation in dS = P * (dP - D), which PyTorch's run has not.

    The backward kernels sum dP_ij = dO_i . v_j (the tensor cores) and D_i = dO_i . O_i (the
    preprocess) in fp32, in different orders, then subtract: where P is concentrated on one key
    (Sk = 1, or a peaked row), dP_ij and D_i are equal up to that rounding, and dS is only the
    rounding. PyTorch's softmax backward takes D from the same dP, so its error has none of it
    and cannot stand for it (hypothesis found dk 1.03e-4 against 1.0e-4 at head dim 356, 9 rows
    over one key). Each sum of d products is off by about sqrt(d) units of fp32 times the sum of
    their magnitudes; that error, weighted by P, reaches dq and dk as the inherited error does:
    scale * sum_j P_ij e_ij |k_j| and scale * sum_i P_ij e_ij |q_i| (summed over a KV head's query
    heads). Dropout left out (its kept P is at most P / (1 - p), whose dP is 0 where dropped).
    """
    if q.numel() == 0 or k.shape[1] == 0:
        return 0.0, 0.0
    options = {name: value for name, value in ref_options.items() if not name.startswith("dropout")}
    accurate = (t.to(torch.float64 if q.dtype == torch.float32 else torch.float32) for t in (q, k, v, dout))
    q_acc, k_acc, v_acc, dout_acc = accurate
    probs, v_heads, _ = attention_probs(q_acc, k_acc, v_acc, softmax_scale, causal, **options)  # [B, H, Sq, Sk]
    out = torch.einsum("bhqk,bkhd->bqhd", probs, v_heads)
    batch, seqlen_k, num_heads_k, head_dim = k.shape
    num_heads = q.shape[2]
    unit = torch.finfo(torch.float32).eps / 2 * math.sqrt(v.shape[-1])
    dp_terms = torch.einsum("bqhd,bkhd->bhqk", dout_acc.abs(), v_heads.abs())
    d_terms = (dout_acc.abs() * out.abs()).sum(dim=-1).transpose(1, 2).unsqueeze(-1)  # [B, H, Sq, 1]
    weights = probs * (dp_terms + d_terms) * unit
    k_heads = k_acc.abs().repeat_interleave(num_heads // num_heads_k, dim=2)
    dq_error = softmax_scale * torch.einsum("bhqk,bkhd->bqhd", weights, k_heads)
    dk_error = softmax_scale * torch.einsum("bhqk,bqhd->bkhd", weights, q_acc.abs())
    dk_error = dk_error.reshape(batch, seqlen_k, num_heads_k, num_heads // num_heads_k, head_dim).sum(dim=3)
    return dq_error.max().item(), dk_error.max().item()


def assert_grads_match_reference(
    grads: Sequence[Tensor],
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dout: Tensor,
    softmax_scale: float,
    causal: bool,
    stored_out: Tensor | None = None,
    batch_start: int = 0,
    **options: object,
) -> None:
    """dq, dk, dv of our backward on (q, k, v, dout) are within the gradient bound, with no NaN.

    The accurate reference differentiates attention_ref on fp32 copies of the
    inputs (float64 for fp32 inputs): differentiating through attention_ref's
    own upcast would round its gradients back to the input dtype. The
    low-precision yardstick differentiates attention_ref(upcast=False) in the
    input dtype. dq and dk may add the error inherited from the forward's out
    (stored_out: that out, when q is cut out of a larger call; by default our
    forward is run again). options and batch_start: as in assert_matches_reference.
    """
    ref_options = reference_options(q, k, options, batch_start)
    accurate_dtype = torch.float64 if q.dtype == torch.float32 else torch.float32
    accurate = (t.to(accurate_dtype) for t in (q, k, v, dout))
    refs = reference_grads(*accurate, softmax_scale, causal, upcast=True, **ref_options)
    lowps = reference_grads(q, k, v, dout, softmax_scale, causal, upcast=False, **ref_options)
    inherited_dq, inherited_dk = inherited_grad_errors(
        q, k, v, dout, softmax_scale, causal, stored_out, batch_start, **options
    )
    # The inherited error reaches dq and dk through dS, which the kernels round to the
    # input dtype before the GEMMs: it may grow by that rounding (one eps of the dtype).
    carried = 1.0 + (torch.finfo(q.dtype).eps if q.dtype in (torch.float16, torch.bfloat16) else 0.0)
    cancelled_dq, cancelled_dk = cancellation_grad_errors(q, k, v, dout, softmax_scale, causal, **ref_options)
    inherited = (inherited_dq * carried + cancelled_dq, inherited_dk * carried + cancelled_dk, 0.0)
    eps = grad_eps(softmax_scale, q.shape[-1])
    terms_floors = None  # grads_rounding_floors, computed only where a gradient needs it (it costs GEMMs)
    for i, (name, grad, ref, lowp, from_out, t) in enumerate(
            zip(("dq", "dk", "dv"), grads, refs, lowps, inherited, (q, k, v))):
        assert grad.shape == t.shape and grad.dtype == t.dtype, (name, grad.shape, grad.dtype)
        assert not grad.isnan().any(), f"{name} has NaN: an element was never written, or 0/0"
        err = max_abs_diff(grad, ref)
        floor = rounding_floor(ref, t.dtype)
        bound = grad_bound(max_abs_diff(lowp, ref), floor, from_out, eps)
        if err > bound:  # the gradient may cancel: the rounding of P and dS before the GEMMs
            if terms_floors is None:
                terms_floors = grads_rounding_floors(q, k, v, dout, softmax_scale, causal, **ref_options)
            bound = grad_bound(max_abs_diff(lowp, ref), max(floor, terms_floors[i]), from_out, eps)
        assert err <= bound, f"{name}: max error {err:.3g} > bound {bound:.3g}"


def decode_s_dmask(s_dmask: Tensor, probs_ref: Tensor, head_dim: int) -> Tensor:
    """The probabilities [..., Sq, Sk] that S_dmask encodes (FlashAttention-2's encoding, see
    flashattn.cpu.attention_probs), recovered as FlashAttention-2's tests recover them: |entry| times
    exp(m - lse), which is the largest reference probability of its row in its key block and the
    blocks right of it. probs_ref: the accurate probabilities [..., Sq, Sk], fp32 or wider; head_dim:
    q's, which sets the key-block width."""
    seqlen_q, seqlen_k = probs_ref.shape[-2:]
    if probs_ref.numel() == 0:
        return probs_ref.clone()
    block_n = s_dmask_block_n(head_dim)
    block_max = torch.stack([block.amax(dim=-1) for block in probs_ref.split(block_n, dim=-1)], dim=-1)
    reach = block_max.flip(-1).cummax(dim=-1).values.flip(-1).repeat_interleave(block_n, dim=-1)[..., :seqlen_k]
    return s_dmask[..., :seqlen_q, :seqlen_k].abs().to(probs_ref.dtype) * reach
