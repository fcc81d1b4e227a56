"""The reference against a tiny independent implementation, and the CPU operator against the reference.

The independent one loops over (batch, head, query row) in float64 Python
arithmetic, straight from the definitions of the masks, softcap and ALiBi.
"""

import itertools
import math

import pytest
import torch
from helpers import assert_matches_reference, case_seed, random_qkv, run_forward
from torch import Tensor

from flashattn import cpu
from flashattn.reference import attention_ref

FEATURES = {
    "plain": {},
    "causal": {"causal": True},
    "window-2-1": {"window_size": (2, 1)},
    "window-3-inf": {"window_size": (3, -1)},
    "window-inf-2": {"window_size": (-1, 2)},
    "window-0-0": {"window_size": (0, 0)},
    "causal-window-2": {"causal": True, "window_size": (2, -1)},
    "softcap": {"softcap": 1.5},
    "alibi-per-head": {"alibi_slopes": "heads"},
    "alibi-per-batch-head": {"alibi_slopes": "batch-heads"},
    "everything": {"causal": True, "window_size": (3, 1), "softcap": 2.0, "alibi_slopes": "batch-heads"},
}
SEQLENS = [(5, 9), (9, 5), (7, 7), (1, 6)]
HEADS = [(4, 4), (4, 2), (4, 1)]


def _loop_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    batch, seqlen_q, num_heads, _ = q.shape
    seqlen_k, num_heads_k = k.shape[1:3]
    qs, ks, vs = q.tolist(), k.tolist(), v.tolist()
    slopes = None if alibi_slopes is None else alibi_slopes.double().expand(batch, num_heads).tolist()
    left, right = window_size
    out = torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=torch.float64)
    lse = torch.full((batch, num_heads, seqlen_q), -math.inf, dtype=torch.float64)
    for b, h, i in itertools.product(range(batch), range(num_heads), range(seqlen_q)):
        kv_head = h // (num_heads // num_heads_k)
        diagonal = i + seqlen_k - seqlen_q
        logits = {}
        for j in range(seqlen_k):
            if (
                (causal and j > diagonal)
                or (left >= 0 and j < diagonal - left)
                or (right >= 0 and j > diagonal + right)
            ):
                continue
            s = scale * sum(a * c for a, c in zip(qs[b][i][h], ks[b][j][kv_head]))
            if softcap > 0:
                s = softcap * math.tanh(s / softcap)
            if slopes is not None:
                s -= slopes[b][h] * abs(diagonal - j)
            logits[j] = s
        if not logits:
            continue
        top = max(logits.values())
        total = sum(math.exp(s - top) for s in logits.values())
        lse[b, h, i] = top + math.log(total)
        for d in range(v.shape[-1]):
            out[b, i, h, d] = sum(math.exp(s - top) / total * vs[b][j][kv_head][d] for j, s in logits.items())
    return out, lse


def _slopes(kind: str, batch: int, num_heads: int, gen: torch.Generator) -> Tensor:
    shape = (num_heads,) if kind == "heads" else (batch, num_heads)
    return torch.rand(shape, generator=gen, dtype=torch.float32)


def _check_against_loop(seed: int, feature: str, seqlens: tuple[int, int], heads: tuple[int, int],
                        v_head_dim: int = 8) -> None:
    """attention_ref and _loop_attention on float64 inputs of head dim 8 (v's: v_head_dim) agree."""
    q, k, v = random_qkv(2, *seqlens, *heads, 8, torch.float64, "cpu", seed, v_head_dim=v_head_dim)
    options = dict(FEATURES[feature])
    if "alibi_slopes" in options:
        options["alibi_slopes"] = _slopes(
            options["alibi_slopes"], 2, heads[0], torch.Generator().manual_seed(seed)
        )
    scale = 0.9  # larger than 1/sqrt(8): sharper softmax, softcap's tanh far from linear
    out, lse = attention_ref(q, k, v, scale, **options)
    expected_out, expected_lse = _loop_attention(q, k, v, scale, **options)
    assert out.shape == (2, seqlens[0], heads[0], v_head_dim)
    torch.testing.assert_close(out, expected_out)
    torch.testing.assert_close(lse, expected_lse)


@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"h{h[0]}kv{h[1]}")
@pytest.mark.parametrize("seqlens", SEQLENS, ids=lambda s: f"q{s[0]}k{s[1]}")
@pytest.mark.parametrize("feature", FEATURES)
def test_reference_matches_loop(feature, seqlens, heads):
    _check_against_loop(case_seed(feature, seqlens, heads), feature, seqlens, heads)


@pytest.mark.parametrize("feature", ["plain", "causal", "everything"])
def test_reference_with_a_narrower_v_matches_loop(feature):
    """v of head dim 5 under q and k of 8 (DeepSeek MLA's shape of the problem): out has v's 5 columns."""
    _check_against_loop(case_seed("narrower v", feature), feature, (7, 9), (4, 2), v_head_dim=5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reference_low_precision_is_really_low_precision(dtype):
    """upcast=False, the yardstick of the error bound, computes in the input dtype and returns it."""
    q, k, v = random_qkv(2, 40, 30, 4, 2, 64, dtype, "cpu", case_seed(dtype))
    out_lowp, lse_lowp = attention_ref(q, k, v, causal=True, upcast=False)
    out_ref, lse_ref = attention_ref(q, k, v, causal=True)
    assert out_lowp.dtype == dtype and out_ref.dtype == torch.float32
    assert lse_lowp.dtype == lse_ref.dtype == torch.float32
    assert not out_lowp.isnan().any()
    assert torch.equal(out_lowp[:, :10].float(), torch.zeros_like(out_ref[:, :10]))  # rows that see no key
    assert (out_lowp.float() - out_ref).abs().max() > 0
    assert (lse_lowp - lse_ref)[lse_ref.isfinite()].abs().max() > 0


@pytest.mark.parametrize(
    "seqlens",
    [(300, 257), (257, 300), (129, 1), (1, 129), (400, 100), (100, 400)],
    ids=lambda s: f"q{s[0]}k{s[1]}",
)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_cpu_op_matches_reference(seqlens, causal):
    """fp32 inputs, against the float64 reference; lengths that leave tails and skip whole blocks."""
    q, k, v = random_qkv(2, *seqlens, 6, 2, 48, torch.float32, "cpu", case_seed(seqlens, causal))
    out, lse = run_forward(q, k, v, 48**-0.5, causal)
    assert_matches_reference(out, lse, q, k, v, 48**-0.5, causal)


@pytest.mark.parametrize("seqlens", [(50, 70), (70, 50), (33, 33)], ids=lambda s: f"q{s[0]}k{s[1]}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_cpu_op_small_blocks(monkeypatch, seqlens, causal):
    """Small tiles: many blocks, diagonal blocks, tails, and query blocks that see no key, on small inputs."""
    monkeypatch.setattr(cpu, "BLOCK_M", 16)
    monkeypatch.setattr(cpu, "BLOCK_N", 8)
    q, k, v = random_qkv(2, *seqlens, 4, 1, 24, torch.bfloat16, "cpu", case_seed(seqlens, causal))
    out, lse = run_forward(q, k, v, 0.3, causal)
    assert_matches_reference(out, lse, q, k, v, 0.3, causal)
