"""flashattn as a HuggingFace transformers attention implementation.

    import flashattn.integrations.transformers as fa_hf
    name = fa_hf.register()                       # "tiled_attention"
    model = AutoModelForCausalLM.from_config(config, attn_implementation=name)   # or
    model.set_attn_implementation(name)

transformers 5.x treats every implementation name containing "flash" as a request for its own
FlashAttention integrations (utils/generic.py: is_flash_attention_requested, then a check for the
flash_attn package or a hub kernel), so the name must not contain it: the default is
"tiled_attention". register() adds the attention function to AttentionInterface and, under the same
name, SDPA's boolean mask builder to AttentionMaskInterface, so the function receives either no mask
(pure causal or full attention, which it runs as flash_attn_func) or a boolean 4-D mask (True =
attend). A mask that is the causal or full pattern cut by a key-padding mask (left padding in
generation; any padding without causality), each optionally cut by the layer's sliding window, runs
as one flash_attn_varlen_func call over the kept keys. Nothing is dropped silently: the pattern is
checked element for element against the mask it came from.

What the models pass besides q, k, v and the mask is served by the kernels too:
- `sliding_window=W` (Mistral, gpt-oss's sliding layers; or the module's `sliding_window`):
  transformers' masks let query i see keys j with i - W < j <= i, W keys counting its own, which is
  flashattn's window_size=(W - 1, 0) with causal;
- `s_aux` (gpt-oss's sinks, one logit per query head that joins each row's softmax without a
  value): flashattn's learnable_sink, cast to fp32 (a differentiable cast: the sinks still train);
- a value head dim below the query's (DeepSeek-V2/V3's MLA, e.g. 192 and 128): v goes in as it is,
  and out comes back with v's head dim. No name of ours contains "flash", so transformers never pads
  v for us (5.17 pads it in its own flash integration only).
Any other mask, a `position_bias` or a value head dim above the query's runs the attention in plain
PyTorch the way transformers' eager functions do (softcap and sinks included), after a one-time
warning.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor

from ..interface import flash_attn_func, flash_attn_varlen_func
from ..padding import unpad_input

DEFAULT_NAME = "tiled_attention"
_warned: set[str] = set()


def register(name: str = DEFAULT_NAME) -> str:
    """Registers flashattn under `name` (which must not contain "flash", see the module doc); returns it."""
    if "flash" in name:
        raise ValueError(f"flashattn: transformers routes names containing 'flash' to its own FlashAttention "
                         f"integrations; pick another name than {name!r}")
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def _fallback(reason: str) -> None:
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"flashattn (transformers): {reason}; running plain PyTorch attention instead", stacklevel=3)


def attention_forward(module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                      dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None,
                      **kwargs) -> tuple[Tensor, None]:
    """transformers' attention signature: query (B, H, Sq, D), key (B, Hk, Sk, D), value (B, Hk, Sk, Dv), Dv <= D
    -> ((B, Sq, H, Dv), None)."""
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    window = kwargs.get("sliding_window") or getattr(module, "sliding_window", None)
    softcap = kwargs.get("softcap") or 0.0
    sinks = kwargs.get("s_aux")
    extras = {"softcap": softcap, "s_aux": sinks, "position_bias": kwargs.get("position_bias")}
    options = {"softmax_scale": scaling, "softcap": softcap,
               "window_size": (window - 1, -1) if window else (-1, -1),  # W keys: this one and W - 1 before
               "dropout_p": dropout if module.training else 0.0,
               "learnable_sink": sinks.float() if sinks is not None else None}
    seqlen_q, seqlen_k = query.shape[2], key.shape[2]
    if attention_mask is None and causal and seqlen_q > 1 and seqlen_k > seqlen_q:
        # As transformers' SDPA path: an empty static cache's slots past the prompt (top-left causal).
        key, value, seqlen_k = key[:, :, :seqlen_q], value[:, :, :seqlen_q], seqlen_q
    if extras["position_bias"] is not None or value.shape[-1] > query.shape[-1]:
        _fallback("a position_bias, or a value head dim above the query's, which flashattn's kernels do not take")
        if attention_mask is None:  # what flash_attn_func would mask: the causal (or full) pattern in the window
            every_key = torch.ones(query.shape[0], seqlen_k, dtype=torch.bool, device=query.device)
            attention_mask = _pattern(every_key, seqlen_q, causal, options["window_size"][0]).unsqueeze(1)
        return _eager(module, query, key, value, attention_mask, dropout, scaling, **extras), None
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # (B, S, H, D) views
    if attention_mask is None:
        return flash_attn_func(q, k, v, causal=causal and seqlen_q > 1, **options), None
    if attention_mask.dtype != torch.bool or attention_mask.dim() != 4 or attention_mask.shape[1] != 1:
        _fallback(f"an attention mask of dtype {attention_mask.dtype} and shape {tuple(attention_mask.shape)}")
        return _eager(module, query, key, value, attention_mask, dropout, scaling, **extras), None
    mask = attention_mask[:, 0, :, -seqlen_k:] if attention_mask.shape[-1] >= seqlen_k else None
    if mask is None or mask.shape[1] != seqlen_q:
        _fallback("an attention mask whose shape does not match the keys")
        return _eager(module, query, key, value, attention_mask, dropout, scaling, **extras), None
    keep = mask.any(dim=1)  # [B, Sk]: the keys some query sees
    for causal_pattern in (True, False):
        pattern = _pattern(keep, seqlen_q, causal_pattern, options["window_size"][0])
        if torch.equal(pattern, mask) and (not causal_pattern or _suffix(keep)):
            if bool(keep.all()):  # no padding, only the window (sliding layers): no keys to pack
                return flash_attn_func(q, k, v, causal=causal_pattern, **options), None
            return _varlen(q, k, v, keep, causal_pattern, options), None
    _fallback("an attention mask that is not the causal or full pattern cut by key padding")
    return _eager(module, query, key, value, attention_mask, dropout, scaling, **extras), None


def _pattern(keep: Tensor, seqlen_q: int, causal: bool, left: int) -> Tensor:
    """[B, Sq, Sk] bool: query i (at key position p = i + Sk - Sq) sees kept key j (j <= p if causal,
    j >= p - left if left >= 0)."""
    seqlen_k = keep.shape[1]
    keys = torch.arange(seqlen_k, device=keep.device)
    positions = torch.arange(seqlen_q, device=keep.device).unsqueeze(1) + seqlen_k - seqlen_q
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=keep.device)
    if causal:
        visible &= keys <= positions
    if left >= 0:
        visible &= keys >= positions - left
    return visible.unsqueeze(0) & keep.unsqueeze(1)


def _suffix(keep: Tensor) -> bool:
    """Whether each row keeps a contiguous run of keys ending at the last one (left padding)."""
    positions = torch.arange(keep.shape[1], device=keep.device)
    return torch.equal(keep, positions >= keep.shape[1] - keep.sum(dim=1, keepdim=True))


def _varlen(q: Tensor, k: Tensor, v: Tensor, keep: Tensor, causal: bool, options: dict) -> Tensor:
    """Every query of each sequence over its kept keys, one flash_attn_varlen_func call. With causal the
    kept keys are the sequence's last ones, so bottom-right alignment over them is the mask's."""
    batch, seqlen_q = q.shape[:2]
    k_packed, indices, cu_k, max_k, _ = unpad_input(k, keep)
    v_packed = v.flatten(0, 1).index_select(0, indices)
    cu_q = torch.arange(0, (batch + 1) * seqlen_q, seqlen_q, device=q.device, dtype=torch.int32)
    out = flash_attn_varlen_func(q.flatten(0, 1), k_packed, v_packed, cu_q, cu_k, seqlen_q, max_k,
                                 causal=causal, **options)
    return out.unflatten(0, (batch, seqlen_q))


def _eager(module, query, key, value, mask, dropout, scaling, softcap=0.0, s_aux=None, position_bias=None) -> Tensor:
    """Attention the plain way, as transformers' eager functions compute it: scale, softcap, bias,
    mask (bool: True attends; float: added), softmax in fp32 with the sinks (s_aux, one logit per
    head) as an extra column that is dropped after it, dropout in training."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = (query @ key.transpose(-1, -2)).float() * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    if position_bias is not None:
        scores = scores + position_bias
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    if s_aux is not None:
        sinks = s_aux.float().reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        probs = torch.softmax(torch.cat((scores, sinks), dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    probs = F.dropout(probs, p=dropout if module.training else 0.0)
    return (probs.to(value.dtype) @ value).transpose(1, 2)
