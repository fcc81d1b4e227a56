"""The naive reference attention, imported by tests and benchmarks alike.

It materialises the full [Sq, Sk] score matrix: simple enough to trust, and
the yardstick of the error bound. With ``upcast=True`` it is the accurate
answer (everything in fp32); with ``upcast=False`` it is "PyTorch doing the
same math in the input dtype", whose error our kernels must stay within twice
of (see tests/helpers.py).
"""

import math

import torch
from torch import Tensor

__all__ = ["attention_ref"]


def attention_ref(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    upcast: bool = True,
    dropout_p: float = 0.0,
    dropout_mask: Tensor | None = None,
    learnable_sink: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Attention with the layouts and semantics of flash_attn_func, the slow obvious way.

    Args:
        q: (batch, seqlen_q, nheads, headdim); k: (batch, seqlen_k, nheads_k, headdim); v:
            (batch, seqlen_k, nheads_k, headdim_v), headdim_v any (DeepSeek MLA's is smaller than
            headdim); nheads a multiple of nheads_k (k/v heads are repeated for GQA/MQA).
        softmax_scale: default 1 / sqrt(headdim).
        causal: bottom-right aligned: query i sees key j iff j <= i + seqlen_k - seqlen_q.
        window_size: (left, right): query i sees keys in [d - left, d + right] with
            d = i + seqlen_k - seqlen_q; -1 leaves that side unbounded. causal sets right to 0.
        softcap: if > 0, scores become softcap * tanh(scores / softcap).
        alibi_slopes: fp32 (nheads,) or (batch, nheads); adds -slope * |d - j|.
        upcast: True computes everything in fp32 (float64 inputs: in float64) and
            returns out in that dtype. False computes q @ k^T and probs @ v in the
            input dtype, the softmax in fp32 with its probabilities cast to the
            input dtype, and returns out in the input dtype: PyTorch's own
            low-precision error.
        dropout_p, dropout_mask: dropout with a given keep mask, bool (batch, nheads,
            seqlen_q, seqlen_k), True where kept (flashattn.philox.dropout_keep_mask
            draws the one the kernels use): out uses the probabilities times
            mask / (1 - dropout_p); softmax_lse stays the undropped one.
        learnable_sink: fp32 (nheads,): a per-head logit that joins every row's softmax
            denominator and carries no value (gpt-oss's sinks, FlashAttention-4's argument).
            It is used as given: not multiplied by softmax_scale, not capped, no ALiBi bias
            (it is in the units of the final scores). Row probabilities become
            exp(s_ij - lse_i) with lse_i = log(sum_j exp(s_ij) + exp(sink_h)); a row that
            sees no key gets out 0 and lse sink_h. Differentiable: autograd on this
            function gives d sink (and, through softmax_lse, d lse).

    Returns:
        out (batch, seqlen_q, nheads, headdim_v) and softmax_lse (batch, nheads, seqlen_q):
        the natural-log log-sum-exp of the scaled, capped, biased and masked scores
        (with upcast=False, of the scores computed in the input dtype), in fp32
        (float64 for float64 inputs), the sink included when given. A row that sees
        no key gets out 0 and softmax_lse -inf (with a sink: sink_h).

    Order of operations: scale, softcap, ALiBi bias, mask, softmax, dropout.
    """
    probs, v, softmax_lse = attention_probs(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes,
                                            upcast, dropout_p, dropout_mask, learnable_sink)
    out = torch.einsum("bhqk,bkhd->bqhd", probs.to(v.dtype), v)
    return out, softmax_lse


def attention_probs(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    upcast: bool = True,
    dropout_p: float = 0.0,
    dropout_mask: Tensor | None = None,
    learnable_sink: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """attention_ref's probabilities [B, H, Sq, Sk] (dropped and rescaled with dropout; in the
    softmax's dtype, before attention_ref casts them to v's), v with its heads repeated to q's
    [B, Sk, H, Dv] in the dtype P V runs in, and softmax_lse: attention_ref is P V of these."""
    seqlen_q, num_heads, head_dim = q.shape[1:]
    seqlen_k, num_heads_k = k.shape[1:3]
    scale = head_dim**-0.5 if softmax_scale is None else softmax_scale
    # The softmax runs in at least fp32; float64 inputs stay float64 throughout.
    softmax_dtype = torch.promote_types(q.dtype, torch.float32)
    compute_dtype = softmax_dtype if upcast else q.dtype
    q, k, v = (t.to(compute_dtype) for t in (q, k, v))
    k = k.repeat_interleave(num_heads // num_heads_k, dim=2)
    v = v.repeat_interleave(num_heads // num_heads_k, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k).to(softmax_dtype) * scale  # [B, H, Sq, Sk]
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    diagonal = _diagonal_distance(seqlen_q, seqlen_k, q.device)  # [Sq, Sk]
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(softmax_dtype).reshape(-1, num_heads, 1, 1)  # [B or 1, H, 1, 1]
        scores = scores - slopes * diagonal.abs()
    visible = _visible(diagonal, causal, window_size)
    scores = scores.masked_fill(~visible, -math.inf)
    if learnable_sink is None:
        softmax_lse = torch.logsumexp(scores, dim=-1)  # [B, H, Sq]
    else:
        # The sink is one more column of the softmax, without a value.
        sink = learnable_sink.to(softmax_dtype).reshape(1, num_heads, 1, 1).expand(*scores.shape[:-1], 1)
        softmax_lse = torch.logsumexp(torch.cat([scores, sink], dim=-1), dim=-1)  # [B, H, Sq]
    # Rows that see no key have lse -inf: subtract 0 there, giving probabilities 0, not NaN.
    offset = torch.where(softmax_lse == -math.inf, 0.0, softmax_lse)
    probs = torch.exp(scores - offset.unsqueeze(-1))
    if dropout_mask is not None:
        probs = probs.masked_fill(~dropout_mask, 0.0) / (1 - dropout_p)
    return probs, v, softmax_lse


def _diagonal_distance(seqlen_q: int, seqlen_k: int, device: torch.device) -> Tensor:
    """[Sq, Sk] signed distance j - (i + Sk - Sq) of key j from query i's diagonal key."""
    rows = torch.arange(seqlen_q, device=device).unsqueeze(-1) + (seqlen_k - seqlen_q)
    keys = torch.arange(seqlen_k, device=device)
    return keys - rows


def _visible(diagonal: Tensor, causal: bool, window_size: tuple[int, int]) -> Tensor:
    """[Sq, Sk] True where query i may attend to key j."""
    left, right = window_size
    if causal:
        right = 0
    visible = torch.ones_like(diagonal, dtype=torch.bool)
    if left >= 0:
        visible &= diagonal >= -left
    if right >= 0:
        visible &= diagonal <= right
    return visible
