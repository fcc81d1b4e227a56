"""FP8 inputs (torch.float8_e4m3fn) with FlashAttention-3's scaling factors.

q, k and v stored in e4m3 stand for stored value x descale: q_descale, k_descale and
v_descale are fp32 (batch, nheads_k) tensors, one factor per sequence and KV head (a query
head uses its KV head's q factor), or None for 1. The output is 16-bit (out_dtype: bf16 by
default, or fp16), the LSE fp32.

There is no FP8 kernel yet (issue 20): every family computes the same function on the
dequantised inputs, stored value x descale rounded to out_dtype, with the 16-bit kernels (CUDA)
or the PyTorch implementation (CPU). So the result is 16-bit attention's on those values, at
16-bit speed plus one pass over q, k and v. Forward only: nothing here is differentiable.
"""

import torch
from torch import Tensor

FP8_DTYPE = torch.float8_e4m3fn
OUT_DTYPES = (torch.bfloat16, torch.float16)
_DESCALES = ("q_descale", "k_descale", "v_descale")


def is_fp8(t: object) -> bool:
    return isinstance(t, Tensor) and t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz,
                                                 torch.float8_e5m2fnuz)


def dequantize(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    descales: dict[str, object],
    out_dtype: object,
    sequences: int | None = None,
    cu_seqlens_q: Tensor | None = None,
    cu_seqlens_k: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v as the 16-bit tensors the kernels take: unchanged when they are not FP8 (then no
    descale and no out_dtype may be given), else stored value x descale in out_dtype.

    Padded layout: q (batch, seqlen_q, nheads, headdim), k and v (batch, seqlen_k, nheads_k,
    headdim[_v]), descales (batch, nheads_k). Packed (varlen): q (total_q, nheads, headdim), k
    and v (total_k, nheads_k, ...), `sequences` sequences given by cu_seqlens_q and cu_seqlens_k,
    descales (sequences, nheads_k); rows past a sequence's end take factor 1 (their out is 0).
    Errors name the argument: ValueError or TypeError for a value, dtype or shape (RuntimeError
    for a device), NotImplementedError for gradients."""
    if not any(is_fp8(t) for t in (q, k, v)):
        given = [name for name, value in descales.items() if value is not None]
        if out_dtype is not None:
            given.append("out_dtype")
        if given:
            raise ValueError(f"flashattn: {', '.join(given)} apply to float8_e4m3fn q, k and v only; "
                             f"q is {q.dtype}")
        return q, k, v
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype != FP8_DTYPE:
            raise TypeError(f"flashattn: FP8 attention takes float8_e4m3fn q, k and v; {name} is {t.dtype}")
    if out_dtype is None:
        out_dtype = torch.bfloat16
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"flashattn: out_dtype must be torch.bfloat16 or torch.float16 for FP8 inputs, "
                         f"got {out_dtype!r}")
    if torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad
                                       for t in (q, k, v, *descales.values())):
        raise NotImplementedError("flashattn: FP8 attention is forward-only (q, k, v or a descale requires grad)")
    packed = sequences is not None
    rank = 3 if packed else 4
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != rank:
            layout = "(total, nheads, headdim)" if packed else "(batch, seqlen, nheads, headdim)"
            raise ValueError(f"flashattn: {name} must be {layout}, got shape {tuple(t.shape)}")
    batch = sequences if packed else q.shape[0]
    heads, heads_k = q.shape[-2], k.shape[-2]
    factors = {name: _checked_descale(name, value, batch, heads_k, q.device) for name, value in descales.items()}
    # Query head h uses KV head h * nheads_k // nheads (h // (nheads / nheads_k) where it divides;
    # where it does not, the operator refuses the shapes).
    q_heads = torch.arange(heads, device=q.device) * heads_k // max(heads, 1)
    q_factor = factors["q_descale"][:, q_heads]  # (batch, nheads)
    if packed:
        q_rows = _sequence_of_rows("cu_seqlens_q", cu_seqlens_q, q, batch)
        k_rows = _sequence_of_rows("cu_seqlens_k", cu_seqlens_k, k, batch)
        q_scale = _with_unit_row(q_factor)[q_rows]  # (total_q, nheads)
        k_scale = _with_unit_row(factors["k_descale"])[k_rows]
        v_scale = _with_unit_row(factors["v_descale"])[k_rows]
        shape = lambda s: s[:, :, None]  # noqa: E731
    else:
        q_scale, k_scale, v_scale = q_factor, factors["k_descale"], factors["v_descale"]
        shape = lambda s: s[:, None, :, None]  # noqa: E731
    return tuple((t.float() * shape(s)).to(out_dtype) for t, s in ((q, q_scale), (k, k_scale), (v, v_scale)))


def _checked_descale(name: str, value: object, batch: int, heads_k: int, device: torch.device) -> Tensor:
    """The descale as an fp32 (batch, nheads_k) tensor on device (None: ones)."""
    if value is None:
        return torch.ones(batch, heads_k, device=device)
    if not isinstance(value, Tensor):
        raise TypeError(f"flashattn: {name} must be a tensor or None, got {type(value).__name__}")
    if value.dtype != torch.float32:
        raise TypeError(f"flashattn: {name} must be float32, got {value.dtype}")
    if tuple(value.shape) != (batch, heads_k):
        raise ValueError(f"flashattn: {name} must have shape (batch, nheads_k) = {(batch, heads_k)}, "
                         f"got {tuple(value.shape)}")
    if value.device != device:
        raise RuntimeError(f"flashattn: {name} is on {value.device}, q on {device}")
    return value


def _with_unit_row(factors: Tensor) -> Tensor:
    """factors (batch, heads) with one more row of ones: the factor of rows no sequence owns."""
    return torch.cat([factors, factors.new_ones(1, factors.shape[1])])


def _sequence_of_rows(name: str, cu_seqlens: Tensor, rows_of: Tensor, batch: int) -> Tensor:
    """For each packed row of rows_of, the sequence that owns it by cu_seqlens, or batch for rows
    past the last one. A binary search on the device: no host read, any offsets give indices in
    range."""
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() != batch + 1 or cu_seqlens.device != rows_of.device:
        raise ValueError(f"flashattn: {name} must be a 1-D tensor of {batch + 1} offsets on {rows_of.device}, "
                         f"got shape {tuple(cu_seqlens.shape)} on {cu_seqlens.device}")
    positions = torch.arange(rows_of.shape[0], device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    return torch.searchsorted(cu_seqlens[1:].contiguous(), positions, right=True).clamp(max=batch)
