"""Issue 21's model features: learnable sinks, a differentiable LSE, flash_attn_combine.

Each case runs on CPU tensors and, marked gpu, on CUDA tensors (fp16/bf16: the kernels' dtypes),
against the fp32 reference (flashattn.reference.attention_ref, which takes learnable_sink), with
style.md's bounds: max|ours - ref| <= 2 * max|torch_same_dtype - ref| + eps for outputs, 3x for
gradients (flashattn.testing). The accurate reference computes in fp32 (float64 for fp32 inputs);
PyTorch's same-dtype yardstick is attention_ref(upcast=False). On CUDA the family that serves the
call runs (sm90 on an H100 for what its kernels serve); the suite's FLASHATTN_FAMILY=sm80 pass runs
the same cases on the sm80 kernels, and test_sink_runs_the_family_kernels says which ran.
"""

import math

import pytest
import torch
from torch import Tensor

import flashattn
from flashattn import flash_attn_combine, flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
from flashattn import cpu
from flashattn.interface import _flash_attn_forward
from flashattn.reference import attention_ref
from flashattn.testing import LSE_EPS, grad_bound, grad_eps, max_abs_diff, output_bound, rounding_floor

from helpers import DEVICES, case_seed, decode_s_dmask, poisoned_allocations, random_qkv, reference_options

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
GPU = pytest.mark.gpu
# (device, dtype): CPU in every dtype it serves, CUDA in the kernels' (fp16, bf16).
DEVICE_DTYPES = [
    *(pytest.param("cpu", dtype, id=f"cpu-{dtype}") for dtype in DTYPES),
    *(pytest.param("cuda", dtype, id=f"cuda-{dtype}", marks=GPU) for dtype in (torch.float16, torch.bfloat16)),
]
# One dtype per device, for the cases that sweep other things.
DEVICE_DTYPE = [pytest.param("cpu", torch.float32, id="cpu"),
                pytest.param("cuda", torch.bfloat16, id="cuda", marks=GPU)]  # fmt: skip

# (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim): awkward lengths, Sq != Sk both ways, MHA/GQA/MQA.
SHAPES = [
    (1, 1, 1, 1, 1, 8),
    (2, 3, 113, 4, 2, 17),
    (1, 203, 67, 6, 1, 40),
    (2, 130, 257, 4, 4, 64),
    (1, 77, 77, 8, 2, 96),
]
# (causal, window_size, softcap, alibi)
OPTIONS = [
    (False, (-1, -1), 0.0, False),
    (True, (-1, -1), 0.0, False),
    (False, (31, 5), 0.0, False),
    (True, (17, 0), 0.0, False),
    (False, (-1, -1), 2.5, True),
    (True, (40, -1), 1.5, True),
]


def _id(case: tuple) -> str:
    return "-".join(str(x).replace(" ", "") for x in case)


def _inputs(shape: tuple, dtype: torch.dtype, seed: int, alibi: bool = False, device: str = "cpu",
            v_head_dim: int | None = None) -> tuple[Tensor | None, ...]:
    """q, k, v (v's head dim v_head_dim, by default q's), dout in dtype; sink and dlse fp32; ALiBi slopes
    or None: fresh per case, never zeros, drawn on the CPU (the same values on every device) and moved
    to `device`."""
    batch, seqlen_q, seqlen_k, heads, heads_k, head_dim = shape
    q, k, v = random_qkv(batch, seqlen_q, seqlen_k, heads, heads_k, head_dim, dtype, "cpu", seed,
                         v_head_dim=v_head_dim)  # fmt: skip
    gen = torch.Generator().manual_seed(seed + 1)
    dout = torch.randn(cpu.out_shape(q, v), generator=gen).to(dtype)
    # Sinks of a few units: comparable with the scores, so the sink's share is neither 0 nor 1.
    sink = torch.randn(heads, generator=gen) * 2
    dlse = torch.randn(batch, heads, seqlen_q, generator=gen)
    slopes = torch.rand(heads, generator=gen) * 0.3 if alibi else None
    return tuple(None if t is None else t.to(device) for t in (q, k, v, dout, sink, dlse, slopes))


def _offsets(lengths: list[int]) -> Tensor:
    """cu_seqlens of sequences of these lengths."""
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def _accurate(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float32 else torch.float32


def _reference_grads(q, k, v, sink, dout, dlse, scale, causal, upcast, **options) -> tuple[Tensor, ...]:
    """dq, dk, dv, dsink of sum(out * dout) + sum(lse * dlse) by autograd on attention_ref."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v, sink)]
    out, lse = attention_ref(*leaves[:3], scale, causal, upcast=upcast, learnable_sink=leaves[3], **options)
    loss = (out * dout.to(out.dtype)).sum() + (lse * dlse.to(lse.dtype)).sum()
    return torch.autograd.grad(loss, leaves)


def _inherited_errors(q, k, v, sink, dout, stored_out, scale, causal, **options) -> tuple[float, ...]:
    """The errors of dq, dk and dsink that the backward takes over from the forward's out through
    D = rowsum(dO * O) (tests/helpers.py: inherited_grad_errors, with the sink): the gradients of
    sum_i e_i * lse_i, e_i = rowsum(dO_i * (stored_out_i - out_i))."""
    dtype = _accurate(q.dtype)
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, sink)]
    out, lse = attention_ref(leaves[0], leaves[1], v.to(dtype), scale, causal, learnable_sink=leaves[2], **options)
    error = (dout.to(dtype) * (stored_out.to(dtype) - out.detach())).sum(dim=-1).transpose(1, 2)  # [B, H, Sq]
    grads = torch.autograd.grad(lse, leaves, error)
    # dS is rounded to the input dtype before the products: one eps more.
    carried = 1.0 + (torch.finfo(q.dtype).eps if q.dtype != torch.float32 else 0.0)
    return tuple(g.abs().max().item() * carried if g.numel() else 0.0 for g in grads)


def _assert_forward(out, lse, q, k, v, sink, scale, causal, **options) -> None:
    accurate = [t.to(_accurate(q.dtype)) for t in (q, k, v)]
    out_ref, lse_ref = attention_ref(*accurate, scale, causal, learnable_sink=sink, **options)
    out_lowp, lse_lowp = attention_ref(q, k, v, scale, causal, upcast=False, learnable_sink=sink, **options)
    assert out.dtype == q.dtype and lse.dtype == torch.float32
    assert not out.isnan().any() and not lse.isnan().any()
    out_err = max_abs_diff(out, out_ref)
    out_bound = output_bound(max_abs_diff(out_lowp, out_ref), rounding_floor(out_ref, q.dtype))
    assert out_err <= out_bound, f"out: max error {out_err:.3g} > bound {out_bound:.3g}"
    # With a sink no row is empty: the LSE is finite everywhere (sink_h where no key is seen).
    assert lse.isfinite().all()
    lse_err = max_abs_diff(lse, lse_ref)
    lse_bound = output_bound(max_abs_diff(lse_lowp, lse_ref), eps=LSE_EPS)
    assert lse_err <= lse_bound, f"lse: max error {lse_err:.3g} > bound {lse_bound:.3g}"


def _yardsticks(q, k, v, sink, dout, dlse, scale, causal, stored_out, **options) -> tuple[tuple, tuple, tuple]:
    """For dq, dk, dv, dsink: the accurate reference gradients, PyTorch's same-dtype ones, and the
    errors inherited from the forward's out."""
    accurate = [t.to(_accurate(q.dtype)) for t in (q, k, v, sink, dout, dlse)]
    refs = _reference_grads(*accurate, scale, causal, upcast=True, **options)
    lowps = _reference_grads(q, k, v, sink, dout, dlse, scale, causal, upcast=False, **options)
    inherited_dq, inherited_dk, inherited_dsink = _inherited_errors(q, k, v, sink, dout, stored_out, scale, causal,
                                                                    **options)  # fmt: skip
    return refs, lowps, (inherited_dq, inherited_dk, 0.0, inherited_dsink)


def _assert_within(name: str, grad: Tensor, ref: Tensor, lowp: Tensor, inherited: float, dtype: torch.dtype,
                   eps: float) -> None:
    assert not grad.isnan().any(), f"{name} has NaN"
    err = max_abs_diff(grad, ref)
    bound = grad_bound(max_abs_diff(lowp, ref), rounding_floor(ref, dtype), inherited, eps)
    assert err <= bound, f"{name}: max error {err:.3g} > bound {bound:.3g}"


def _assert_grads(grads, q, k, v, sink, dout, dlse, scale, causal, stored_out, **options) -> None:
    refs, lowps, inherited = _yardsticks(q, k, v, sink, dout, dlse, scale, causal, stored_out, **options)
    for name, grad, ref, lowp, from_out, t in zip(("dq", "dk", "dv", "dsink"), grads, refs, lowps, inherited,
                                                 (q, k, v, sink)):  # fmt: skip
        assert grad.shape == t.shape and grad.dtype == t.dtype, (name, grad.shape, grad.dtype)
        _assert_within(name, grad, ref, lowp, from_out, t.dtype, grad_eps(scale, q.shape[-1]))


# ------------------------------------------------------------------------------------ learnable sinks


@pytest.mark.parametrize("device, dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("options", OPTIONS, ids=_id)
@pytest.mark.parametrize("shape", SHAPES, ids=_id)
def test_sink_forward_backward(shape, options, device, dtype):
    """out, lse and the gradients of q, k, v and the sink (through out and through the LSE) against
    autograd on the reference, with causal / window / softcap / ALiBi / GQA."""
    causal, window_size, softcap, alibi = options
    seed = case_seed("sink", shape, options, dtype)
    q, k, v, dout, sink, dlse, slopes = _inputs(shape, dtype, seed, alibi, device)
    scale = shape[-1] ** -0.5
    ref_options = {"window_size": window_size, "softcap": softcap, "alibi_slopes": slopes}
    leaves = [t.detach().requires_grad_() for t in (q, k, v, sink)]
    with poisoned_allocations():
        out, lse, _ = flash_attn_func(*leaves[:3], causal=causal, window_size=window_size, softcap=softcap,
                                      alibi_slopes=slopes, return_attn_probs=True, learnable_sink=leaves[3])
    _assert_forward(out.detach(), lse.detach(), q, k, v, sink, scale, causal, **ref_options)
    with poisoned_allocations():
        grads = torch.autograd.grad((out.float() * dout.float()).sum() + (lse * dlse).sum(), leaves)
    _assert_grads(grads, q, k, v, sink, dout, dlse, scale, causal, out.detach(), **ref_options)


@pytest.mark.parametrize("device, dtype", DEVICE_DTYPE)
def test_sink_of_a_row_that_sees_no_key(device, dtype):
    """A row that sees no key (causal, Sq > Sk) outputs 0 with lse = sink_h, and its sink gradient
    is dlse (the sink is the row's only column)."""
    q, k, v, dout, sink, dlse, _ = _inputs((1, 9, 4, 2, 2, 16), dtype, 7, device=device)
    leaves = [t.detach().requires_grad_() for t in (q, k, v, sink)]
    with poisoned_allocations():
        out, lse, _ = flash_attn_func(*leaves[:3], causal=True, return_attn_probs=True, learnable_sink=leaves[3])
    blind = 9 - 4
    assert torch.equal(out[:, :blind], torch.zeros_like(out[:, :blind]))
    assert torch.allclose(lse[:, :, :blind], sink[None, :, None].expand(1, 2, blind))
    with poisoned_allocations():
        (dsink,) = torch.autograd.grad((lse[:, :, :blind] * dlse[:, :, :blind]).sum(), leaves[3])
    assert torch.allclose(dsink, dlse[0, :, :blind].sum(-1))


@pytest.mark.parametrize("device, dtype", DEVICE_DTYPE)
def test_sink_with_no_key_at_all(device, dtype):
    """Sk = 0: every row sees only the sink (out 0, lse = sink), and the sink's gradient is the sum
    of dlse over its rows (on CUDA from the binding, where no kernel runs the backward)."""
    q, k, v, dout, sink, dlse, _ = _inputs((2, 5, 0, 4, 2, 32), dtype, 13, device=device)
    leaves = [t.detach().requires_grad_() for t in (q, k, v, sink)]
    out, lse, _ = flash_attn_func(*leaves[:3], return_attn_probs=True, learnable_sink=leaves[3])
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.allclose(lse, sink[None, :, None].expand(2, 4, 5))
    dq, dsink = torch.autograd.grad((out.float() * dout.float()).sum() + (lse * dlse).sum(), (leaves[0], leaves[3]))
    assert torch.equal(dq, torch.zeros_like(dq))
    assert torch.allclose(dsink, dlse.sum(dim=(0, 2)), atol=1e-5)


@pytest.mark.parametrize("device, dtype", DEVICE_DTYPE)
def test_sink_of_minus_infinity_is_no_sink(device, dtype):
    q, k, v, *_ = _inputs((2, 13, 29, 4, 2, 32), dtype, 11, device=device)
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True,
                                  learnable_sink=torch.full((4,), -math.inf, device=device))
    want, want_lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)


VARLEN_DEVICE_DTYPES = [
    pytest.param("cpu", torch.bfloat16, id="cpu-bf16"), pytest.param("cpu", torch.float32, id="cpu-fp32"),
    pytest.param("cuda", torch.bfloat16, id="cuda-bf16", marks=GPU),
    pytest.param("cuda", torch.float16, id="cuda-fp16", marks=GPU),
]


@pytest.mark.parametrize("device, dtype", VARLEN_DEVICE_DTYPES)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sink_varlen(device, dtype, causal):
    """flash_attn_varlen_func with a sink: each sequence matches the reference on its own, and the
    sink's gradient sums over the sequences (lengths 0 and 1 included)."""
    lengths_q, lengths_k = [5, 0, 1, 131, 40], [7, 3, 1, 100, 40]
    heads, heads_k, head_dim = 6, 2, 24
    seed = case_seed("varlen-sink", dtype, causal)
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lengths_q), heads, head_dim, generator=gen).to(dtype)
    k, v = (torch.randn(sum(lengths_k), heads_k, head_dim, generator=gen).to(dtype) for _ in range(2))
    dout = torch.randn(q.shape, generator=gen).to(dtype)
    dlse = torch.randn(heads, sum(lengths_q), generator=gen)
    sink = torch.randn(heads, generator=gen)
    q, k, v, dout, dlse, sink = (t.to(device) for t in (q, k, v, dout, dlse, sink))
    cu_q, cu_k = (_offsets(n).to(device) for n in (lengths_q, lengths_k))
    leaves = [t.detach().requires_grad_() for t in (q, k, v, sink)]
    with poisoned_allocations():
        out, lse, _ = flash_attn_varlen_func(*leaves[:3], cu_q, cu_k, max(lengths_q), max(lengths_k), causal=causal,
                                             return_attn_probs=True, learnable_sink=leaves[3])
        grads = torch.autograd.grad((out.float() * dout.float()).sum() + (lse * dlse).sum(), leaves)
    scale, eps = head_dim**-0.5, grad_eps(head_dim**-0.5, head_dim)
    # The sink's gradient sums over the sequences: so do its yardsticks.
    dsink_ref, dsink_lowp, dsink_inherited = 0.0, 0.0, 0.0
    for b in range(len(lengths_q)):
        rows, keys = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        parts = [t[None] for t in (q[rows], k[keys], v[keys])]
        _assert_forward(out[rows][None].detach(), lse[:, rows][None].detach(), *parts, sink, scale, causal)
        refs, lowps, inherited = _yardsticks(*parts, sink, dout[rows][None], dlse[:, rows][None], scale, causal,
                                             out[rows][None].detach())  # fmt: skip
        for name, grad, part, ref, lowp, from_out in zip(("dq", "dk", "dv"), grads, (rows, keys, keys), refs, lowps,
                                                         inherited):  # fmt: skip
            _assert_within(f"{name} of sequence {b}", grad[part][None], ref, lowp, from_out, dtype, eps)
        dsink_ref, dsink_lowp = dsink_ref + refs[3], dsink_lowp + lowps[3]
        dsink_inherited += inherited[3]
    _assert_within("dsink", grads[3], dsink_ref, dsink_lowp, dsink_inherited, torch.float32, eps)


@pytest.mark.parametrize("device, dtype", DEVICE_DTYPE)
@pytest.mark.parametrize("page", [16, 64], ids=["page16", "page64"])
def test_sink_paged_backward(device, dtype, page):
    """Paged keys and values (block_table) with a sink: the same out and gradients as the packed call
    (on CUDA another kernel: as accurate as the packed call's, against the fp32 CPU result)."""
    lengths = [37, 5, 64]
    heads, heads_k, head_dim = 4, 2, 64
    gen = torch.Generator().manual_seed(case_seed("paged-sink", page))
    q = torch.randn(sum(lengths), heads, head_dim, generator=gen)
    k, v = (torch.randn(sum(lengths), heads_k, head_dim, generator=gen) for _ in range(2))
    sink = torch.randn(heads, generator=gen)
    cu = _offsets(lengths)
    blocks = [-(-n // page) for n in lengths]
    table = torch.zeros(len(lengths), max(blocks), dtype=torch.int32)
    k_pages, v_pages = (torch.zeros(sum(blocks), page, heads_k, head_dim) for _ in range(2))
    next_page = 0
    for b, n in enumerate(lengths):
        for i in range(blocks[b]):
            rows = slice(cu[b] + i * page, min(cu[b] + (i + 1) * page, cu[b + 1]))
            k_pages[next_page, : rows.stop - rows.start] = k[rows]
            v_pages[next_page, : rows.stop - rows.start] = v[rows]
            table[b, i] = next_page
            next_page += 1
    dout = torch.randn(q.shape, generator=gen)

    def run(device: str, dtype: torch.dtype, paged: bool) -> tuple[Tensor, ...]:
        keys, values, block_table = (k_pages, v_pages, table) if paged else (k, v, None)
        tensors = [t.to(device) for t in (q.to(dtype), keys.to(dtype), values.to(dtype), sink)]
        leaves = [t.detach().requires_grad_() for t in tensors]
        cu_d = cu.to(device)
        out = flash_attn_varlen_func(*leaves[:3], cu_d, cu_d, max(lengths), max(lengths), causal=True,
                                     block_table=None if block_table is None else block_table.to(device),
                                     learnable_sink=leaves[3])
        dq, _, _, dsink = torch.autograd.grad((out.float() * dout.to(device)).sum(), leaves)
        return tuple(t.float().cpu() for t in (out, dq, dsink))

    packed, paged = run(device, dtype, False), run(device, dtype, True)
    if device == "cpu":
        for got, want in zip(paged, packed):
            assert max_abs_diff(got, want) <= 1e-5
        return
    accurate = run("cpu", torch.float32, False)
    for name, got, packed_t, want in zip(("out", "dq", "dsink"), paged, packed, accurate):
        bound = 2 * max_abs_diff(packed_t, want) + rounding_floor(want, dtype) + 1e-4
        assert max_abs_diff(got, want) <= bound, f"{name}: paged {max_abs_diff(got, want):.3g} > {bound:.3g}"


@pytest.mark.parametrize("device, dtype", VARLEN_DEVICE_DTYPES)
def test_sink_with_dropout(device, dtype):
    """Dropout drops key columns only: the sink stays in every row's denominator, the LSE is the
    undropped one, and the gradients (the sink's included) match the reference given the same mask."""
    shape = (2, 70, 90, 4, 2, 48)
    seed = case_seed("sink-dropout", dtype)
    q, k, v, dout, sink, dlse, _ = _inputs(shape, dtype, seed, device=device)
    options = {"dropout_p": 0.25, "rng_state": torch.tensor([seed, 11], dtype=torch.int64, device=device)}
    ref_options = reference_options(q, k, options)
    ref_options["dropout_mask"] = ref_options["dropout_mask"].to(device)
    scale = shape[-1] ** -0.5
    leaves = [t.detach().requires_grad_() for t in (q, k, v, sink)]
    with poisoned_allocations():
        out, lse = _flash_attn_forward(*leaves[:3], scale, True, **options, learnable_sink=leaves[3])
    _assert_forward(out.detach(), lse.detach(), q, k, v, sink, scale, True, **ref_options)
    with poisoned_allocations():
        grads = torch.autograd.grad((out.float() * dout.float()).sum() + (lse * dlse).sum(), leaves)
    _assert_grads(grads, q, k, v, sink, dout, dlse, scale, True, out.detach(), **ref_options)


def test_sink_s_dmask():
    """S_dmask keeps FlashAttention-2's encoding with a sink: |entry| * exp(m - lse) is the
    probability, since softmax_lse includes the sink."""
    head_dim, scale = 40, 40**-0.5
    q, k, v, _, sink, _, _ = _inputs((1, 50, 150, 4, 2, head_dim), torch.float32, case_seed("sink-s_dmask"))
    torch.manual_seed(3)
    _, _, s_dmask = flash_attn_func(q, k, v, dropout_p=0.2, causal=True, return_attn_probs=True, learnable_sink=sink)

    def probs(q: Tensor, k: Tensor) -> Tensor:
        _, lse = attention_ref(q, k, v.to(q.dtype), scale, True, learnable_sink=sink)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(2, dim=2)) * scale
        visible = torch.arange(150)[None, :] <= torch.arange(50)[:, None] + 100
        return torch.exp(scores.masked_fill(~visible, -math.inf) - lse.unsqueeze(-1))

    accurate, lowp = probs(q.double(), k.double()), probs(q, k)
    decoded = decode_s_dmask(s_dmask, accurate, head_dim)
    err, bound = max_abs_diff(decoded, accurate), output_bound(max_abs_diff(lowp, accurate))
    assert err <= bound, f"S_dmask decoded: max error {err:.3g} > bound {bound:.3g}"


# ------------------------------------------------------------------------------- differentiable LSE


@pytest.mark.parametrize("device, dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("options", OPTIONS, ids=_id)
@pytest.mark.parametrize("shape", SHAPES[1:], ids=_id)
def test_lse_gradient(shape, options, device, dtype):
    """Gradients through softmax_lse alone and through out and softmax_lse together, without a sink,
    against autograd on the reference. Rows that see no key are cut off (the reference's logsumexp
    of all -inf has a NaN gradient; ours drops dlse there)."""
    causal, window_size, softcap, alibi = options
    q, k, v, dout, _, dlse, slopes = _inputs(shape, dtype, case_seed("lse", shape, options, dtype), alibi, device)
    scale = shape[-1] ** -0.5
    ref_options = {"window_size": window_size, "softcap": softcap, "alibi_slopes": slopes}
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out, lse, _ = flash_attn_func(*leaves, causal=causal, window_size=window_size, softcap=softcap,
                                  alibi_slopes=slopes, return_attn_probs=True)
    visible = lse.detach().isfinite()
    dlse = dlse.masked_fill(~visible, 0.0)
    accurate = [t.detach().to(_accurate(dtype)).requires_grad_() for t in (q, k, v)]
    for use_out in (False, True):
        loss = (lse * dlse).sum() + ((out.float() * dout.float()).sum() if use_out else 0.0)
        with poisoned_allocations():
            grads = torch.autograd.grad(loss, leaves, retain_graph=True, allow_unused=True)
        refs = []
        for tensors, upcast in ((accurate, True), (leaves, False)):
            out_r, lse_r = attention_ref(*tensors, scale, causal, upcast=upcast, **ref_options)
            lse_r = torch.where(visible, lse_r, 0.0)
            loss_r = (lse_r * dlse.to(lse_r.dtype)).sum()
            if use_out:
                loss_r = loss_r + (out_r * dout.to(out_r.dtype)).sum()
            refs.append(torch.autograd.grad(loss_r, tensors, allow_unused=True))
        no_sink = torch.full((shape[3],), -math.inf, device=device)
        slack = _inherited_errors(q, k, v, no_sink, dout, out.detach(), scale, causal,
                                  **ref_options)[:2] if use_out else (0.0, 0.0)  # fmt: skip
        for name, grad, ref, lowp, from_out, t in zip(("dq", "dk", "dv"), grads, *refs, (*slack, 0.0), (q, k, v)):
            if ref is None:  # the LSE alone does not depend on v
                assert grad is None or not grad.any(), name
                continue
            err = max_abs_diff(grad, ref)
            bound = grad_bound(max_abs_diff(lowp, ref), rounding_floor(ref, t.dtype), from_out,
                               grad_eps(scale, shape[-1]))
            assert err <= bound, f"{name} (use_out={use_out}): max error {err:.3g} > bound {bound:.3g}"


def test_lse_gradient_varlen():
    """softmax_lse of flash_attn_varlen_func ((nheads, total_q)) is differentiable too."""
    lengths = [3, 0, 50, 17]
    gen = torch.Generator().manual_seed(case_seed("lse-varlen"))
    q, k, v = (torch.randn(sum(lengths), 4, 20, generator=gen) for _ in range(3))
    dlse = torch.randn(4, sum(lengths), generator=gen)
    cu = _offsets(lengths)
    leaves = [t.detach().requires_grad_() for t in (q, k)]
    _, lse, _ = flash_attn_varlen_func(leaves[0], leaves[1], v, cu, cu, 50, 50, causal=True, return_attn_probs=True)
    dq, dk = torch.autograd.grad((lse * dlse).sum(), leaves)
    for b in range(len(lengths)):
        rows = slice(cu[b], cu[b + 1])
        parts = [t[rows][None].double().requires_grad_() for t in (q, k)]
        _, lse_r = attention_ref(parts[0], parts[1], v[rows][None].double(), 20**-0.5, True)
        want = torch.autograd.grad((lse_r * dlse[:, rows][None].double()).sum(), parts)
        assert max_abs_diff(dq[rows][None], want[0]) <= 1e-4
        assert max_abs_diff(dk[rows][None], want[1]) <= 1e-4


# ------------------------------------------------------------------------- flash_attn_combine, rings


RING_DEVICE_DTYPES = [pytest.param("cpu", torch.float32, id="cpu-fp32"),
                      pytest.param("cuda", torch.bfloat16, id="cuda-bf16", marks=GPU),
                      pytest.param("cuda", torch.float16, id="cuda-fp16", marks=GPU)]  # fmt: skip


def _ring(q: Tensor, k: Tensor, v: Tensor, chunks: list[int], dout: Tensor) -> tuple[Tensor, ...]:
    """Ring attention over chunks of the keys: flash_attn_func(return_attn_probs=True) per chunk,
    flash_attn_combine of the chunks, then the gradients of sum(out * dout) through both."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    outs, lses = [], []
    for k_chunk, v_chunk in zip(leaves[1].split(chunks, dim=1), leaves[2].split(chunks, dim=1)):
        out_c, lse_c, _ = flash_attn_func(leaves[0], k_chunk, v_chunk, return_attn_probs=True)
        outs.append(out_c.float())
        lses.append(lse_c.transpose(1, 2))  # (batch, seqlen, nheads), a strided view
    with poisoned_allocations():
        out, lse = flash_attn_combine(torch.stack(outs), torch.stack(lses))
        grads = torch.autograd.grad((out * dout.float()).sum(), leaves)
    return out.detach(), lse.detach(), *grads


@pytest.mark.parametrize("device, dtype", RING_DEVICE_DTYPES)
@pytest.mark.parametrize("chunks", [[100], [1, 99], [33, 33, 34], [7, 0, 50, 43]], ids=_id)
@pytest.mark.parametrize("heads", [(4, 4), (6, 2), (3, 1)], ids=_id)
def test_ring_attention(chunks, heads, device, dtype):
    """Ring attention over chunks of the keys, built from flash_attn_func(return_attn_probs=True) and
    flash_attn_combine, matches full attention, forward and backward (through the differentiable LSE).
    A chunk of no key has lse -inf and weighs nothing. In fp32 the yardstick is PyTorch's fp32
    attention; in fp16/bf16 it is the same ring on the CPU path (each chunk's out rounded to the
    dtype too, which full attention does not have)."""
    num_heads, num_heads_k = heads
    batch, seqlen_q, head_dim = 2, 29, 40
    seed = case_seed("ring", chunks, heads)
    q, k, v = random_qkv(batch, seqlen_q, sum(chunks), num_heads, num_heads_k, head_dim, torch.float32, "cpu", seed)
    q, k, v = (t.to(dtype) for t in (q, k, v))
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 1))
    out, lse, *grads = _ring(*(t.to(device) for t in (q, k, v)), chunks, dout.to(device))
    scale = head_dim**-0.5
    accurate = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out_ref, lse_ref = attention_ref(*accurate, scale, False)
    refs = torch.autograd.grad((out_ref * dout.double()).sum(), accurate)
    if dtype == torch.float32:
        out_lowp, lse_lowp = attention_ref(q, k, v, scale, False)
        lowps = [t.detach().requires_grad_() for t in (q, k, v)]
        lowp_grads = torch.autograd.grad((attention_ref(*lowps, scale, False)[0] * dout).sum(), lowps)
    else:
        out_lowp, lse_lowp, *lowp_grads = _ring(q, k, v, chunks, dout)
        lse_lowp = lse_lowp.transpose(1, 2)
    out, lse, grads = out.cpu(), lse.cpu(), [g.cpu() for g in grads]
    assert max_abs_diff(out, out_ref) <= output_bound(max_abs_diff(out_lowp, out_ref), rounding_floor(out_ref, dtype))
    assert max_abs_diff(lse.transpose(1, 2), lse_ref) <= output_bound(max_abs_diff(lse_lowp, lse_ref), eps=LSE_EPS)
    for name, grad, ref, lowp in zip(("dq", "dk", "dv"), grads, refs, lowp_grads):
        bound = grad_bound(max_abs_diff(lowp, ref), rounding_floor(ref, dtype), eps=grad_eps(scale, head_dim))
        err = max_abs_diff(grad, ref)
        assert err <= bound, f"{name}: max error {err:.3g} > bound {bound:.3g}"


def _combine_inputs(splits: int, shape: tuple, seed: int, device: str,
                    layout: str = "contiguous") -> tuple[Tensor, Tensor]:
    """out_partial (splits, *shape) and lse_partial (splits, *shape[:-1]), fp32, fresh, with -inf
    partials: one split that saw no key of some rows, and one row that no split saw. layout
    "strided": out_partial a slice of a wider tensor (rows not 16-byte aligned apart), lse_partial a
    transposed view, as flashattn's softmax_lse is."""
    gen = torch.Generator().manual_seed(seed)
    batch, seqlen, heads, head_dim = shape
    if layout == "strided":
        out_partial = torch.randn(splits, batch, seqlen, heads, head_dim + 3, generator=gen)[..., 1 : head_dim + 1]
        lse_partial = (torch.randn(splits, batch, heads, seqlen, generator=gen) * 3).transpose(2, 3)
    else:
        out_partial = torch.randn(splits, batch, seqlen, heads, head_dim, generator=gen)
        lse_partial = torch.randn(splits, batch, seqlen, heads, generator=gen) * 3
    if splits > 1 and seqlen > 2:
        lse_partial[1, 0, 2] = -math.inf  # one split saw no key of these rows
    lse_partial[:, -1, -1, -1] = -math.inf  # no split saw a key of this row
    return out_partial.to(device), lse_partial.to(device)


def _combine_want(out_partial: Tensor, lse_partial: Tensor) -> tuple[Tensor, Tensor]:
    """FlashAttention-3's combine in float64."""
    out_partial, lse_partial = out_partial.double(), lse_partial.double()
    want_lse = torch.logsumexp(lse_partial, dim=0)
    finite = want_lse.isfinite()
    weights = torch.exp(lse_partial - torch.where(finite, want_lse, 0.0)).nan_to_num(0.0)
    return (weights.unsqueeze(-1) * out_partial).sum(0), want_lse


COMBINE_CASES = [(3, (2, 5, 4, 7), "contiguous"), (3, (2, 5, 4, 8), "contiguous"), (1, (1, 3, 2, 128), "contiguous"),
                 (8, (1, 33, 3, 128), "contiguous"), (37, (2, 3, 2, 256), "contiguous"),
                 (5, (1, 7, 3, 200), "contiguous"),  # a last column pass of 18 lanes
                 (4, (2, 6, 3, 64), "strided"), (2, (1, 4, 5, 17), "strided")]  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", COMBINE_CASES, ids=_id)
def test_combine_semantics(case, device):
    """FlashAttention-3's: out = sum_s exp(lse_s - lse) out_s, lse = logsumexp_s lse_s; all splits
    empty: out 0, lse -inf; out= is written and returned; out_dtype casts. Head dims that take 16-byte
    loads and those that do not, strided views, more splits than a warp has lanes (CUDA)."""
    splits, shape, layout = case
    out_partial, lse_partial = _combine_inputs(splits, shape, case_seed("combine", case), device, layout)
    with poisoned_allocations():
        out, lse = flash_attn_combine(out_partial, lse_partial)
    want, want_lse = _combine_want(out_partial, lse_partial)
    finite = want_lse.isfinite()
    assert out.dtype == torch.float32 and out.shape == shape and lse.shape == shape[:-1]
    assert max_abs_diff(out, want) <= 1e-5 and torch.equal(out[-1, -1, -1], torch.zeros_like(out[-1, -1, -1]))
    assert max_abs_diff(lse[finite], want_lse[finite]) <= 1e-5 and lse[-1, -1, -1] == -math.inf
    for dtype in (torch.bfloat16, torch.float16):
        target = torch.full(shape, math.nan, dtype=dtype, device=device)
        written, _ = flash_attn_combine(out_partial, lse_partial, out=target, out_dtype=dtype)
        assert written is target
        # One rounding to the dtype: at most one unit in its last place apart from the float64 result.
        assert max_abs_diff(target, want) <= rounding_floor(want, dtype)
        assert flash_attn_combine(out_partial, lse_partial, out_dtype=dtype)[0].dtype == dtype


@pytest.mark.parametrize("device", DEVICES)
def test_combine_gradient(device):
    """combine's backward (PyTorch operations on either device) gives the gradients that autograd
    takes through flashattn.cpu.combine's arithmetic, through out and through the LSE."""
    out_partial, lse_partial = _combine_inputs(4, (2, 6, 3, 24), case_seed("combine-grad"), "cpu")
    gen = torch.Generator().manual_seed(5)
    dout, dlse = torch.randn(2, 6, 3, 24, generator=gen), torch.randn(2, 6, 3, generator=gen)
    leaves = [t.double().requires_grad_() for t in (out_partial, lse_partial)]
    out_ref, lse_ref = cpu.combine(*leaves)
    finite = lse_ref.detach().isfinite()
    want = torch.autograd.grad((out_ref * dout.double()).sum() + (lse_ref[finite] * dlse.double()[finite]).sum(),
                               leaves)  # fmt: skip
    ours = [t.to(device).requires_grad_() for t in (out_partial, lse_partial)]
    out, lse = flash_attn_combine(*ours)
    dout, dlse, finite = (t.to(device) for t in (dout, dlse, finite))
    got = torch.autograd.grad((out * dout).sum() + (lse[finite] * dlse[finite]).sum(), ours)
    for name, g, w in zip(("d out_partial", "d lse_partial"), got, want):
        assert max_abs_diff(g.cpu(), w) <= 1e-5, name


@pytest.mark.parametrize("device", DEVICES)
def test_combine_gradient_of_empty_rows_is_not_nan(device):
    lse_partial = torch.full((2, 1, 3, 2), -math.inf, device=device).requires_grad_()
    out_partial = torch.randn(2, 1, 3, 2, 5, device=device, requires_grad=True)
    out, lse = flash_attn_combine(out_partial, lse_partial)
    grads = torch.autograd.grad(out.sum() + lse.clamp(min=-1e9).sum(), (out_partial, lse_partial))
    assert not any(g.isnan().any() for g in grads)


# ------------------------------------------------------------------------------------ KV cache


KVCACHE_CASES = [
    # (batch, seqlen_q, cache_len, heads, heads_k, head_dim, num_splits, paged, causal)
    (3, 1, 300, 8, 2, 64, 1, False, True),  # decoding, GQA packed, one split
    (3, 1, 300, 8, 2, 64, 4, False, True),  # decoding, the splits merged by the last one
    (2, 1, 517, 4, 4, 128, 3, True, False),  # decoding, paged
    (2, 3, 200, 6, 3, 96, 2, False, True),  # a few rows (speculative decoding), split
    (2, 40, 260, 4, 1, 64, 1, False, True),  # the tiled forward
    (2, 40, 700, 4, 2, 128, 3, True, True),  # the tiled forward, split, paged: the merge kernel
    (1, 1, 33, 40, 1, 64, 2, False, False),  # a GQA group of 40 rows: the tiled forward, packed
]


@pytest.mark.parametrize("device, dtype", DEVICE_DTYPE)
@pytest.mark.parametrize("case", KVCACHE_CASES, ids=_id)
def test_sink_kvcache(case, device, dtype):
    """flash_attn_with_kvcache with a sink (decoding, a few rows, the tiled forward; GQA packing,
    split-KV merged by the decoding kernel or the merge kernel, paged caches) against the reference
    over each sequence's cached keys: the sink joins each row once, however many splits."""
    batch, seqlen_q, cache_len, heads, heads_k, head_dim, num_splits, paged, causal = case
    gen = torch.Generator().manual_seed(case_seed("kvcache-sink", case))
    q = torch.randn(batch, seqlen_q, heads, head_dim, generator=gen).to(dtype)
    k, v = (torch.randn(batch, cache_len, heads_k, head_dim, generator=gen).to(dtype) for _ in range(2))
    sink = torch.randn(heads, generator=gen) * 2
    lengths = torch.randint(seqlen_q, cache_len + 1, (batch,), generator=gen, dtype=torch.int32)
    if paged:
        page = 16
        pages_per_seq = -(-cache_len // page)
        order = torch.randperm(batch * pages_per_seq, generator=gen)
        block_table = order.reshape(batch, pages_per_seq).to(torch.int32)
        k_cache, v_cache = (torch.zeros(batch * pages_per_seq, page, heads_k, head_dim, dtype=dtype) for _ in range(2))
        for t, cache in ((k, k_cache), (v, v_cache)):
            padded = torch.zeros(batch, pages_per_seq * page, heads_k, head_dim, dtype=dtype)
            padded[:, :cache_len] = t
            cache[block_table.flatten().long()] = padded.reshape(batch * pages_per_seq, page, heads_k, head_dim)
    else:
        block_table, k_cache, v_cache = None, k, v
    tensors = [None if t is None else t.to(device) for t in (q, k_cache, v_cache, lengths, block_table, sink)]
    with poisoned_allocations():
        out, lse = flash_attn_with_kvcache(tensors[0], tensors[1], tensors[2], cache_seqlens=tensors[3],
                                           block_table=tensors[4], causal=causal, num_splits=num_splits,
                                           return_softmax_lse=True, learnable_sink=tensors[5])  # fmt: skip
    scale = head_dim**-0.5
    for b in range(batch):
        n = int(lengths[b])
        parts = [t[b : b + 1].to(device) for t in (q, k[:, :n], v[:, :n])]
        out_b, lse_b = out[b : b + 1], lse[b : b + 1]
        _assert_forward(out_b, lse_b, *parts, sink.to(device), scale, causal)


# ------------------------------------------------------------------------- reproducibility, families


@pytest.mark.gpu
@pytest.mark.parametrize("varlen", [False, True], ids=["padded", "varlen"])
def test_sink_deterministic_is_bitwise_repeatable(varlen):
    """deterministic=True with a sink and a gradient through the LSE: out, lse, dq, dk, dv and dsink
    bitwise the same over repeats (dsink is summed in a fixed order on every path)."""
    q, k, v, dout, sink, dlse, _ = _inputs((2, 300, 333, 8, 2, 64), torch.bfloat16, case_seed("det-sink"),
                                           device="cuda")
    cu = None
    if varlen:
        q, k, v, dout = (t.flatten(0, 1) for t in (q, k, v, dout))
        cu_q, cu_k = _offsets([300, 300]).cuda(), _offsets([333, 333]).cuda()
        dlse = dlse.transpose(0, 1).flatten(1)  # (nheads, total_q)
        cu = (cu_q, cu_k)
    results = []
    for _ in range(5):
        leaves = [t.detach().requires_grad_() for t in (q, k, v, sink)]
        if cu is None:
            out, lse, _ = flash_attn_func(*leaves[:3], causal=True, window_size=(100, -1), deterministic=True,
                                          return_attn_probs=True, learnable_sink=leaves[3])  # fmt: skip
        else:
            out, lse, _ = flash_attn_varlen_func(*leaves[:3], *cu, 300, 333, causal=True, deterministic=True,
                                                 return_attn_probs=True, learnable_sink=leaves[3])  # fmt: skip
        grads = torch.autograd.grad((out.float() * dout.float()).sum() + (lse * dlse).sum(), leaves)
        results.append((out, lse, *grads))
    for run in results[1:]:
        for name, got, want in zip(("out", "lse", "dq", "dk", "dv", "dsink"), run, results[0]):
            assert torch.equal(got, want), name


@pytest.mark.gpu
def test_sink_runs_the_family_kernels():
    """A call with a sink and a gradient through the LSE runs the family's own forward and backward
    kernels (sm90's on a 9.x GPU by default, sm80's under FLASHATTN_FAMILY=sm80), the sink's gradient
    in the shared preprocess's passes; none falls back for the sink."""
    family = flashattn.kernel_family()
    q, k, v, dout, sink, dlse, _ = _inputs((2, 300, 300, 4, 4, 64), torch.bfloat16, 3, device="cuda")
    leaves = [t.detach().requires_grad_() for t in (q, k, v, sink)]

    def step() -> None:
        out, lse, _ = flash_attn_func(*leaves[:3], causal=True, return_attn_probs=True, learnable_sink=leaves[3])
        torch.autograd.grad((out.float() * dout.float()).sum() + (lse * dlse).sum(), leaves)

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and "flash::" in e.name]
    main_bwd = "flash::sm90::bwd_kernel" if family == "sm90" else "flash::sm80::bwd_dk_dv_kernel"
    assert any(f"flash::{family}::fwd_kernel" in name for name in names), names
    assert any(main_bwd in name for name in names), names
    assert any("dsink_partial_kernel" in name for name in names), names


# ----------------------------------------------------------------------------------------- errors


def _bad_sink(case: str, device: str) -> tuple[object, type]:
    """(a bad learnable_sink for q of 4 heads on `device`, the error it must raise)."""
    if case == "device":
        return torch.zeros(4, device="meta" if device == "cpu" else "cpu"), RuntimeError
    if case == "list":
        return [0.0] * 4, TypeError
    sink, error = {"length": (torch.zeros(5), ValueError), "rank": (torch.zeros(1, 4), ValueError),
                   "dtype": (torch.zeros(4, dtype=torch.float16), TypeError)}[case]  # fmt: skip
    return sink.to(device), error


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["length", "rank", "dtype", "device", "list"])
def test_bad_learnable_sink(device, case):
    """A sink of the wrong shape, dtype or device: the error names learnable_sink, from every function
    that takes one (on CUDA the binding's, with flashattn.cpu's messages)."""
    sink, error = _bad_sink(case, device)
    dtype = torch.float32 if device == "cpu" else torch.float16
    q, k, v = random_qkv(1, 6, 6, 4, 2, 16, dtype, device, 0)
    with pytest.raises(error, match="learnable_sink"):
        flash_attn_func(q, k, v, learnable_sink=sink)
    cu = torch.tensor([0, 6], dtype=torch.int32, device=device)
    with pytest.raises(error, match="learnable_sink"):
        flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 6, 6, learnable_sink=sink)
    with pytest.raises(error, match="learnable_sink"):
        flash_attn_with_kvcache(q, k, v, learnable_sink=sink)


def test_learnable_sink_is_keyword_only():
    q, k, v = random_qkv(1, 6, 6, 4, 2, 16, torch.float32, "cpu", 0)
    with pytest.raises(TypeError):
        flash_attn_func(q, k, v, 0.0, None, False, (-1, -1), 0.0, None, False, False, torch.zeros(4))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "kwargs, error, name",
    [
        ({"out_partial": torch.zeros(2, 1, 3, 2)}, ValueError, "out_partial"),
        ({"lse_partial": torch.zeros(2, 1, 2, 3)}, ValueError, "lse_partial"),
        ({"out_partial": torch.zeros(2, 1, 3, 2, 4, dtype=torch.bfloat16)}, TypeError, "out_partial"),
        ({"lse_partial": torch.zeros(2, 1, 3, 2, dtype=torch.float64)}, TypeError, "lse_partial"),
        ({"out_dtype": torch.int32}, TypeError, "out_dtype"),
        ({"out": torch.zeros(1, 3, 2, 5)}, ValueError, "out"),
        ({"out_partial": torch.zeros(0, 1, 3, 2, 4), "lse_partial": torch.zeros(0, 1, 3, 2)}, ValueError, "num_splits"),
    ],
    ids=["out_partial-rank", "lse-shape", "out_partial-dtype", "lse-dtype", "out_dtype", "out-shape", "no-split"],
)
def test_bad_combine_inputs(kwargs, error, name, device):
    arguments = {"out_partial": torch.zeros(2, 1, 3, 2, 4), "lse_partial": torch.zeros(2, 1, 3, 2), **kwargs}
    arguments = {key: t.to(device) if isinstance(t, Tensor) else t for key, t in arguments.items()}
    with pytest.raises(error, match=name):
        flash_attn_combine(**arguments)


@pytest.mark.gpu
def test_combine_needs_a_contiguous_last_dimension_on_cuda():
    out_partial = torch.zeros(2, 1, 3, 4, 2, device="cuda").transpose(-1, -2)
    with pytest.raises(ValueError, match="out_partial"):
        flash_attn_combine(out_partial, torch.zeros(2, 1, 3, 2, device="cuda"))


@pytest.mark.parametrize("device", DEVICES)
def test_bad_dlse(device):
    """The backward's dlse (the LSE's gradient) of the wrong shape: the error names dlse."""
    dtype = torch.float32 if device == "cpu" else torch.float16
    q, k, v = random_qkv(1, 6, 6, 4, 2, 16, dtype, device, 0)
    out, lse = torch.ops.flashattn.fwd(q, k, v, 0.25, False)
    with pytest.raises(RuntimeError, match="dlse"):
        torch.ops.flashattn.bwd(out, q, k, v, out, lse, 0.25, False, False, dlse=lse[:, :, :3].contiguous())


OPCHECK_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_sink_and_combine(device):
    """fwd with a sink, bwd with a sink and dlse, and combine: schemas, fakes and autograd
    registration as torch.library checks them."""
    dtype = torch.float32 if device == "cpu" else torch.float16
    q, k, v = (t.requires_grad_() for t in random_qkv(2, 9, 13, 4, 2, 16, dtype, device, 3))
    sink = torch.randn(4, device=device, requires_grad=True)
    args = (q, k, v, 0.25, True, False, -1, -1, 0.0, None, 0.0, None, None, None, 0, 0, None, None, None, None, sink)
    results = torch.library.opcheck(torch.ops.flashattn.fwd.default, args, test_utils=OPCHECK_UTILS)
    assert results == dict.fromkeys(OPCHECK_UTILS, "SUCCESS")
    out, lse = torch.ops.flashattn.fwd(*(t.detach() if isinstance(t, Tensor) else t for t in args))
    bwd_args = (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out, lse, 0.25, True, False, -1, -1, 0.0,
                None, 0.0, None, None, None, 0, 0, None, None, None, sink.detach(), torch.randn_like(lse))
    results = torch.library.opcheck(torch.ops.flashattn.bwd.default, bwd_args, test_utils=OPCHECK_UTILS)
    assert results == dict.fromkeys(OPCHECK_UTILS, "SUCCESS")
    out_partial, lse_partial = _combine_inputs(3, (2, 5, 4, 8), 9, device)
    combine_args = (out_partial.requires_grad_(), lse_partial.requires_grad_(), torch.bfloat16)
    results = torch.library.opcheck(torch.ops.flashattn.combine.default, combine_args, test_utils=OPCHECK_UTILS)
    assert results == dict.fromkeys(OPCHECK_UTILS, "SUCCESS")
