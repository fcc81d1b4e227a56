"""Modules on flashattn's kernels.

MultiheadAttention           ``torch.nn.MultiheadAttention`` computed with ``flash_attn_func``: same
                             arguments, parameters, state_dict, initialisation and results.
convert_multihead_attention  swaps every ``torch.nn.MultiheadAttention`` of a model for it, keeping the weights.
MHA                          an attention block for new models, as FlashAttention-2's
                             ``flash_attn.modules.mha.MHA``: fused QKV projection, GQA/MQA, rotary, causal.
RotaryEmbedding              rotary position embeddings, rotating halves or interleaved pairs.
FallbackWarning              what MultiheadAttention warns, once per reason, when a call runs torch's path.
"""

import math
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._extension import NOT_BUILT_REASON, unsupported_gpu_reason
from .cpu import CPU_DTYPES, CUDA_DTYPES, MAX_HEAD_DIM
from .interface import flash_attn_func, flash_attn_varlen_func
from .kvcache import KVCache, apply_rotary_emb
from .padding import unpad_input

__all__ = ["MHA", "FallbackWarning", "MultiheadAttention", "RotaryEmbedding", "convert_multihead_attention"]


_NAME = "flashattn.nn.MultiheadAttention"


class FallbackWarning(UserWarning):
    """A call of flashattn.nn.MultiheadAttention ran torch's own forward: exact, without flashattn's kernels."""


# Reasons already warned about: each is warned once per process.
_warned_reasons: set[str] = set()


def _warn_fallback(reason: str) -> None:
    if reason in _warned_reasons:
        return
    _warned_reasons.add(reason)
    warnings.warn(
        f"{_NAME}: {reason}, so this call runs torch.nn.MultiheadAttention's forward "
        "(exact, without flashattn's kernels). Warned once per reason.",
        FallbackWarning,
        stacklevel=2,
    )


@dataclass(frozen=True)
class _FlashPlan:
    """How a MultiheadAttention call runs on flash_attn_func."""

    causal: bool  # torch's is_causal: top-left aligned
    keep: Tensor | None  # [N, S] bool, True for the keys each sequence attends to; None: every key
    dropout_p: float = 0.0  # the module's dropout in training, 0 in eval


class MultiheadAttention(nn.MultiheadAttention):
    """``torch.nn.MultiheadAttention`` computed with flashattn's ``flash_attn_func``.

    A subclass that overrides only ``forward``: the constructor, parameters,
    state_dict keys, initialisation, forward arguments and return values are
    torch's, so checkpoints load either way and ``isinstance`` checks still hold.
    A call runs on flash_attn_func when it can be computed exactly there:

    - ``need_weights=False``. torch's default ``need_weights=True`` returns the
      (L, S) attention weights, which flashattn never forms, so it takes torch's
      path: pass ``need_weights=False`` for speed, as for torch's own fast path.
    - No ``attn_mask``, or the causal one: ``is_causal=True`` (the hint is
      trusted, as torch's SDPA path trusts it; ``attn_mask`` may then be None,
      which torch refuses) or a 2-D mask equal to torch's causal mask. Causal is
      top-left aligned as in torch: query i sees keys j <= i.
    - ``key_padding_mask`` bool (True: ignore) or float (-inf: ignore, 0: keep):
      each sequence attends to its kept keys only. With a causal mask the kept
      keys must come first (right padding).
    - ``dropout`` in training runs as flashattn's dropout on the probabilities
      (a different random mask than torch's, with the same distribution).
    - No ``add_bias_kv`` or ``add_zero_attn``, head dim up to 512, a dtype
      flash_attn_func takes on the device (after autocast), no nested tensors.

    Any other call runs torch's forward, exact, with a ``FallbackWarning`` once
    per reason. A query whose keys are all padded gets 0 before ``out_proj``, as
    on torch's SDPA path (torch's ``need_weights=True`` path gives NaN).

    In eval mode without autograd, ``nn.TransformerEncoderLayer`` may run
    torch's fused encoder kernel without calling ``self_attn`` at all (exact,
    not flashattn); ``torch.backends.mha.set_fastpath_enabled(False)`` makes it
    call this module.
    """

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
    ) -> tuple[Tensor, Tensor | None]:
        """torch.nn.MultiheadAttention.forward's arguments, shapes and results; see the class docstring."""
        plan = self._flash_plan(query, key, value, key_padding_mask, need_weights, attn_mask, is_causal)
        if isinstance(plan, str):
            _warn_fallback(plan)
            if is_causal and attn_mask is None:  # torch requires the mask with the hint
                mask_dtype = torch.bool if key_padding_mask is None else key_padding_mask.dtype
                seqlens = (_seqlen(query, self.batch_first), _seqlen(key, self.batch_first))
                attn_mask = _causal_mask(*seqlens, query.device, mask_dtype)
            return super().forward(
                query, key, value, key_padding_mask, need_weights, attn_mask, average_attn_weights, is_causal
            )
        return self._flash_forward(query, key, value, plan), None

    def _flash_plan(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None,
        need_weights: bool,
        attn_mask: Tensor | None,
        is_causal: bool,
    ) -> _FlashPlan | str:
        """How this call runs on flash_attn_func, or why it cannot (the fallback's reason)."""
        if query.is_nested or key.is_nested or value.is_nested:
            return "nested tensor inputs are not supported"
        self._check_inputs(query, key, value, key_padding_mask, attn_mask)
        if need_weights:
            return "need_weights=True returns the attention weights (pass need_weights=False for speed)"
        if self.bias_k is not None:
            return "add_bias_kv=True is not supported"
        if self.add_zero_attn:
            return "add_zero_attn=True is not supported"
        if self.head_dim > MAX_HEAD_DIM:
            return f"head dim {self.head_dim} (embed_dim / num_heads) is over {MAX_HEAD_DIM}"
        device_reason = _device_reason(query)
        if device_reason is not None:
            return device_reason
        # From here on the checks read the masks' values.
        causal = is_causal or (
            attn_mask is not None
            and _is_causal_mask(attn_mask, _seqlen(query, self.batch_first), _seqlen(key, self.batch_first))
        )
        if attn_mask is not None and not causal:
            return "attn_mask is not the causal mask"
        dropout_p = self.dropout if self.training else 0.0
        if key_padding_mask is None:
            return _FlashPlan(causal, keep=None, dropout_p=dropout_p)
        if key_padding_mask.dtype == torch.bool:
            keep = ~key_padding_mask
        else:
            keep = key_padding_mask == 0
            if not (keep | (key_padding_mask == -math.inf)).all():
                return "a float key_padding_mask holds values other than 0 and -inf"
        keep = keep.reshape(-1, keep.shape[-1])  # [N, S]; unbatched: N = 1
        if causal and not _kept_keys_come_first(keep):
            return "with a causal mask, key_padding_mask pads other keys than the last ones"
        return _FlashPlan(causal, keep, dropout_p)

    def _check_inputs(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None,
        attn_mask: Tensor | None,
    ) -> None:
        """The checks of torch's forward, as errors that name the argument."""
        if query.dim() not in (2, 3):
            raise ValueError(f"{_NAME}: query must be 3-D (batched) or 2-D (unbatched), got {_shape(query)}")
        features_of = {"query": self.embed_dim, "key": self.kdim, "value": self.vdim}
        for (arg, features), tensor in zip(features_of.items(), (query, key, value)):
            if tensor.dim() != query.dim():
                raise ValueError(f"{_NAME}: {arg} must be {query.dim()}-D like query, got {_shape(tensor)}")
            if tensor.shape[-1] != features:
                raise ValueError(f"{_NAME}: {arg} must have {features} features (last dim), got {_shape(tensor)}")
        if key.shape[:-1] != value.shape[:-1]:
            raise ValueError(f"{_NAME}: key {_shape(key)} and value {_shape(value)} differ in length or batch size")
        batched = query.dim() == 3
        batch_dim = 0 if self.batch_first else 1
        if batched and query.shape[batch_dim] != key.shape[batch_dim]:
            raise ValueError(f"{_NAME}: query {_shape(query)} and key {_shape(key)} differ in batch size")
        seqlen_q, seqlen_k = _seqlen(query, self.batch_first), _seqlen(key, self.batch_first)
        batch = query.shape[batch_dim] if batched else 1
        padding_shape = (batch, seqlen_k) if batched else (seqlen_k,)
        masks = (
            ("key_padding_mask", key_padding_mask, [padding_shape]),
            ("attn_mask", attn_mask, [(seqlen_q, seqlen_k), (batch * self.num_heads, seqlen_q, seqlen_k)]),
        )
        for arg, mask, shapes in masks:
            if mask is None:
                continue
            if mask.dtype != torch.bool and not mask.is_floating_point():
                raise TypeError(f"{_NAME}: {arg} must be bool or floating point, got {mask.dtype}")
            if tuple(mask.shape) not in shapes:
                accepted = " or ".join(map(str, shapes))
                raise ValueError(f"{_NAME}: {arg} must have shape {accepted}, got {_shape(mask)}")

    def _flash_forward(self, query: Tensor, key: Tensor, value: Tensor, plan: _FlashPlan) -> Tensor:
        batched = query.dim() == 3
        q, k, v = self._in_projection(query, key, value)  # [..., H, D], in the inputs' layout
        if not batched:
            q, k, v = (t.unsqueeze(0) for t in (q, k, v))
        elif not self.batch_first:
            q, k, v = (t.transpose(0, 1) for t in (q, k, v))  # views: flash_attn_func reads the strides
        out = _attention(q, k, v, plan)  # [N, L, H, D]
        if not batched:
            out = out.squeeze(0)
        elif not self.batch_first:
            out = out.transpose(0, 1)
        return F.linear(out.flatten(-2), self.out_proj.weight, self.out_proj.bias)

    def _in_projection(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k and v split into heads: [..., H, D]."""
        heads = (self.num_heads, self.head_dim)
        if self._qkv_same_embed_dim and query is key and key is value:
            # Self-attention: one matmul; q, k and v are views of its output.
            qkv = F.linear(query, self.in_proj_weight, self.in_proj_bias)
            return qkv.unflatten(-1, (3, *heads)).unbind(-3)
        if self._qkv_same_embed_dim:
            weights = self.in_proj_weight.chunk(3)
        else:
            weights = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)
        biases = (None,) * 3 if self.in_proj_bias is None else self.in_proj_bias.chunk(3)
        q, k, v = (F.linear(x, w, b).unflatten(-1, heads) for x, w, b in zip((query, key, value), weights, biases))
        return q, k, v


def _shape(x: Tensor) -> str:
    return f"shape {tuple(x.shape)}"


def _seqlen(x: Tensor, batch_first: bool) -> int:
    """The sequence length of a MultiheadAttention input: (L, E), (N, L, E) or (L, N, E)."""
    return x.shape[1] if x.dim() == 3 and batch_first else x.shape[0]


def _device_reason(query: Tensor) -> str | None:
    """Why flash_attn_func cannot take this call's projections (their device, their dtype), or None."""
    device = query.device
    if device.type not in ("cpu", "cuda"):
        return f"device {device.type} is not supported"
    if device.type == "cuda":
        reason = NOT_BUILT_REASON or unsupported_gpu_reason(device)
        if reason is not None:
            return f"flashattn's CUDA kernels cannot run ({reason})"
    dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else query.dtype
    accepted = CUDA_DTYPES if device.type == "cuda" else CPU_DTYPES
    if dtype not in accepted:
        return f"dtype {dtype} on {device.type} is not supported (accepted: {', '.join(map(str, accepted))})"
    return None


def _causal_mask(seqlen_q: int, seqlen_k: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """torch's causal attn_mask, hiding key j from query i when j > i: bool (True there) or float (-inf there)."""
    future = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device).triu(1)
    if dtype == torch.bool:
        return future
    return torch.zeros(seqlen_q, seqlen_k, dtype=dtype, device=device).masked_fill(future, -math.inf)


def _is_causal_mask(attn_mask: Tensor, seqlen_q: int, seqlen_k: int) -> bool:
    """Whether attn_mask is the 2-D causal mask."""
    return attn_mask.dim() == 2 and torch.equal(
        attn_mask, _causal_mask(seqlen_q, seqlen_k, attn_mask.device, attn_mask.dtype)
    )


def _kept_keys_come_first(keep: Tensor) -> bool:
    """Whether each row of keep [N, S] is True up to some length and False after it (right padding)."""
    positions = torch.arange(keep.shape[1], device=keep.device)
    return torch.equal(keep, positions < keep.sum(dim=1, keepdim=True))


def _attention(q: Tensor, k: Tensor, v: Tensor, plan: _FlashPlan) -> Tensor:
    """torch's attention of q [N, L, H, D] over k, v [N, S, H, D] under plan, on flashattn's kernels."""
    if plan.keep is None:
        return _top_left_attention(q, k, v, plan.causal, plan.dropout_p)
    return _attention_over_kept_keys(q, k, v, plan.keep, plan.causal, plan.dropout_p)


def _top_left_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool, dropout_p: float) -> Tensor:
    """flash_attn_func with torch's causal alignment: query i sees keys j <= i.

    flash_attn_func's causal mask is aligned to the bottom-right corner instead;
    the two agree when q and k have the same length.
    """
    if not causal:
        return flash_attn_func(q, k, v, dropout_p)
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    if seqlen_q <= seqlen_k:
        # Keys from seqlen_q on are in every query's future.
        return flash_attn_func(q, k[:, :seqlen_q], v[:, :seqlen_q], dropout_p, causal=True)
    # The first seqlen_k queries form a square causal block; the others see every key.
    head = flash_attn_func(q[:, :seqlen_k], k, v, dropout_p, causal=True)
    tail = flash_attn_func(q[:, seqlen_k:], k, v, dropout_p)
    return torch.cat((head, tail), dim=1)


def _attention_over_kept_keys(
    q: Tensor, k: Tensor, v: Tensor, keep: Tensor, causal: bool, dropout_p: float
) -> Tensor:
    """Attention of each sequence's queries over its kept keys only (keep [N, S]); exact, no mask.

    The kept keys and values are packed as flash_attn_varlen_func takes them,
    (total_k, H, D) with per-sequence lengths, and every sequence runs in one
    call. With torch's top-left causal mask (kept keys first, checked by the
    plan), query i of a sequence with n kept keys sees keys j <= i: keys from L
    (the query count) on are never seen, so a sequence keeps m = min(n, L)
    keys; its first m queries form a square causal block (where bottom-right
    and top-left agree) and the others see all m keys: two varlen calls.
    """
    if bool(keep.all()):
        return _top_left_attention(q, k, v, causal, dropout_p)
    num_seqs, seqlen_q = q.shape[:2]
    if causal:
        keep = keep & (torch.arange(keep.shape[1], device=keep.device) < seqlen_q)
    k_packed, indices, cu_k, max_kept, lengths = unpad_input(k, keep)  # [total_k, H, D]
    v_packed = v.flatten(0, 1).index_select(0, indices)
    if not causal:
        cu_q = torch.arange(0, (num_seqs + 1) * seqlen_q, seqlen_q, device=q.device, dtype=torch.int32)
        out = flash_attn_varlen_func(q.flatten(0, 1), k_packed, v_packed, cu_q, cu_k, seqlen_q, max_kept, dropout_p)
        return out.unflatten(0, (num_seqs, seqlen_q))
    # The square blocks have the kept keys' lengths, so cu_k is their offsets too.
    square = torch.arange(seqlen_q, device=q.device) < lengths.unsqueeze(1)  # [N, L]: query i < m
    cu_rest = F.pad((seqlen_q - lengths).cumsum(0), (1, 0)).to(torch.int32)
    out = q.new_empty(q.shape)
    out[square] = flash_attn_varlen_func(
        q[square], k_packed, v_packed, cu_k, cu_k, max_kept, max_kept, dropout_p, causal=True
    )
    out[~square] = flash_attn_varlen_func(
        q[~square], k_packed, v_packed, cu_rest, cu_k, seqlen_q - int(lengths.min()), max_kept, dropout_p
    )
    return out


def convert_multihead_attention(model: nn.Module) -> nn.Module:
    """Replaces every ``torch.nn.MultiheadAttention`` in model by ``flashattn.nn.MultiheadAttention``.

    Each replacement has the same configuration, parameters (taken over, not
    copied: no allocation, no random initialisation), requires_grad flags and
    training mode. Only modules of exactly that class are replaced, not
    subclasses. Convert before building an optimizer or registering hooks on
    the old modules: they hold the old Parameter objects. Returns model, or the
    replacement when model itself is a torch.nn.MultiheadAttention.
    """
    if type(model) is nn.MultiheadAttention:
        return _from_torch(model)
    for name, child in model.named_children():
        setattr(model, name, convert_multihead_attention(child))
    return model


def _from_torch(module: nn.MultiheadAttention) -> MultiheadAttention:
    with torch.device("meta"):
        converted = MultiheadAttention(
            module.embed_dim,
            module.num_heads,
            dropout=module.dropout,
            bias=module.in_proj_bias is not None,
            add_bias_kv=module.bias_k is not None,
            add_zero_attn=module.add_zero_attn,
            kdim=module.kdim,
            vdim=module.vdim,
            batch_first=module.batch_first,
        )
    converted.load_state_dict(module.state_dict(), assign=True)
    for new, old in zip(converted.parameters(), module.parameters()):
        new.requires_grad_(old.requires_grad)
    return converted.train(module.training)


class RotaryEmbedding(nn.Module):
    """Rotary position embeddings (RoFormer) on the first ``dim`` channels of every head.

    Channel pair i of the token at position p turns by the angle
    ``p * base ** (-2 * i / dim)``. ``interleaved=False`` pairs channel i with
    i + dim / 2 (GPT-NeoX, Llama in HF transformers); ``interleaved=True`` pairs
    neighbours 2i and 2i + 1 (GPT-J, Meta's Llama). Angles are computed in fp32
    at each call: no buffer, nothing in the state_dict, nothing for a
    ``.to(torch.bfloat16)`` of the model to round.
    """

    def __init__(self, dim: int, base: float = 10000.0, interleaved: bool = False) -> None:
        super().__init__()
        if dim <= 0 or dim % 2:
            raise ValueError(f"RotaryEmbedding: dim must be a positive even number, got {dim}")
        self.dim = dim
        self.base = base
        self.interleaved = interleaved

    def forward(self, q: Tensor, k: Tensor, seqlen_offset: int = 0) -> tuple[Tensor, Tensor]:
        """q (batch, seqlen_q, nheads, headdim) and k (batch, seqlen_k, nheads_k, headdim), rotated.

        Row s is at position seqlen_offset + s: decoding with a KV cache passes
        the number of tokens already cached.
        """
        return self.rotate(q, seqlen_offset), self.rotate(k, seqlen_offset)

    def cos_sin(self, seqlen: int, device: torch.device | str | None = None, seqlen_offset: int = 0):
        """(cos, sin) of positions seqlen_offset .. seqlen_offset + seqlen - 1: fp32 (seqlen, dim / 2),
        the tables flash_attn_with_kvcache and apply_rotary_emb take."""
        positions = torch.arange(seqlen_offset, seqlen_offset + seqlen, device=device, dtype=torch.float32)
        inv_freq = self.base ** -(torch.arange(0, self.dim, 2, device=device, dtype=torch.float32) / self.dim)
        angles = torch.outer(positions, inv_freq)
        return angles.cos(), angles.sin()

    def rotate(self, x: Tensor, seqlen_offset: int = 0) -> Tensor:
        """x (batch, seqlen, nheads, headdim) rotated, in x's dtype; channels from dim on unchanged."""
        if x.shape[-1] < self.dim:
            raise ValueError(f"RotaryEmbedding: head dim {x.shape[-1]} is smaller than the rotary dim {self.dim}")
        cos, sin = self.cos_sin(x.shape[1], x.device, seqlen_offset)  # rows = x's positions
        return apply_rotary_emb(x, cos, sin, self.interleaved)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base}, interleaved={self.interleaved}"


class MHA(nn.Module):
    """Multi-head attention for new models, on flash_attn_func: (batch, seqlen, embed_dim) in and out.

    FlashAttention-2's ``flash_attn.modules.mha.MHA``: the constructor arguments
    it shares with it and the parameter names (``Wqkv``, or ``Wq`` and ``Wkv``
    with ``cross_attn``; ``out_proj``) are FlashAttention-2's, so its
    checkpoints load. The Wqkv output holds q, then k, then v, head after head.

    Args:
        embed_dim: model width; a multiple of num_heads.
        num_heads: query heads; head dim = embed_dim // num_heads, at most 512.
        num_heads_kv: key/value heads (GQA/MQA), a divisor of num_heads; default num_heads.
        cross_attn: queries from x, keys and values from forward's x_kv.
        qkv_proj_bias, out_proj_bias: biases of the projections.
        dropout: attention dropout on the probabilities, in training only.
        softmax_scale: default 1 / sqrt(head dim).
        causal: query i sees keys j <= i + seqlen_k - seqlen_q (bottom-right aligned).
        window_size: (left, right) sliding window (see flash_attn_func), with or without causal.
        rotary_emb_dim: rotate the first rotary_emb_dim channels of q and k
            (0: no rotary embeddings); rotary_emb_base, rotary_emb_interleaved:
            see RotaryEmbedding.

    forward(x, kv_cache=cache, layer_idx=i) runs inference over a KVCache
    (flash_attn_with_kvcache, whose head dim is at most 256): see forward.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        num_heads_kv: int | None = None,
        cross_attn: bool = False,
        qkv_proj_bias: bool = True,
        out_proj_bias: bool = True,
        dropout: float = 0.0,
        softmax_scale: float | None = None,
        causal: bool = False,
        window_size: tuple[int, int] = (-1, -1),
        rotary_emb_dim: int = 0,
        rotary_emb_base: float = 10000.0,
        rotary_emb_interleaved: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        num_heads_kv = num_heads if num_heads_kv is None else num_heads_kv
        if num_heads <= 0 or embed_dim % num_heads:
            raise ValueError(f"MHA: embed_dim ({embed_dim}) must be a multiple of num_heads ({num_heads})")
        if num_heads_kv <= 0 or num_heads % num_heads_kv:
            raise ValueError(f"MHA: num_heads ({num_heads}) must be a multiple of num_heads_kv ({num_heads_kv})")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.num_heads_kv = num_heads_kv
        self.head_dim = embed_dim // num_heads
        if rotary_emb_dim > self.head_dim:
            raise ValueError(f"MHA: rotary_emb_dim ({rotary_emb_dim}) is larger than the head dim ({self.head_dim})")
        self.cross_attn = cross_attn
        self.dropout = dropout
        self.softmax_scale = softmax_scale
        self.causal = causal
        self.window_size = window_size
        self.rotary_emb = (
            RotaryEmbedding(rotary_emb_dim, rotary_emb_base, rotary_emb_interleaved) if rotary_emb_dim > 0 else None
        )
        factory = {"device": device, "dtype": dtype}
        kv_dim = 2 * num_heads_kv * self.head_dim
        if cross_attn:
            self.Wq = nn.Linear(embed_dim, embed_dim, bias=qkv_proj_bias, **factory)
            self.Wkv = nn.Linear(embed_dim, kv_dim, bias=qkv_proj_bias, **factory)
        else:
            self.Wqkv = nn.Linear(embed_dim, embed_dim + kv_dim, bias=qkv_proj_bias, **factory)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=out_proj_bias, **factory)

    def forward(self, x: Tensor, x_kv: Tensor | None = None, kv_cache: KVCache | None = None,
                layer_idx: int = 0) -> Tensor:
        """x (batch, seqlen, embed_dim) -> (batch, seqlen, embed_dim); with cross_attn, keys and values
        come from x_kv (batch, seqlen_k, embed_dim).

        Inference with a cache (self-attention): pass a flashattn.kvcache.KVCache and this layer's
        index; x holds the new tokens only (the prompt, then one token per step). Their keys and values
        are appended to the cache at its current lengths (rotary applied at those positions, in the
        kernel) and the queries attend to everything cached. Call kv_cache.advance(x.shape[1]) once
        per step, after the last layer.
        """
        if self.cross_attn != (x_kv is not None):
            raise ValueError(
                f"MHA(cross_attn={self.cross_attn}): forward takes x_kv "
                + ("(the keys' and values' input), got None" if self.cross_attn else "only with cross_attn=True")
            )
        q, k, v = self._project(x, x_kv)
        if kv_cache is not None:
            if self.cross_attn:
                raise ValueError("MHA: kv_cache is for self-attention (cross_attn=False)")
            rotary = {}
            if self.rotary_emb is not None:
                cos, sin = self.rotary_emb.cos_sin(kv_cache.max_seqlen, x.device)
                rotary = {"rotary_cos": cos, "rotary_sin": sin, "rotary_interleaved": self.rotary_emb.interleaved}
            out = kv_cache.attend(layer_idx, q, k, v, softmax_scale=self.softmax_scale, causal=self.causal,
                                  window_size=self.window_size, **rotary)
            return self.out_proj(out.flatten(-2))
        if self.rotary_emb is not None:
            q, k = self.rotary_emb(q, k)
        out = flash_attn_func(
            q,
            k,
            v,
            dropout_p=self.dropout if self.training else 0.0,
            softmax_scale=self.softmax_scale,
            causal=self.causal,
            window_size=self.window_size,
        )
        return self.out_proj(out.flatten(-2))

    def _project(self, x: Tensor, x_kv: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """q (batch, seqlen, num_heads, head_dim); k, v (batch, seqlen_k, num_heads_kv, head_dim): views, no copy."""
        head_dim = self.head_dim
        if self.cross_attn:
            q = self.Wq(x).unflatten(-1, (self.num_heads, head_dim))
            k, v = self.Wkv(x_kv).unflatten(-1, (2, self.num_heads_kv, head_dim)).unbind(-3)
            return q, k, v
        sizes = (self.num_heads * head_dim, self.num_heads_kv * head_dim, self.num_heads_kv * head_dim)
        q, k, v = self.Wqkv(x).split(sizes, dim=-1)
        return q.unflatten(-1, (-1, head_dim)), k.unflatten(-1, (-1, head_dim)), v.unflatten(-1, (-1, head_dim))
