"""Property-based: hypothesis draws inputs within what flashattn supports, and the forward
and backward must match the reference within the bounds of tests/helpers.py.

Drawn: batch, Sq, Sk, nheads_k and the GQA group size, head dims 1 to 512 (most of them not
multiples of 8), the dtype, causal, deterministic, softmax_scale (or the default), the
public function (flash_attn_func on four memory layouts, or a packed variant). The CPU test
runs a few examples in CI; the GPU test many more on longer sequences.
FLASHATTN_HYPOTHESIS_EXAMPLES=N runs N examples in each instead, e.g. for a long soak.
A failure prints the shrunk case and a @reproduce_failure blob that replays it.
"""

import os
from dataclasses import astuple, dataclass

import pytest
import torch
from helpers import (
    assert_grads_match_reference,
    assert_matches_reference,
    case_seed,
    poisoned_allocations,
    random_qkv,
    run_forward,
)

from flashattn import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func
from flashattn.cpu import MAX_HEAD_DIM

hypothesis = pytest.importorskip(
    "hypothesis", reason="hypothesis is not installed (pip install hypothesis; scripts/env.sh installs it in .venv)"
)
st = hypothesis.strategies

CPU_EXAMPLES = 12
GPU_EXAMPLES = 300
_EXAMPLES_OVERRIDE = os.environ.get("FLASHATTN_HYPOTHESIS_EXAMPLES")


def _settings(examples: int) -> "hypothesis.settings":
    return hypothesis.settings(
        max_examples=int(_EXAMPLES_OVERRIDE or examples),
        deadline=None,  # the first GPU example loads kernels; a slow example is no failure
        database=None,  # nothing written into the repository
        print_blob=True,
        suppress_health_check=[hypothesis.HealthCheck.too_slow],
    )


@dataclass(frozen=True)
class Case:
    variant: str  # "func", "qkvpacked" or "kvpacked"
    layout: str  # random_qkv's layout, for variant "func"
    batch: int
    seqlen_q: int
    seqlen_k: int
    num_heads: int
    num_heads_k: int
    head_dim: int
    dtype: torch.dtype
    causal: bool
    deterministic: bool
    softmax_scale: float | None


@st.composite
def cases(draw, dtypes: list[torch.dtype], max_batch: int, max_seqlen: int, max_heads_k: int) -> Case:
    variant = draw(st.sampled_from(["func", "qkvpacked", "kvpacked"]))
    num_heads_k = draw(st.integers(1, max_heads_k))
    seqlen_q = draw(st.integers(1, max_seqlen))
    packed_qkv = variant == "qkvpacked"  # one tensor: Sq = Sk and H = Hk
    return Case(
        variant=variant,
        layout=draw(st.sampled_from(["contiguous", "packed", "transposed", "offset"])) if variant == "func" else "",
        batch=draw(st.integers(1, max_batch)),
        seqlen_q=seqlen_q,
        seqlen_k=seqlen_q if packed_qkv else draw(st.integers(1, max_seqlen)),
        num_heads=num_heads_k * (1 if packed_qkv else draw(st.integers(1, 4))),
        num_heads_k=num_heads_k,
        head_dim=draw(st.integers(1, MAX_HEAD_DIM)),
        dtype=draw(st.sampled_from(dtypes)),
        causal=draw(st.booleans()),
        deterministic=draw(st.booleans()),
        softmax_scale=draw(st.none() | st.floats(0.05, 2.0)),
    )


def _check(case: Case, device: str) -> None:
    """The public function of the case against the reference: out and LSE (the operator
    underneath), and the gradients of its inputs, unpacked into dq, dk, dv."""
    seed = case_seed(astuple(case), device)
    gen = torch.Generator(device).manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, dtype=case.dtype, device=device)

    batch, seqlen_q, seqlen_k, heads, heads_k, head_dim = (
        case.batch, case.seqlen_q, case.seqlen_k, case.num_heads, case.num_heads_k, case.head_dim
    )
    if case.variant == "func":
        q, k, v = random_qkv(batch, seqlen_q, seqlen_k, heads, heads_k, head_dim, case.dtype, device, seed, case.layout)
        leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
        attend = flash_attn_func
    elif case.variant == "qkvpacked":
        leaves = (randn(batch, seqlen_q, 3, heads, head_dim).requires_grad_(),)
        q, k, v = leaves[0].detach().unbind(dim=2)
        attend = flash_attn_qkvpacked_func
    else:
        leaves = (randn(batch, seqlen_q, heads, head_dim).requires_grad_(),
                  randn(batch, seqlen_k, 2, heads_k, head_dim).requires_grad_())
        q, (k, v) = leaves[0].detach(), leaves[1].detach().unbind(dim=2)
        attend = flash_attn_kvpacked_func
    scale = head_dim**-0.5 if case.softmax_scale is None else case.softmax_scale

    out, lse = run_forward(q, k, v, scale, case.causal)
    assert_matches_reference(out, lse, q, k, v, scale, case.causal)

    dout = randn(*out.shape)
    public_out = attend(*leaves, softmax_scale=case.softmax_scale, causal=case.causal, deterministic=case.deterministic)
    assert torch.equal(public_out, out), f"{case.variant} differs from the operator on its slices"
    with poisoned_allocations():
        grads = torch.autograd.grad(public_out, leaves, dout)
    if case.variant == "qkvpacked":
        grads = grads[0].unbind(dim=2)
    elif case.variant == "kvpacked":
        grads = (grads[0], *grads[1].unbind(dim=2))
    assert_grads_match_reference(grads, q, k, v, dout, scale, case.causal)


@_settings(CPU_EXAMPLES)
@hypothesis.given(
    case=cases([torch.float16, torch.bfloat16, torch.float32], max_batch=2, max_seqlen=150, max_heads_k=3)
)
def test_matches_reference_cpu(case):
    _check(case, "cpu")


@pytest.mark.gpu
@_settings(GPU_EXAMPLES)
@hypothesis.given(case=cases([torch.float16, torch.bfloat16], max_batch=3, max_seqlen=700, max_heads_k=4))
def test_matches_reference_gpu(case):
    _check(case, "cuda")


@pytest.mark.gpu
def test_deterministic_dq_of_a_single_query_over_497_keys():
    """The case hypothesis found on the H100 (2026-11-24), pinned: the sm80 deterministic dQ kernel's
    error, 0.000997, exceeded the bound of 0.000376 where the atomic path passed. It passes since the
    gradients' bound admits the rounding of P and dS to 16 bits (flashattn.testing.
    grads_rounding_floors): one query's dQ sums 497 rounded dS K terms in the deterministic path's
    order. Its strict xfail turned into an XPASS on the H200 (benchmarks/NOTES.md, round 21)."""
    _check(Case(variant="func", layout="contiguous", batch=1, seqlen_q=1, seqlen_k=497, num_heads=1, num_heads_k=1,
                head_dim=1, dtype=torch.float16, causal=True, deterministic=True,
                softmax_scale=1.774396277632115), "cuda")
