"""flashattn.nn against torch: the MultiheadAttention drop-in, the converter, MHA and RotaryEmbedding.

Outputs follow the project's bound (tests/helpers.py): our error against an accurate
reference is at most twice (for gradients three times) the error of PyTorch doing the
same math naively in the same dtype, plus a small epsilon: 1e-6 in fp32 (1e-5 for
gradients), a few ulps of the outputs. The accurate reference is the same torch module
and inputs upcast to float64; the yardstick is torch's need_weights=True path, which
forms scores, softmax and products explicitly (NaiveMultiheadAttention).

Every test here fails on a FallbackWarning it does not expect: a call meant for
flashattn's kernels that silently ran torch's path is a failure.
"""

import contextlib
import copy
import math
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import torch
from helpers import GRAD_EPS, GRAD_FACTOR, OUT_EPS, case_seed, max_abs_diff
from torch import Tensor, nn

import flashattn.nn as fnn
from flashattn.kvcache import KVCache
from flashattn.nn import MHA, FallbackWarning, MultiheadAttention, RotaryEmbedding, convert_multihead_attention
from flashattn.reference import attention_ref

pytestmark = pytest.mark.filterwarnings("error::flashattn.nn.FallbackWarning")

EMBED_DIM = 30
NUM_HEADS = 3  # head dim 10: not a multiple of 8, so the CUDA path pads it
BATCH = 3

gpu = pytest.mark.gpu
DEVICE_DTYPES = [
    pytest.param("cpu", torch.float32, id="cpu-fp32"),
    pytest.param("cpu", torch.bfloat16, id="cpu-bf16"),
    pytest.param("cuda", torch.float16, id="cuda-fp16", marks=gpu),
    pytest.param("cuda", torch.bfloat16, id="cuda-bf16", marks=gpu),
]
FP32_OUT_EPS = 1e-6
FP32_GRAD_EPS = 1e-5


# --------------------------------------------------------------------------- helpers


@pytest.fixture(autouse=True)
def _fresh_fallback_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees every fallback reason warned anew."""
    monkeypatch.setattr(fnn, "_warned_reasons", set())


@pytest.fixture
def flash_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[int, ...]]]:
    """(function, q shape) of the flash_attn_func and flash_attn_varlen_func calls flashattn.nn makes."""
    calls = []
    for name in ("flash_attn_func", "flash_attn_varlen_func"):
        real = getattr(fnn, name)

        def counting(q: Tensor, *args: object, _real=real, _name=name, **kwargs: object) -> Tensor:
            calls.append((_name, tuple(q.shape)))
            return _real(q, *args, **kwargs)

        monkeypatch.setattr(fnn, name, counting)
    return calls


def assert_within_bound(ours: Tensor, lowp: Tensor, accurate: Tensor, what: str, grad: bool = False) -> None:
    """max|ours - accurate| <= factor * max|lowp - accurate| + eps, with no NaN."""
    assert ours.shape == accurate.shape, (what, ours.shape, accurate.shape)
    assert ours.dtype == lowp.dtype, (what, ours.dtype, lowp.dtype)
    assert not ours.isnan().any(), f"{what} has NaN"
    if ours.dtype == torch.float32:
        eps = FP32_GRAD_EPS if grad else FP32_OUT_EPS
    else:
        eps = GRAD_EPS if grad else OUT_EPS
    err = max_abs_diff(ours, accurate)
    bound = (GRAD_FACTOR if grad else 2) * max_abs_diff(lowp, accurate) + eps
    assert err <= bound, f"{what}: max error {err:.3g} > bound {bound:.3g}"


def randomized(module: nn.Module) -> nn.Module:
    """module with every parameter redrawn (torch starts biases at 0, which would hide bias bugs)."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * p.shape[-1] ** -0.5)
    return module


def upcaster() -> Callable[[Tensor | None], Tensor | None]:
    """Casts tensors to float64 (bool ones stay bool), the same tensor to the same copy: self-attention
    inputs stay one tensor, which decides torch's path and ours."""
    copies: dict[int, Tensor] = {}

    def upcast(t: Tensor | None) -> Tensor | None:
        if t is None or t.dtype == torch.bool:
            return t
        return copies.setdefault(id(t), t.double())

    return upcast


class NaiveMultiheadAttention(nn.MultiheadAttention):
    """torch's MultiheadAttention held on its need_weights=True path (whatever need_weights says), which forms
    the scores, the softmax and the products explicitly in the module's dtype: "PyTorch doing the same math in
    the same precision", the yardstick of the error bound. Its SDPA path would not do: it is a fused kernel
    with fp32 accumulation, as accurate as ours, so twice its error is a coin toss in bf16."""

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, None]:
        out, _ = super().forward(query, key, value, key_padding_mask, True, attn_mask, average_attn_weights, is_causal)
        return out, None


def naive(module: nn.Module) -> nn.Module:
    """A copy of module whose torch.nn.MultiheadAttentions compute the naive way."""
    copied = copy.deepcopy(module)
    for m in copied.modules():
        if type(m) is nn.MultiheadAttention:
            m.__class__ = NaiveMultiheadAttention
    return copied


@dataclass
class Versions:
    """One torch.nn.MultiheadAttention's weights in the modules a test compares."""

    ours: MultiheadAttention
    torch_mha: nn.MultiheadAttention  # the same weights and dtype
    naive: NaiveMultiheadAttention  # the same, computing the naive way: the yardstick
    accurate: nn.MultiheadAttention  # the same weights in float64

    @classmethod
    def make(cls, device: str, dtype: torch.dtype, seed: int, **kwargs: object) -> "Versions":
        torch.manual_seed(seed)
        factory = {"device": device, "dtype": dtype}
        reference = randomized(nn.MultiheadAttention(EMBED_DIM, NUM_HEADS, **factory, **kwargs))
        ours = MultiheadAttention(EMBED_DIM, NUM_HEADS, **factory, **kwargs)
        ours.load_state_dict(reference.state_dict())
        return cls(ours, reference, naive(reference), copy.deepcopy(reference).double())

    def outputs(
        self, query: Tensor, key: Tensor, value: Tensor, torch_kwargs: dict | None = None, **kwargs: object
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(ours, naive, accurate) attention outputs with need_weights=False; torch gets torch_kwargs if given."""
        torch_kwargs = kwargs if torch_kwargs is None else torch_kwargs
        ours = self.ours(query, key, value, need_weights=False, **kwargs)[0]
        lowp = self.naive(query, key, value, **torch_kwargs)[0]
        upcast = upcaster()
        accurate_kwargs = {name: upcast(t) if isinstance(t, Tensor) else t for name, t in torch_kwargs.items()}
        accurate = self.accurate(upcast(query), upcast(key), upcast(value), need_weights=False, **accurate_kwargs)[0]
        return ours, lowp, accurate


def inputs(
    kind: str,
    batch_first: bool,
    seqlen_q: int,
    seqlen_k: int,
    device: str,
    dtype: torch.dtype,
    kdim: int = EMBED_DIM,
    vdim: int = EMBED_DIM,
    batch: int | None = BATCH,
) -> tuple[Tensor, Tensor, Tensor]:
    """query, key, value for kind "self" (one tensor), "cross" (key is value) or "separate".
    batch=None: unbatched (L, E) inputs."""

    def randn(seqlen: int, features: int) -> Tensor:
        if batch is None:
            shape = (seqlen, features)
        else:
            shape = (batch, seqlen, features) if batch_first else (seqlen, batch, features)
        return torch.randn(shape, device=device, dtype=dtype)

    query = randn(seqlen_q, EMBED_DIM)
    if kind == "self":
        return query, query, query
    key = randn(seqlen_k, kdim)
    if kind == "cross":
        return query, key, key
    return query, key, randn(seqlen_k, vdim)


def padding_mask(lengths: list[int], seqlen: int, device: str) -> Tensor:
    """torch's bool key_padding_mask, True on the keys past each length: right padding."""
    return torch.arange(seqlen, device=device) >= torch.tensor(lengths, device=device).unsqueeze(1)


def float_mask(hidden: Tensor, dtype: torch.dtype) -> Tensor:
    return torch.zeros(hidden.shape, dtype=dtype, device=hidden.device).masked_fill(hidden, -math.inf)


def causal_mask(seqlen_q: int, seqlen_k: int, device: str) -> Tensor:
    return torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device).triu(1)


@contextlib.contextmanager
def fallbacks() -> Iterator[list[warnings.WarningMessage]]:
    """Records the FallbackWarnings raised inside (the module's filter would turn them into errors)."""
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always", FallbackWarning)
        yield records


# --------------------------------------------------------------------------- MultiheadAttention: the fast path

KINDS = [
    pytest.param("self", 13, 13, {}, id="self"),
    pytest.param("cross", 13, 5, {}, id="cross-q13k5"),
    pytest.param("cross", 3, 17, {}, id="cross-q3k17"),
    pytest.param("separate", 7, 11, {"kdim": 20, "vdim": 14}, id="separate-kdim20-vdim14"),
]


@pytest.mark.parametrize("device, dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "seq_first"])
@pytest.mark.parametrize("kind, seqlen_q, seqlen_k, dims", KINDS)
def test_matches_torch(
    flash_calls: list,
    device: str,
    dtype: torch.dtype,
    batch_first: bool,
    kind: str,
    seqlen_q: int,
    seqlen_k: int,
    dims: dict,
) -> None:
    versions = Versions.make(
        device, dtype, case_seed(device, dtype, batch_first, kind, seqlen_q), batch_first=batch_first, **dims
    )
    query, key, value = inputs(kind, batch_first, seqlen_q, seqlen_k, device, dtype, **dims)
    ours, lowp, accurate = versions.outputs(query, key, value)
    assert_within_bound(ours, lowp, accurate, "attn_output")
    assert versions.ours(query, key, value, need_weights=False)[1] is None
    assert flash_calls, "flash_attn_func was not called"


@pytest.mark.parametrize("kind, seqlen_q, seqlen_k, dims", KINDS)
def test_unbatched(flash_calls: list, kind: str, seqlen_q: int, seqlen_k: int, dims: dict) -> None:
    """(L, E) inputs and a (S,) key_padding_mask; batch_first is ignored for them, as in torch."""
    versions = Versions.make("cpu", torch.float32, case_seed("unbatched", kind, seqlen_q), batch_first=False, **dims)
    query, key, value = inputs(kind, False, seqlen_q, seqlen_k, "cpu", torch.float32, batch=None, **dims)
    ours, lowp, accurate = versions.outputs(query, key, value)
    assert ours.shape == (seqlen_q, EMBED_DIM)
    assert_within_bound(ours, lowp, accurate, "attn_output")
    kept = torch.rand(seqlen_k) < 0.6
    kept[0] = True
    ours, lowp, accurate = versions.outputs(query, key, value, key_padding_mask=~kept)
    assert_within_bound(ours, lowp, accurate, "attn_output with key_padding_mask")
    assert flash_calls


@pytest.mark.parametrize("device, dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("mask_type", ["bool", "float"])
@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "seq_first"])
@pytest.mark.parametrize("kind", ["self", "cross"])
def test_key_padding_mask(
    flash_calls: list, device: str, dtype: torch.dtype, mask_type: str, batch_first: bool, kind: str
) -> None:
    """Ragged padding: all keys kept, one kept, holes anywhere; each sequence attends to its kept keys."""
    seqlen_q, seqlen_k, batch = 9, 11, 4
    seed = case_seed("padding", device, dtype, mask_type, batch_first, kind)
    versions = Versions.make(device, dtype, seed, batch_first=batch_first)
    query, key, value = inputs(
        kind, batch_first, seqlen_q, seqlen_q if kind == "self" else seqlen_k, device, dtype, batch=batch
    )
    seqlen_k = key.shape[1 if batch_first else 0]
    kept = torch.rand(batch, seqlen_k, device=device) < 0.5
    kept[0] = True  # nothing padded
    kept[1] = False
    kept[1, 4] = True  # one key, in the middle
    kept[2:, 0] = True  # a key in every sequence: torch's naive path gives NaN where none is left
    hidden = ~kept
    mask = hidden if mask_type == "bool" else float_mask(hidden, dtype)
    ours, lowp, accurate = versions.outputs(query, key, value, key_padding_mask=mask)
    assert_within_bound(ours, lowp, accurate, "attn_output")
    assert [name for name, _ in flash_calls] == ["flash_attn_varlen_func"], "one varlen call for the batch"


def test_every_key_padded_gives_zero_attention(flash_calls: list) -> None:
    """A sequence with no key left gets 0 before out_proj, as on torch's SDPA path, causal or not."""
    versions = Versions.make("cpu", torch.float32, case_seed("all padded"), batch_first=True)
    query = torch.randn(2, 5, EMBED_DIM)
    padding = padding_mask([5, 0], 5, "cpu")
    for causal in (False, True):
        torch_kwargs = {"key_padding_mask": padding, "attn_mask": causal_mask(5, 5, "cpu") if causal else None}
        ours = versions.ours(query, query, query, key_padding_mask=padding, need_weights=False, is_causal=causal)[0]
        expected = versions.torch_mha(query, query, query, need_weights=False, **torch_kwargs)[0]
        torch.testing.assert_close(ours, expected, rtol=0, atol=FP32_OUT_EPS)
        assert torch.equal(ours[1], versions.ours.out_proj.bias.expand(5, -1))
    assert flash_calls


# Causal cases: (seqlen_q, seqlen_k). torch's is_causal is top-left aligned, flash_attn_func's bottom-right.
CAUSAL_SEQLENS = [(13, 13), (5, 13), (13, 5), (1, 7)]


@pytest.mark.parametrize("device, dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("seqlen_q, seqlen_k", CAUSAL_SEQLENS)
@pytest.mark.parametrize("how", ["hint+bool mask", "hint+float mask", "hint only", "bool mask only", "float mask only"])
def test_causal(flash_calls: list, device: str, dtype: torch.dtype, seqlen_q: int, seqlen_k: int, how: str) -> None:
    """is_causal with torch's causal attn_mask, without it (torch requires it: its reference gets the
    mask), and the mask without the hint, recognised: every way runs flashattn's causal kernel."""
    versions = Versions.make(
        device, dtype, case_seed("causal", device, dtype, seqlen_q, seqlen_k, how), batch_first=True
    )
    kind = "self" if seqlen_q == seqlen_k else "cross"
    query, key, value = inputs(kind, True, seqlen_q, seqlen_k, device, dtype)
    hidden = causal_mask(seqlen_q, seqlen_k, device)
    mask = float_mask(hidden, dtype) if "float" in how else hidden
    torch_kwargs = {"attn_mask": mask, "is_causal": how.startswith("hint")}
    kwargs = {"attn_mask": None if how == "hint only" else mask, "is_causal": how.startswith("hint")}
    ours, lowp, accurate = versions.outputs(query, key, value, torch_kwargs, **kwargs)
    assert_within_bound(ours, lowp, accurate, "attn_output")
    assert flash_calls


@pytest.mark.parametrize("device, dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "seq_first"])
def test_causal_with_right_padding(flash_calls: list, device: str, dtype: torch.dtype, batch_first: bool) -> None:
    """Kept keys first: the causal mask and the padding together still run on flashattn's kernels."""
    versions = Versions.make(
        device, dtype, case_seed("causal padded", device, dtype, batch_first), batch_first=batch_first
    )
    query, key, value = inputs("self", batch_first, 9, 9, device, dtype)
    padding = padding_mask([9, 4, 1], 9, device)
    kwargs = {"key_padding_mask": padding, "attn_mask": causal_mask(9, 9, device), "is_causal": True}
    ours, lowp, accurate = versions.outputs(query, key, value, **kwargs)
    assert_within_bound(ours, lowp, accurate, "attn_output")
    assert flash_calls


def test_causal_with_left_padding_falls_back() -> None:
    """Kept keys last: not expressible by the per-sequence causal kernel, so torch's path runs."""
    versions = Versions.make("cpu", torch.float32, case_seed("left padding"), batch_first=True)
    query, _, _ = inputs("self", True, 6, 6, "cpu", torch.float32)
    padding = padding_mask([6, 4, 2], 6, "cpu").flip(1)
    kwargs = {"key_padding_mask": padding, "attn_mask": causal_mask(6, 6, "cpu"), "is_causal": True}
    with fallbacks() as records:
        ours = versions.ours(query, query, query, need_weights=False, **kwargs)[0]
    assert len(records) == 1 and "key_padding_mask" in str(records[0].message)
    assert torch.equal(ours, versions.torch_mha(query, query, query, need_weights=False, **kwargs)[0])


# --------------------------------------------------------------------------- MultiheadAttention: fallbacks

# (module kwargs, call kwargs, words of the warning). Call kwargs are built per test: masks need shapes.
FALLBACKS = {
    "need_weights": ({}, lambda L, S: {"need_weights": True}, "need_weights=True"),
    "per-head weights": ({}, lambda L, S: {"need_weights": True, "average_attn_weights": False}, "need_weights"),
    "float attn_mask": ({}, lambda L, S: {"attn_mask": torch.randn(L, S)}, "attn_mask"),
    "bool attn_mask, 3-D": (
        {},
        lambda L, S: {"attn_mask": torch.rand(BATCH * NUM_HEADS, L, S) < 0.3},
        "attn_mask",
    ),
    "large negative key_padding_mask": (
        {},
        lambda L, S: {"key_padding_mask": torch.where(torch.rand(BATCH, S) < 0.3, -1e4, 0.0)},
        "key_padding_mask",
    ),
    "add_bias_kv": ({"add_bias_kv": True}, lambda L, S: {}, "add_bias_kv"),
    "add_zero_attn": ({"add_zero_attn": True}, lambda L, S: {}, "add_zero_attn"),
}


@pytest.mark.parametrize("case", FALLBACKS)
def test_fallback_is_torch_exactly_and_warns_once(flash_calls: list, case: str) -> None:
    module_kwargs, make_call_kwargs, words = FALLBACKS[case]
    versions = Versions.make("cpu", torch.float32, case_seed("fallback", case), batch_first=True, **module_kwargs)
    query = torch.randn(BATCH, 7, EMBED_DIM)
    call_kwargs = {"need_weights": False, **make_call_kwargs(7, 7)}
    with fallbacks() as records:
        for _ in range(2):
            torch.manual_seed(0)  # dropout draws the same mask for ours and torch's
            ours = versions.ours(query, query, query, **call_kwargs)
            torch.manual_seed(0)
            expected = versions.torch_mha(query, query, query, **call_kwargs)
            assert torch.equal(ours[0], expected[0])
            assert (ours[1] is None and expected[1] is None) or torch.equal(ours[1], expected[1])
    assert len(records) == 1, [str(r.message) for r in records]
    assert words in str(records[0].message)
    assert not flash_calls


@pytest.mark.parametrize("embed_dim", [1024, 1026], ids=["head-dim-512", "head-dim-513"])
def test_head_dims_up_to_512_run_on_flashattn(flash_calls: list, embed_dim: int) -> None:
    """Two heads of 512 (Gemma 4's global layers) run on flash_attn_func, within the bound; of 513, past
    flashattn's limit, on torch's path, exactly, with the reason."""
    torch.manual_seed(case_seed("nn head dim", embed_dim))
    reference = randomized(nn.MultiheadAttention(embed_dim, 2, batch_first=True))
    ours = MultiheadAttention(embed_dim, 2, batch_first=True)
    ours.load_state_dict(reference.state_dict())
    query = torch.randn(BATCH, 7, embed_dim)
    with fallbacks() as records:
        out = ours(query, query, query, need_weights=False)[0]
    if embed_dim // 2 > 512:
        assert len(records) == 1 and "head dim 513 (embed_dim / num_heads) is over 512" in str(records[0].message)
        assert not flash_calls
        assert torch.equal(out, reference(query, query, query, need_weights=False)[0])
        return
    assert not records and flash_calls == [("flash_attn_func", (BATCH, 7, 2, 512))]
    lowp = naive(reference)(query, query, query)[0]
    accurate = copy.deepcopy(reference).double()(*(query.double(),) * 3, need_weights=False)[0]
    assert_within_bound(out, lowp, accurate, "out")


def test_dropout_in_training_runs_on_flashattn(flash_calls: list) -> None:
    """dropout > 0 in training: flashattn's dropout, no fallback; the same seed gives the same output, and
    the output is not the eval one (some probabilities were dropped)."""
    versions = Versions.make("cpu", torch.float32, case_seed("dropout"), batch_first=True, dropout=0.25)
    module = versions.ours.train()
    query = torch.randn(BATCH, 7, EMBED_DIM)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        torch.manual_seed(0)
        first = module(query, query, query, need_weights=False)[0]
        torch.manual_seed(0)
        again = module(query, query, query, need_weights=False)[0]
        evaluated = module.eval()(query, query, query, need_weights=False)[0]
    assert torch.equal(first, again)
    assert not torch.allclose(first, evaluated)
    assert flash_calls


def test_default_need_weights_returns_the_weights() -> None:
    """torch's default need_weights=True: the averaged (N, L, S) weights, as torch returns them."""
    versions = Versions.make("cpu", torch.float32, case_seed("need_weights default"), batch_first=True)
    query = torch.randn(BATCH, 5, EMBED_DIM)
    with fallbacks():
        out, weights = versions.ours(query, query, query)
    expected_out, expected_weights = versions.torch_mha(query, query, query)
    assert weights.shape == (BATCH, 5, 5)
    assert torch.equal(out, expected_out) and torch.equal(weights, expected_weights)


def test_each_reason_is_warned_once() -> None:
    versions = Versions.make("cpu", torch.float32, case_seed("reasons"), batch_first=True)
    query = torch.randn(BATCH, 5, EMBED_DIM)
    with fallbacks() as records:
        for _ in range(3):
            versions.ours(query, query, query)  # need_weights=True
            versions.ours(query, query, query, need_weights=False, attn_mask=torch.randn(5, 5))
    assert len(records) == 2
    assert all(r.category is FallbackWarning for r in records)


def test_is_causal_without_mask_falls_back_with_the_mask_torch_needs() -> None:
    """need_weights=True with is_causal and no attn_mask: torch would refuse; ours builds the causal mask."""
    versions = Versions.make("cpu", torch.float32, case_seed("causal weights"), batch_first=True)
    query = torch.randn(BATCH, 6, EMBED_DIM)
    with fallbacks():
        out, weights = versions.ours(query, query, query, is_causal=True)
    expected_out, expected_weights = versions.torch_mha(
        query, query, query, attn_mask=causal_mask(6, 6, "cpu"), is_causal=True
    )
    assert torch.equal(out, expected_out) and torch.equal(weights, expected_weights)
    assert (weights.triu(1) == 0).all()


# --------------------------------------------------------------------------- MultiheadAttention: errors


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda m, x: m(x.unsqueeze(0), x.unsqueeze(0), x.unsqueeze(0)), ValueError, "query must be 3-D"),
        (lambda m, x: m(x, x[..., :-1], x[..., :-1]), ValueError, "key must have 30 features"),
        (lambda m, x: m(x, x, x[:, :-1]), ValueError, "key shape (3, 5, 30) and value shape (3, 4, 30) differ"),
        (lambda m, x: m(x, x[:-1], x[:-1]), ValueError, "differ in batch size"),
        (
            lambda m, x: m(x, x, x, key_padding_mask=torch.zeros(3, 4, dtype=torch.bool)),
            ValueError,
            "key_padding_mask must have shape (3, 5)",
        ),
        (
            lambda m, x: m(x, x, x, key_padding_mask=torch.zeros(3, 5, dtype=torch.int64)),
            TypeError,
            "key_padding_mask must be bool or floating point",
        ),
        (lambda m, x: m(x, x, x, attn_mask=torch.zeros(5, 5, dtype=torch.int32)), TypeError, "attn_mask must be bool"),
        (
            lambda m, x: m(x, x, x, attn_mask=torch.zeros(2, 5, 5)),
            ValueError,
            "attn_mask must have shape (5, 5) or (9, 5, 5)",
        ),
    ],
    ids=[
        "query 4-D",
        "key features",
        "value length",
        "batch",
        "padding shape",
        "padding dtype",
        "mask dtype",
        "mask shape",
    ],
)
def test_errors_name_the_argument(call: Callable, error: type, words: str) -> None:
    module = MultiheadAttention(EMBED_DIM, NUM_HEADS, batch_first=True)
    with pytest.raises(error, match=f"^flashattn.nn.MultiheadAttention: .*{re.escape(words)}"):
        call(module, torch.randn(BATCH, 5, EMBED_DIM))


# --------------------------------------------------------------------------- MultiheadAttention: parameters

CONFIGS = [
    pytest.param({}, id="default"),
    pytest.param({"bias": False}, id="no-bias"),
    pytest.param({"kdim": 20, "vdim": 14}, id="kdim-vdim"),
    pytest.param({"add_bias_kv": True}, id="bias-kv"),
]


@pytest.mark.parametrize("config", CONFIGS)
def test_same_parameters_and_initialisation(config: dict) -> None:
    torch.manual_seed(0)
    expected = nn.MultiheadAttention(EMBED_DIM, NUM_HEADS, **config)
    torch.manual_seed(0)
    ours = MultiheadAttention(EMBED_DIM, NUM_HEADS, **config)
    assert ours.state_dict().keys() == expected.state_dict().keys()
    for name, tensor in expected.state_dict().items():
        assert torch.equal(ours.state_dict()[name], tensor), name
    assert isinstance(ours, nn.MultiheadAttention)


@pytest.mark.parametrize("config", CONFIGS)
def test_state_dict_round_trip(config: dict) -> None:
    """A torch checkpoint loads into ours and ours into torch, strictly, with the same outputs."""
    torch.manual_seed(case_seed("round trip", config))
    source = randomized(nn.MultiheadAttention(EMBED_DIM, NUM_HEADS, batch_first=True, **config))
    ours = MultiheadAttention(EMBED_DIM, NUM_HEADS, batch_first=True, **config)
    ours.load_state_dict(source.state_dict())
    back = nn.MultiheadAttention(EMBED_DIM, NUM_HEADS, batch_first=True, **config)
    back.load_state_dict(ours.state_dict())
    query = torch.randn(BATCH, 4, EMBED_DIM)
    key = torch.randn(BATCH, 6, config.get("kdim", EMBED_DIM))
    value = torch.randn(BATCH, 6, config.get("vdim", EMBED_DIM))
    with fallbacks():  # add_bias_kv takes torch's path
        ours_out = ours(query, key, value, need_weights=False)[0]
    for torch_module in (source, back):
        expected = naive(torch_module)(query, key, value)[0]
        accurate = copy.deepcopy(torch_module).double()(
            query.double(), key.double(), value.double(), need_weights=False
        )[0]
        assert_within_bound(ours_out, expected, accurate, "attn_output")


# --------------------------------------------------------------------------- MultiheadAttention: inside torch's layers


def _layer_inputs(
    batch_first: bool, seqlen: int, width: int, device: str = "cpu", dtype: torch.dtype = torch.float32
) -> Tensor:
    shape = (BATCH, seqlen, width) if batch_first else (seqlen, BATCH, width)
    return torch.randn(shape, device=device, dtype=dtype)


@pytest.mark.parametrize("device, dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "seq_first"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_transformer_encoder_layer_train(
    flash_calls: list, device: str, dtype: torch.dtype, batch_first: bool, norm_first: bool
) -> None:
    torch.manual_seed(case_seed("encoder train", device, dtype, batch_first, norm_first))
    factory = {"device": device, "dtype": dtype}
    layer = randomized(
        nn.TransformerEncoderLayer(32, 2, 48, 0.0, batch_first=batch_first, norm_first=norm_first, **factory)
    )
    ours = convert_multihead_attention(copy.deepcopy(layer))
    assert type(ours.self_attn) is MultiheadAttention
    yardstick, accurate = naive(layer), copy.deepcopy(layer).double()
    src = _layer_inputs(batch_first, 9, 32, device, dtype)
    padding = padding_mask([9, 6, 2], 9, device)
    for kwargs in ({}, {"src_key_padding_mask": padding}, {"src_mask": causal_mask(9, 9, device), "is_causal": True}):
        expected = accurate(src.double(), **kwargs)
        assert_within_bound(ours(src, **kwargs), yardstick(src, **kwargs), expected, f"output with {list(kwargs)}")
    assert flash_calls


def test_transformer_encoder_layer_eval_takes_torchs_fused_path(flash_calls: list) -> None:
    """In eval mode without autograd, nn.TransformerEncoderLayer (batch_first, even head count) runs torch's
    fused encoder kernel on self_attn's weights without calling self_attn: the result is torch's. With
    torch.backends.mha.set_fastpath_enabled(False) it calls our module."""
    torch.manual_seed(case_seed("encoder eval"))
    layer = randomized(nn.TransformerEncoderLayer(32, 2, 48, dropout=0.0, batch_first=True)).eval()
    ours = convert_multihead_attention(copy.deepcopy(layer))
    src = _layer_inputs(True, 9, 32)
    padding = padding_mask([9, 6, 2], 9, "cpu")
    with torch.no_grad():
        fused = ours(src, src_key_padding_mask=padding)
        assert torch.equal(fused, layer(src, src_key_padding_mask=padding))
        assert not flash_calls
        fastpath = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            out = ours(src, src_key_padding_mask=padding)
            expected = naive(layer)(src, src_key_padding_mask=padding)
        finally:
            torch.backends.mha.set_fastpath_enabled(fastpath)
        accurate = copy.deepcopy(layer).double()(src.double(), src_key_padding_mask=padding)
    assert_within_bound(out, expected, accurate, "output through our module")
    assert flash_calls


@pytest.mark.parametrize("device, dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "seq_first"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_transformer_decoder_layer(
    flash_calls: list, device: str, dtype: torch.dtype, batch_first: bool, training: bool
) -> None:
    """Causal self-attention (the mask recognised with or without tgt_is_causal) with right padding, and
    cross-attention over a ragged memory."""
    torch.manual_seed(case_seed("decoder", device, dtype, batch_first, training))
    factory = {"device": device, "dtype": dtype}
    layer = randomized(nn.TransformerDecoderLayer(32, 2, 48, 0.0, batch_first=batch_first, **factory)).train(training)
    ours = convert_multihead_attention(copy.deepcopy(layer))
    assert type(ours.self_attn) is MultiheadAttention and type(ours.multihead_attn) is MultiheadAttention
    yardstick, accurate = naive(layer), copy.deepcopy(layer).double()
    tgt, memory = _layer_inputs(batch_first, 7, 32, device, dtype), _layer_inputs(batch_first, 10, 32, device, dtype)
    masks = {
        "tgt_mask": causal_mask(7, 7, device),
        "tgt_key_padding_mask": padding_mask([7, 5, 3], 7, device),
        "memory_key_padding_mask": torch.rand(BATCH, 10, device=device) < 0.4,
    }
    masks["memory_key_padding_mask"][:, 0] = False
    for tgt_is_causal in (True, False):
        assert_within_bound(
            ours(tgt, memory, **masks, tgt_is_causal=tgt_is_causal),
            yardstick(tgt, memory, **masks, tgt_is_causal=tgt_is_causal),
            accurate(tgt.double(), memory.double(), **masks, tgt_is_causal=tgt_is_causal),
            f"output with tgt_is_causal={tgt_is_causal}",
        )
    assert flash_calls


# --------------------------------------------------------------------------- convert_multihead_attention


class _Model(nn.Module):
    """Attention in the places a converter must reach: a Transformer, a list, the top level."""

    def __init__(self) -> None:
        super().__init__()
        self.transformer = nn.Transformer(32, 2, 2, 1, 48, dropout=0.0, batch_first=True)
        self.extra = nn.ModuleList(
            [nn.Linear(32, 32), nn.MultiheadAttention(32, 4, kdim=24, vdim=24, batch_first=True)]
        )

    def forward(self, src: Tensor, tgt: Tensor, memory_extra: Tensor) -> Tensor:
        out = self.transformer(src, tgt, tgt_mask=causal_mask(tgt.shape[1], tgt.shape[1], "cpu"), tgt_is_causal=True)
        return self.extra[1](self.extra[0](out), memory_extra, memory_extra, need_weights=False)[0]


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_convert_model(flash_calls: list, training: bool) -> None:
    torch.manual_seed(case_seed("convert", training))
    model = randomized(_Model()).train(training)
    converted = convert_multihead_attention(copy.deepcopy(model))
    attention = [m for m in converted.modules() if isinstance(m, nn.MultiheadAttention)]
    assert len(attention) == 5 and all(type(m) is MultiheadAttention for m in attention)
    assert converted.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(converted.state_dict()[k], v) for k, v in model.state_dict().items())
    args = (torch.randn(BATCH, 9, 32), torch.randn(BATCH, 6, 32), torch.randn(BATCH, 4, 24))
    with torch.no_grad():
        expected = naive(model)(*args)
        accurate = copy.deepcopy(model).double()(*(a.double() for a in args))
        assert_within_bound(converted(*args), expected, accurate, "model output")
    assert flash_calls


def test_convert_keeps_flags_and_draws_no_random_numbers() -> None:
    torch.manual_seed(0)
    module = nn.MultiheadAttention(EMBED_DIM, NUM_HEADS, dropout=0.1, batch_first=True).eval()
    module.in_proj_weight.requires_grad_(False)
    rng = torch.get_rng_state()
    converted = convert_multihead_attention(module)
    assert torch.equal(torch.get_rng_state(), rng)
    assert type(converted) is MultiheadAttention and not converted.training
    assert (converted.dropout, converted.batch_first, converted.num_heads) == (0.1, True, NUM_HEADS)
    assert not converted.in_proj_weight.requires_grad and converted.out_proj.weight.requires_grad
    assert converted.in_proj_weight.data_ptr() == module.in_proj_weight.data_ptr()  # taken over, not copied


def test_convert_leaves_other_subclasses_alone() -> None:
    class Custom(nn.MultiheadAttention):
        pass

    model = nn.Sequential(Custom(EMBED_DIM, NUM_HEADS), MultiheadAttention(EMBED_DIM, NUM_HEADS))
    before = list(model)
    assert list(convert_multihead_attention(model)) == before


# --------------------------------------------------------------------------- MultiheadAttention: gradients


@pytest.mark.parametrize("device, dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "seq_first"])
@pytest.mark.parametrize("case", ["self", "self+padding+causal", "cross+padding"])
def test_gradients_match_torch(device: str, dtype: torch.dtype, batch_first: bool, case: str) -> None:
    """Gradients of every parameter and input, within three times the error of torch's naive path."""
    versions = Versions.make(
        device, dtype, case_seed("grads", device, dtype, batch_first, case), batch_first=batch_first
    )
    kind = case.split("+")[0]
    seqlen_q, seqlen_k = (9, 9) if kind == "self" else (6, 11)
    query, key, _ = inputs(kind, batch_first, seqlen_q, seqlen_k, device, dtype)
    kwargs = {}
    if "padding" in case:
        kwargs["key_padding_mask"] = padding_mask([seqlen_k, seqlen_k - 3, 2], seqlen_k, device)
    if "causal" in case:
        kwargs.update(attn_mask=causal_mask(seqlen_q, seqlen_k, device), is_causal=True)
    shape = query.shape
    dout = torch.randn(shape, device=device, dtype=dtype)

    def grads(module: nn.MultiheadAttention, cast: torch.dtype) -> list[Tensor]:
        q = query.detach().to(cast).requires_grad_()
        k = q if kind == "self" else key.detach().to(cast).requires_grad_()
        out = module(q, k, k, need_weights=False, **kwargs)[0]
        leaves = [q, *([] if kind == "self" else [k]), *module.parameters()]
        return torch.autograd.grad(out, leaves, dout.to(cast))

    names = ["query", *([] if kind == "self" else ["key"]), *(name for name, _ in versions.ours.named_parameters())]
    for name, ours, lowp, accurate in zip(
        names, grads(versions.ours, dtype), grads(versions.naive, dtype), grads(versions.accurate, torch.float64)
    ):
        assert_within_bound(ours, lowp, accurate, f"grad of {name}", grad=True)


# --------------------------------------------------------------------------- MultiheadAttention: autocast


@pytest.mark.parametrize(
    "device, dtype",
    [
        pytest.param("cpu", torch.bfloat16, id="cpu-bf16"),
        pytest.param("cuda", torch.float16, id="cuda-fp16", marks=gpu),
    ],
)
def test_autocast(flash_calls: list, device: str, dtype: torch.dtype) -> None:
    """An fp32 module under autocast: the projections come out in the autocast dtype and take flashattn's path."""
    versions = Versions.make(device, torch.float32, case_seed("autocast", device), batch_first=True)
    query = torch.randn(BATCH, 11, EMBED_DIM, device=device)
    padding = padding_mask([11, 7, 3], 11, device)
    with torch.autocast(device, dtype=dtype):
        ours = versions.ours(query, query, query, key_padding_mask=padding, need_weights=False)[0]
        lowp = versions.naive(query, query, query, key_padding_mask=padding)[0]
    accurate = versions.accurate(*(query.double(),) * 3, key_padding_mask=padding, need_weights=False)[0]
    assert_within_bound(ours, lowp, accurate, "attn_output under autocast")
    assert flash_calls


# --------------------------------------------------------------------------- RotaryEmbedding


def rotary_reference(x: Tensor, dim: int, base: float, interleaved: bool, seqlen_offset: int = 0) -> Tensor:
    """Rotary embeddings as complex multiplication (Meta's Llama formulation), in float64.

    Channel pairs become complex numbers, multiplied by exp(i * position * base^(-2j/dim)).
    Non-interleaved pairs (j, j + dim/2) are gathered next to each other first and put back after.
    """
    x = x.double()
    rotary, rest = x[..., :dim], x[..., dim:]
    if not interleaved:
        rotary = torch.stack(rotary.chunk(2, dim=-1), dim=-1).flatten(-2)
    pairs = torch.view_as_complex(rotary.unflatten(-1, (dim // 2, 2)).contiguous())
    positions = torch.arange(seqlen_offset, seqlen_offset + x.shape[1], dtype=torch.float64, device=x.device)
    frequencies = base ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=x.device) / dim)
    angles = torch.outer(positions, frequencies)[:, None, :]  # [S, 1, dim / 2]
    rotated = torch.view_as_real(pairs * torch.polar(torch.ones_like(angles), angles)).flatten(-2)
    if not interleaved:
        rotated = torch.cat((rotated[..., 0::2], rotated[..., 1::2]), dim=-1)
    return torch.cat((rotated, rest), dim=-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
@pytest.mark.parametrize("dim", [16, 10], ids=["full", "partial"])
@pytest.mark.parametrize("seqlen_offset", [0, 1000])
def test_rotary_matches_complex_reference(dtype: torch.dtype, interleaved: bool, dim: int, seqlen_offset: int) -> None:
    torch.manual_seed(case_seed("rotary", dtype, interleaved, dim, seqlen_offset))
    rotary = RotaryEmbedding(dim, base=500.0, interleaved=interleaved)
    q, k = torch.randn(2, 37, 4, 16, dtype=dtype), torch.randn(2, 37, 2, 16, dtype=dtype)
    q_rot, k_rot = rotary(q, k, seqlen_offset=seqlen_offset)
    for x, ours in ((q, q_rot), (k, k_rot)):
        expected = rotary_reference(x, dim, 500.0, interleaved, seqlen_offset)
        assert ours.dtype == dtype
        assert torch.equal(ours[..., dim:], x[..., dim:])
        # Angles in fp32 are off by a few ulps of the largest angle, turning x by that much; bf16 then rounds
        # the result, which may land one ulp (2^-7 relative) from the rounded exact value.
        angle_error = 4 * (seqlen_offset + x.shape[1]) * torch.finfo(torch.float32).eps
        atol = angle_error * x.abs().max().item()
        rtol = 2**-7 if dtype == torch.bfloat16 else 0.0
        torch.testing.assert_close(ours, expected.to(dtype), atol=atol, rtol=rtol)


def test_rotary_scores_depend_on_relative_position_only() -> None:
    torch.manual_seed(case_seed("rotary relative"))
    rotary = RotaryEmbedding(16)
    q, k = torch.randn(1, 9, 2, 16), torch.randn(1, 9, 2, 16)

    def scores(offset: int) -> Tensor:
        q_rot, k_rot = rotary(q, k, seqlen_offset=offset)
        return torch.einsum("bqhd,bkhd->bhqk", q_rot, k_rot)

    torch.testing.assert_close(scores(0), scores(37), rtol=0, atol=1e-5)
    assert not torch.allclose(scores(0), torch.einsum("bqhd,bkhd->bhqk", q, k), atol=1e-2)


def test_rotary_rejects_bad_dims() -> None:
    with pytest.raises(ValueError, match="dim must be a positive even number, got 7"):
        RotaryEmbedding(7)
    with pytest.raises(ValueError, match="head dim 8 is smaller than the rotary dim 16"):
        RotaryEmbedding(16).rotate(torch.randn(1, 2, 1, 8))


# --------------------------------------------------------------------------- MHA


MHA_EMBED_DIM = 48
MHA_CASES = [
    pytest.param({"num_heads": 4}, 13, None, id="mha"),
    pytest.param(
        {"num_heads": 4, "num_heads_kv": 2, "causal": True, "rotary_emb_dim": 12}, 13, None, id="gqa-causal-rotary"
    ),
    pytest.param(
        {"num_heads": 4, "num_heads_kv": 1, "causal": True, "rotary_emb_dim": 8, "rotary_emb_interleaved": True},
        13,
        None,
        id="mqa-causal-partial-interleaved-rotary",
    ),
    pytest.param(
        {"num_heads": 4, "num_heads_kv": 2, "cross_attn": True, "rotary_emb_dim": 12}, 7, 19, id="cross-gqa-rotary"
    ),
    pytest.param({"num_heads": 4, "cross_attn": True, "causal": True}, 7, 19, id="cross-causal"),
    pytest.param(
        {"num_heads": 2, "qkv_proj_bias": False, "out_proj_bias": False, "softmax_scale": 0.3},
        5,
        None,
        id="no-bias-scale",
    ),
]


def mha_reference(module: MHA, x: Tensor, x_kv: Tensor | None) -> Tensor:
    """MHA's forward written out from its parameters, in the module's dtype: the q, k, v layout of the
    projection (q, then k, then v, head after head), rotary_reference and attention_ref. In float64 this is
    the accurate answer; in a low-precision dtype, PyTorch's own error."""
    head_dim, kv_width = module.head_dim, module.num_heads_kv * module.head_dim
    if module.cross_attn:
        q, (k, v) = module.Wq(x), module.Wkv(x_kv).split(kv_width, dim=-1)
    else:
        q, k, v = module.Wqkv(x).split([module.embed_dim, kv_width, kv_width], dim=-1)
    q, k, v = (t.unflatten(-1, (-1, head_dim)) for t in (q, k, v))
    if module.rotary_emb is not None:
        rotary = module.rotary_emb
        q, k = (rotary_reference(t, rotary.dim, rotary.base, rotary.interleaved).to(t.dtype) for t in (q, k))
    out, _ = attention_ref(q, k, v, module.softmax_scale, module.causal, module.window_size, upcast=False)
    return module.out_proj(out.flatten(-2))


def _mha_pair(device: str, dtype: torch.dtype, config: dict, seed: int) -> tuple[MHA, MHA]:
    torch.manual_seed(seed)
    module = randomized(MHA(MHA_EMBED_DIM, device=device, dtype=dtype, **config))
    return module, copy.deepcopy(module).double()


@pytest.mark.parametrize("device, dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("config, seqlen, seqlen_kv", MHA_CASES)
def test_mha_matches_reference(
    flash_calls: list, device: str, dtype: torch.dtype, config: dict, seqlen: int, seqlen_kv: int | None
) -> None:
    module, accurate = _mha_pair(device, dtype, config, case_seed("mha", device, dtype, config))
    x = torch.randn(BATCH, seqlen, MHA_EMBED_DIM, device=device, dtype=dtype)
    x_kv = None if seqlen_kv is None else torch.randn(BATCH, seqlen_kv, MHA_EMBED_DIM, device=device, dtype=dtype)
    ours = module(x, x_kv)
    lowp = mha_reference(module, x, x_kv)
    expected = mha_reference(accurate, x.double(), None if x_kv is None else x_kv.double())
    assert_within_bound(ours, lowp, expected, "MHA output")
    assert flash_calls


@pytest.mark.parametrize("device, dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("config, seqlen, seqlen_kv", [MHA_CASES[2], MHA_CASES[3]])
def test_mha_gradients(device: str, dtype: torch.dtype, config: dict, seqlen: int, seqlen_kv: int | None) -> None:
    module, accurate = _mha_pair(device, dtype, config, case_seed("mha grads", device, dtype, config))
    x = torch.randn(BATCH, seqlen, MHA_EMBED_DIM, device=device, dtype=dtype)
    x_kv = None if seqlen_kv is None else torch.randn(BATCH, seqlen_kv, MHA_EMBED_DIM, device=device, dtype=dtype)
    dout = torch.randn(BATCH, seqlen, MHA_EMBED_DIM, device=device, dtype=dtype)

    def grads(forward: Callable, m: MHA, cast: torch.dtype) -> list[Tensor]:
        inputs = [t.detach().to(cast).requires_grad_() for t in (x, x_kv) if t is not None]
        out = forward(m, *inputs) if len(inputs) == 2 else forward(m, inputs[0], None)
        return torch.autograd.grad(out, [*inputs, *m.parameters()], dout.to(cast))

    names = ["x", *(["x_kv"] if x_kv is not None else []), *(name for name, _ in module.named_parameters())]
    for name, ours, lowp, expected in zip(
        names,
        grads(MHA.__call__, module, dtype),
        grads(mha_reference, module, dtype),
        grads(mha_reference, accurate, torch.float64),
    ):
        assert_within_bound(ours, lowp, expected, f"grad of {name}", grad=True)


def test_mha_parameter_names_are_flash_attn_s() -> None:
    self_attn = MHA(MHA_EMBED_DIM, 4, num_heads_kv=2)
    assert {k: tuple(v.shape) for k, v in self_attn.state_dict().items()} == {
        "Wqkv.weight": (48 + 2 * 2 * 12, 48),
        "Wqkv.bias": (48 + 2 * 2 * 12,),
        "out_proj.weight": (48, 48),
        "out_proj.bias": (48,),
    }
    cross = MHA(MHA_EMBED_DIM, 4, cross_attn=True, qkv_proj_bias=False, rotary_emb_dim=12)
    assert set(cross.state_dict()) == {"Wq.weight", "Wkv.weight", "out_proj.weight", "out_proj.bias"}


@pytest.mark.parametrize("device, dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("config", [
    pytest.param({"num_heads": 4, "num_heads_kv": 2, "causal": True, "rotary_emb_dim": 12}, id="gqa-rotary"),
    pytest.param({"num_heads": 4, "num_heads_kv": 1, "causal": True, "rotary_emb_dim": 8,
                  "rotary_emb_interleaved": True, "window_size": (4, 0)}, id="mqa-interleaved-window"),
])
def test_mha_kv_cache_decoding_matches_the_full_forward(device: str, dtype: torch.dtype, config: dict) -> None:
    """A prompt, then one token per step through a KVCache (flash_attn_with_kvcache, rotary in the
    kernel at the cached positions), gives each step's output of the full causal forward over the
    tokens so far: within the bound against the float64 module on the whole sequence."""
    embed_dim = 64  # head dim 16: the CUDA KV cache takes multiples of 8
    torch.manual_seed(case_seed("mha cache", device, dtype, config))
    module = randomized(MHA(embed_dim, device=device, dtype=dtype, **config))
    accurate = copy.deepcopy(module).double()
    prompt, steps = 5, 4
    x = torch.randn(BATCH, prompt + steps, embed_dim, device=device, dtype=dtype)
    cache = KVCache(BATCH, 16, config["num_heads_kv"], embed_dim // 4, device=device, dtype=dtype)
    outs = [module(x[:, :prompt], kv_cache=cache)]
    cache.advance(prompt)
    for t in range(prompt, prompt + steps):
        outs.append(module(x[:, t : t + 1], kv_cache=cache))
        cache.advance(1)
    ours = torch.cat(outs, dim=1)
    assert_within_bound(ours, mha_reference(module, x, None), mha_reference(accurate, x.double(), None),
                        "decoding through the KV cache")
    assert cache.seqlens.tolist() == [prompt + steps] * BATCH


def test_mha_dropout_is_off_in_eval() -> None:
    torch.manual_seed(0)
    with_dropout = MHA(MHA_EMBED_DIM, 4, dropout=0.1).eval()
    without = copy.deepcopy(with_dropout)
    without.dropout = 0.0
    x = torch.randn(BATCH, 5, MHA_EMBED_DIM)
    assert torch.equal(with_dropout(x), without(x))


def test_mha_window() -> None:
    module, accurate = _mha_pair("cpu", torch.float32, {"num_heads": 4, "window_size": (3, 0)}, case_seed("window"))
    x = torch.randn(BATCH, 13, MHA_EMBED_DIM)
    ours = module(x)
    q, k, v = accurate.Wqkv(x.double()).unflatten(-1, (3, 4, 12)).unbind(-3)
    out, _ = attention_ref(q, k, v, window_size=(3, 0))
    expected = accurate.out_proj(out.flatten(-2))
    assert_within_bound(ours, expected.float(), expected, "MHA output with a window")


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"embed_dim": 48, "num_heads": 5}, "embed_dim (48) must be a multiple of num_heads (5)"),
        ({"embed_dim": 48, "num_heads": 4, "num_heads_kv": 3}, "num_heads (4) must be a multiple of num_heads_kv (3)"),
        (
            {"embed_dim": 48, "num_heads": 4, "rotary_emb_dim": 14},
            "rotary_emb_dim (14) is larger than the head dim (12)",
        ),
        ({"embed_dim": 48, "num_heads": 4, "rotary_emb_dim": 5}, "dim must be a positive even number, got 5"),
    ],
)
def test_mha_constructor_errors(kwargs: dict, words: str) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        MHA(**kwargs)


def test_mha_x_kv_errors() -> None:
    x = torch.randn(1, 3, MHA_EMBED_DIM)
    with pytest.raises(ValueError, match=r"MHA\(cross_attn=True\): forward takes x_kv .*got None"):
        MHA(MHA_EMBED_DIM, 4, cross_attn=True)(x)
    with pytest.raises(ValueError, match=r"MHA\(cross_attn=False\): forward takes x_kv only with cross_attn=True"):
        MHA(MHA_EMBED_DIM, 4)(x, x)
