"""Sliding windows, softcap, ALiBi and dropout, alone and combined, forward and backward,
against the reference within the bounds of tests/helpers.py.

Dropout is checked against the reference run with the very keep mask the kernels draw
(flashattn.philox, bit-exact on both devices), so it is held to the same bound as the rest;
return_attn_probs, the seed's reproducibility and the dropped fraction have tests of their own.
On the GPU every feature meets every dtype, head dim and length pair, the head layout
cycling; on CPU (CI: two slow cores) every feature meets every length pair, with dtype,
head dim and head layout cycling across cases.
"""

import itertools
import math

import pytest
import torch
from helpers import (
    DEVICES,
    assert_grads_match_reference,
    assert_matches_reference,
    blind_rows,
    case_seed,
    max_abs_diff,
    decode_s_dmask,
    random_qkv,
    reference_options,
    run_backward,
    run_forward,
)

from flashattn import cpu
from flashattn import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func
from flashattn.interface import _flash_attn_forward
from flashattn.philox import dropout_keep_mask
from flashattn.reference import attention_ref

# name -> options of flash_attn_func; "alibi" picks slopes of shape (H,) or (B, H).
FEATURES = {
    "window-left": {"window_size": (37, -1)},
    "window-right": {"window_size": (-1, 11)},
    "window-both": {"window_size": (19, 5)},
    "window-0-0": {"window_size": (0, 0)},
    "causal-window": {"causal": True, "window_size": (40, -1)},
    "causal-ignores-right": {"causal": True, "window_size": (25, 9)},
    "softcap": {"softcap": 2.5},
    "softcap-saturated": {"softcap": 0.5, "softmax_scale": 1.0},
    "window-softcap": {"window_size": (30, 3), "softcap": 1.5},
    "alibi-heads": {"alibi": "heads"},
    "alibi-batch-heads": {"alibi": "batch-heads"},
    "alibi-causal": {"alibi": "heads", "causal": True},
    "dropout": {"dropout_p": 0.17},
    "dropout-causal-window": {"dropout_p": 0.3, "causal": True, "window_size": (50, -1)},
    "everything": {"causal": True, "window_size": (45, 7), "softcap": 3.0, "alibi": "batch-heads", "dropout_p": 0.1},
    "causal-softcap": {"causal": True, "softcap": 1.0},
}
CPU_DTYPES = [torch.float16, torch.bfloat16, torch.float32]
GPU_DTYPES = [torch.float16, torch.bfloat16]
CPU_HEAD_DIMS = [32, 59, 64]
GPU_HEAD_DIMS = [40, 64, 128, 256]
CPU_SEQLENS = [(1, 1), (3, 203), (113, 203), (203, 113), (256, 256)]
GPU_SEQLENS = [(1, 1), (3, 799), (113, 203), (203, 113), (1024, 1023)]
# Plain and causal, with no window or score feature, for the sweeps of other files (feature_options
# takes these names too): the calls every kernel family serves, the sm90 backward included.
MASKS = {"plain": {}, "causal": {"causal": True}}
HEADS = [(4, 4), (4, 2), (4, 1)]  # (H, Hk): MHA, GQA, MQA
BATCH = 2
ALIBI_MAX = 0.3  # slopes in [0, 0.3): a bias of up to ~60 over 200 positions, far from flat or one-hot


def _case_id(feature, dtype, head_dim, seqlens, heads) -> str:
    name = str(dtype).removeprefix("torch.")
    return f"{feature}-{name}-d{head_dim}-q{seqlens[0]}k{seqlens[1]}-h{heads[0]}kv{heads[1]}"


def _cpu_cases() -> list:
    """Every feature x (Sq, Sk); dtype, head dim and (H, Hk) follow the sum of the indices, so
    that each meets every feature and length pair."""
    cases = []
    for (f, feature), (s, seqlens) in itertools.product(enumerate(FEATURES), enumerate(CPU_SEQLENS)):
        case = (feature, CPU_DTYPES[(f + s) % 3], CPU_HEAD_DIMS[(f + 2 * s) % 3], seqlens, HEADS[(f + s + 1) % 3])
        cases.append(pytest.param(*case, id=_case_id(*case)))
    return cases


def _gpu_cases() -> list:
    """Every feature x dtype x head dim x (Sq, Sk); (H, Hk) follows the sum of the indices."""
    cases = []
    for (f, feature), dtype, (d, head_dim), (s, seqlens) in itertools.product(
        enumerate(FEATURES), GPU_DTYPES, enumerate(GPU_HEAD_DIMS), enumerate(GPU_SEQLENS)
    ):
        case = (feature, dtype, head_dim, seqlens, HEADS[(f + d + s) % 3])
        cases.append(pytest.param(*case, id=_case_id(*case)))
    return cases


def feature_options(
    feature: str, batch: int, num_heads: int, device: str, seed: int
) -> tuple[bool, float | None, dict]:
    """(causal, softmax_scale or None, the op's other options) of a feature (or of a MASKS
    entry), with fresh ALiBi slopes and, for dropout, an rng_state of its own."""
    options = dict(FEATURES[feature] if feature in FEATURES else MASKS[feature])
    causal = options.pop("causal", False)
    scale = options.pop("softmax_scale", None)
    gen = torch.Generator(device=device).manual_seed(seed)
    if "alibi" in options:
        shape = (num_heads,) if options.pop("alibi") == "heads" else (batch, num_heads)
        options["alibi_slopes"] = ALIBI_MAX * torch.rand(shape, generator=gen, device=device)
    if options.get("dropout_p", 0) > 0:
        options["rng_state"] = torch.randint(0, 2**62, (2,), generator=gen, device=device)
    return causal, scale, options


def _check_forward(device, feature, dtype, head_dim, seqlens, heads, v_head_dim=None) -> None:
    """v_head_dim: v's head dim, when not head_dim (tests/test_mla_head_dims.py)."""
    dims = head_dim if v_head_dim is None else (head_dim, v_head_dim)
    seed = case_seed("features forward", device, feature, dtype, dims, seqlens, heads)
    q, k, v = random_qkv(BATCH, *seqlens, *heads, head_dim, dtype, device, seed, v_head_dim=v_head_dim)
    causal, scale, options = feature_options(feature, BATCH, heads[0], device, seed)
    scale = head_dim**-0.5 if scale is None else scale
    out, lse = run_forward(q, k, v, scale, causal, **options)
    assert_matches_reference(out, lse, q, k, v, scale, causal, **options)


def _check_backward(device, feature, dtype, head_dim, seqlens, heads, deterministic=False, v_head_dim=None) -> None:
    dims = head_dim if v_head_dim is None else (head_dim, v_head_dim)
    seed = case_seed("features backward", device, feature, dtype, dims, seqlens, heads)
    q, k, v = random_qkv(BATCH, *seqlens, *heads, head_dim, dtype, device, seed, v_head_dim=v_head_dim)
    dout = torch.randn(cpu.out_shape(q, v), generator=torch.Generator(device).manual_seed(seed + 1), dtype=dtype,
                       device=device)
    causal, scale, options = feature_options(feature, BATCH, heads[0], device, seed)
    scale = head_dim**-0.5 if scale is None else scale
    grads = run_backward(q, k, v, dout, scale, causal, deterministic, **options)
    assert_grads_match_reference(grads, q, k, v, dout, scale, causal, **options)


@pytest.mark.parametrize("feature, dtype, head_dim, seqlens, heads", _cpu_cases())
def test_forward_cpu(feature, dtype, head_dim, seqlens, heads):
    _check_forward("cpu", feature, dtype, head_dim, seqlens, heads)


@pytest.mark.parametrize("feature, dtype, head_dim, seqlens, heads", _cpu_cases())
def test_backward_cpu(feature, dtype, head_dim, seqlens, heads):
    _check_backward("cpu", feature, dtype, head_dim, seqlens, heads)


@pytest.mark.gpu
@pytest.mark.parametrize("feature, dtype, head_dim, seqlens, heads", _gpu_cases())
def test_forward_gpu(feature, dtype, head_dim, seqlens, heads):
    _check_forward("cuda", feature, dtype, head_dim, seqlens, heads)


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("feature, dtype, head_dim, seqlens, heads", _gpu_cases())
def test_backward_gpu(feature, dtype, head_dim, seqlens, heads, deterministic):
    _check_backward("cuda", feature, dtype, head_dim, seqlens, heads, deterministic)


# Softcap, alone and with masks, at the head dims that the sm90 backward runs padded on its d128
# kernel (65..96; the sweep above meets that kernel at d128 alone), dtype and (H, Hk) cycling; both
# dQ paths (deterministic: the dQ writer skips the reduce boxes past the head dim as the owner does).
PADDED_SOFTCAP_FEATURES = ["softcap", "softcap-saturated", "window-softcap", "causal-softcap"]
PADDED_HEAD_DIMS = [72, 80, 96]


def _padded_softcap_cases() -> list:
    cases = []
    for (f, feature), (d, head_dim), (s, seqlens) in itertools.product(
        enumerate(PADDED_SOFTCAP_FEATURES), enumerate(PADDED_HEAD_DIMS), enumerate(GPU_SEQLENS)
    ):
        case = (feature, GPU_DTYPES[(f + d + s) % 2], head_dim, seqlens, HEADS[(f + d + s) % 3])
        cases.append(pytest.param(*case, id=_case_id(*case)))
    return cases


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("feature, dtype, head_dim, seqlens, heads", _padded_softcap_cases())
def test_softcap_backward_padded_head_dims_gpu(feature, dtype, head_dim, seqlens, heads, deterministic):
    _check_backward("cuda", feature, dtype, head_dim, seqlens, heads, deterministic)


@pytest.mark.parametrize("seqlens", [(50, 70), (70, 50), (33, 33)], ids=lambda s: f"q{s[0]}k{s[1]}")
@pytest.mark.parametrize("feature", FEATURES)
def test_cpu_small_blocks(monkeypatch, feature, seqlens):
    """Small CPU tiles: windows skip whole key blocks (and query blocks in the backward), leave
    blocks inside the window unmasked and mask only those a window edge crosses; dropout is drawn
    block by block. Forward and backward, on small inputs."""
    monkeypatch.setattr(cpu, "BLOCK_M", 16)
    monkeypatch.setattr(cpu, "BLOCK_N", 8)
    _check_forward("cpu", feature, torch.bfloat16, 24, seqlens, (4, 1))
    _check_backward("cpu", feature, torch.float32, 24, seqlens, (4, 2))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "window_size, causal", [((2**40, 2**40), False), ((2**40, 3), False), ((2**35, -1), True)], ids=str
)
def test_windows_wider_than_any_sequence(device, window_size, causal):
    """Window sides past 2^31 (the kernels' int32) are unbounded in effect and accepted."""
    q, k, v = random_qkv(BATCH, 77, 130, 4, 2, 64, torch.bfloat16, device, case_seed(device, window_size, causal))
    out, lse = run_forward(q, k, v, 0.125, causal, window_size=window_size)
    assert_matches_reference(out, lse, q, k, v, 0.125, causal, window_size=window_size)
    assert torch.equal(flash_attn_func(q, k, v, softmax_scale=0.125, causal=causal, window_size=window_size), out)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seqlens, window_size", [((203, 113), (0, 0)), ((150, 40), (-1, 20)), ((37, 5), (3, 2))])
def test_window_rows_that_see_no_key(device, seqlens, window_size):
    """A right-bounded window with Sq > Sk leaves the leading Sq - Sk - right rows without a
    key: out 0, lse -inf, dq 0, exactly."""
    seed = case_seed("window blind rows", device, seqlens, window_size)
    q, k, v = random_qkv(BATCH, *seqlens, 4, 2, 64, torch.float16, device, seed)
    blind = blind_rows(*seqlens, False, window_size)
    assert blind > 0
    out, lse = run_forward(q, k, v, 0.125, False, window_size=window_size)
    assert torch.equal(out[:, :blind], torch.zeros_like(out[:, :blind]))
    assert torch.equal(lse[:, :, :blind], torch.full_like(lse[:, :, :blind], -math.inf))
    assert_matches_reference(out, lse, q, k, v, 0.125, False, window_size=window_size)
    dout = torch.randn_like(out)
    dq, _, _ = run_backward(q, k, v, dout, 0.125, False, window_size=window_size)
    assert torch.equal(dq[:, :blind], torch.zeros_like(dq[:, :blind]))


@pytest.mark.parametrize("device", DEVICES)
def test_alibi_slopes_of_any_layout(device):
    """(batch, nheads) slopes that are a transposed view give what their contiguous copy gives."""
    q, k, v = random_qkv(3, 50, 60, 4, 2, 32, torch.float16, device, case_seed("alibi layout", device))
    slopes = torch.rand(4, 3, device=device).t()  # (3, 4), not contiguous
    assert not slopes.is_contiguous()
    out = flash_attn_func(q, k, v, alibi_slopes=slopes)
    assert torch.equal(out, flash_attn_func(q, k, v, alibi_slopes=slopes.contiguous()))


def _reference_probs(q, k, softmax_scale, causal, upcast=True, **ref_options):
    """attention_ref's probabilities [B, H, Sq, Sk]: its output with v the identity (one value
    column per key), which leaves the reference as it is."""
    batch, seqlen_k, num_heads_k = k.shape[:3]
    eye = torch.eye(seqlen_k, dtype=q.dtype, device=q.device)[None, :, None].expand(batch, seqlen_k, num_heads_k, -1)
    out, _ = attention_ref(q, k, eye, softmax_scale, causal, upcast=upcast, **ref_options)
    return out.transpose(1, 2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("feature", ["window-both", "everything", "alibi-batch-heads", "dropout", "softcap"])
@pytest.mark.parametrize("seqlens", [(3, 113), (130, 67)], ids=lambda s: f"q{s[0]}k{s[1]}")
def test_return_attn_probs(device, feature, seqlens):
    """(out, softmax_lse, S_dmask) as FlashAttention-2 returns them: out and lse are the forward's;
    without dropout S_dmask is an empty (0,) tensor (nothing of size Sq x Sk); with dropout it is
    (B, H, Sq and Sk rounded up to 128) in q's dtype, 0 in the rounding, in FlashAttention-2's
    encoding: decoded as its tests decode it, the probabilities (undropped, 0 where masked) within
    the bound, the sign bit set exactly where the keep mask drops."""
    seed = case_seed("attn probs", device, feature, seqlens)
    q, k, v = random_qkv(BATCH, *seqlens, 4, 2, 48, torch.bfloat16, device, seed)
    causal, scale, options = feature_options(feature, BATCH, 4, device, seed)
    public = {key: value for key, value in options.items() if key != "rng_state"}
    torch.manual_seed(seed)
    out, lse, probs = flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, return_attn_probs=True, **public)
    scale = 48**-0.5 if scale is None else scale
    if "rng_state" in options:
        torch.manual_seed(seed)
        options["rng_state"] = torch.randint(0, 2**62, (2,), dtype=torch.int64, device=device)
    want_out, want_lse = _flash_attn_forward(q, k, v, scale, causal, **options)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    if "rng_state" not in options:
        assert probs.shape == (0,) and probs.dtype == q.dtype
        return

    rounded = tuple(-(-n // 128) * 128 for n in seqlens)
    assert probs.shape == (BATCH, 4, *rounded) and probs.dtype == q.dtype
    padding = probs.clone()
    padding[:, :, : seqlens[0], : seqlens[1]] = 0
    assert torch.equal(padding, torch.zeros_like(padding)), "S_dmask: nonzero in the rounding"
    no_dropout = {key: value for key, value in reference_options(q, k, options).items() if "dropout" not in key}
    accurate = _reference_probs(q.float(), k.float(), scale, causal, **no_dropout)
    lowp = _reference_probs(q, k, scale, causal, upcast=False, **no_dropout)
    decoded = decode_s_dmask(probs, accurate, 48)
    err, bound = max_abs_diff(decoded, accurate), 2 * max_abs_diff(lowp, accurate) + 1e-5
    assert err <= bound, f"S_dmask decoded: max error {err:.3g} > bound {bound:.3g}"
    assert torch.equal(decoded == 0, accurate == 0), "S_dmask: masked entries elsewhere"
    dropped = torch.signbit(probs[:, :, : seqlens[0], : seqlens[1]])
    keep = dropout_keep_mask(options["rng_state"], options["dropout_p"], range(seqlens[0]), range(seqlens[1]), 4,
                             range(BATCH))  # fmt: skip
    assert torch.equal(dropped, ~keep)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dropout_p", [0.1, 0.5])
def test_dropped_fraction(device, dropout_p):
    """The fraction of probabilities S_dmask marks dropped is dropout_p within 0.01 (2 x 4 x 256 x 256
    draws: the sampling noise is ~1e-3)."""
    q, k, v = random_qkv(2, 256, 256, 4, 4, 32, torch.float16, device, case_seed("fraction", device, dropout_p))
    _, _, probs = flash_attn_func(q, k, v, dropout_p=dropout_p, return_attn_probs=True)
    dropped = torch.signbit(probs[:, :, :256, :256]).double().mean().item()
    assert abs(dropped - dropout_p) < 0.01, dropped


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_dropout_follows_torch_seed(device, causal):
    """Dropout draws its seed with torch.randint once per call: torch.manual_seed gives the same
    output and gradients again, another seed another output; and the output is the forward's with
    the rng_state that torch.randint draws after the same manual_seed."""
    q, k, v = random_qkv(2, 130, 150, 4, 2, 64, torch.bfloat16, device, case_seed("seed", device, causal))
    leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
    dout = torch.randn_like(q)
    results = []
    for seed in (11, 11, 12):
        torch.manual_seed(seed)
        out = flash_attn_func(*leaves, dropout_p=0.25, causal=causal, deterministic=True)
        results.append((out, *torch.autograd.grad(out, leaves, dout)))
    for name, first, again, other in zip(("out", "dq", "dk", "dv"), *results):
        assert torch.equal(first, again), f"{name} differs under the same seed"
        assert not torch.equal(first, other), f"{name} is the same under another seed"
    torch.manual_seed(11)
    rng_state = torch.randint(0, 2**62, (2,), dtype=torch.int64, device=device)
    out, _ = _flash_attn_forward(q, k, v, 64**-0.5, causal, dropout_p=0.25, rng_state=rng_state)
    assert torch.equal(results[0][0], out)


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_backward_is_reproducible(device):
    """The backward redraws the forward's mask: with deterministic=True, two backward passes on one
    rng_state give the same bits; and the kept/dropped pattern shows in dv: a value row whose key
    every query dropped gets dv 0."""
    seed = case_seed("dropout backward", device)
    q, k, v = random_qkv(2, 3, 300, 4, 4, 64, torch.float16, device, seed)
    dout = torch.randn_like(q)
    rng_state = torch.tensor([seed, 1], dtype=torch.int64, device=device)
    options = {"dropout_p": 0.6, "rng_state": rng_state}
    first = run_backward(q, k, v, dout, 0.125, False, True, **options)
    again = run_backward(q, k, v, dout, 0.125, False, True, **options)
    for name, grad, want in zip(("dq", "dk", "dv"), first, again):
        assert torch.equal(grad, want), name
    keep = dropout_keep_mask(rng_state, 0.6, range(3), range(300), 4, range(2))  # [B, H, Sq, Sk]
    never_kept = ~keep.any(dim=2)  # [B, H, Sk]: no query of head h keeps key j
    dv = first[2].transpose(1, 2)  # [B, Hk = H, Sk, D]
    assert never_kept.any()
    assert torch.equal(dv[never_kept], torch.zeros_like(dv[never_kept]))
    assert (dv[~never_kept].abs().amax(dim=-1) > 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("feature", ["everything", "window-softcap", "alibi-batch-heads"])
def test_packed_functions_take_every_option(device, feature):
    """flash_attn_qkvpacked_func and flash_attn_kvpacked_func with every option (dropout under one
    torch seed) equal flash_attn_func on the slices, out and gradients, return_attn_probs included."""
    seed = case_seed("packed options", device, feature)
    gen = torch.Generator(device=device).manual_seed(seed)
    qkv = torch.randn(BATCH, 150, 3, 4, 64, generator=gen, dtype=torch.bfloat16, device=device)
    causal, scale, options = feature_options(feature, BATCH, 4, device, seed)
    options.pop("rng_state", None)
    kwargs = {"softmax_scale": scale, "causal": causal, "deterministic": True, **options}
    dout = torch.randn(BATCH, 150, 4, 64, generator=gen, dtype=torch.bfloat16, device=device)

    def run(func, *tensors):
        leaves = tuple(t.detach().requires_grad_() for t in tensors)
        torch.manual_seed(seed)
        out, lse, probs = func(*leaves, return_attn_probs=True, **kwargs)
        return (out, lse, probs, *torch.autograd.grad(out, leaves, dout))

    out, lse, probs, dq, dk, dv = run(flash_attn_func, *qkv.unbind(dim=2))
    packed = run(flash_attn_qkvpacked_func, qkv)
    assert all(torch.equal(a, b) for a, b in zip(packed, (out, lse, probs, torch.stack((dq, dk, dv), dim=2))))
    kv_packed = run(flash_attn_kvpacked_func, qkv[:, :, 0], qkv[:, :, 1:])
    assert all(torch.equal(a, b) for a, b in zip(kv_packed, (out, lse, probs, dq, torch.stack((dk, dv), dim=2))))
