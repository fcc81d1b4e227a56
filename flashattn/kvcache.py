"""Inference over a KV cache: flash_attn_with_kvcache, apply_rotary_emb, and a small cache for generation loops.

``torch.ops.flashattn.fwd_kvcache`` (schema flashattn.ops.KVCACHE_SCHEMA) writes the new keys and values
into the cache in place (rotary applied to them and to the queries first, if given) and attends from q to
each sequence's cached keys; flash_attn_with_kvcache checks its Python arguments and calls it. On CUDA it
runs flashattn's kernels (an append kernel, then the forward over the cache, contiguous or paged, split
across the key sequence and merged by log-sum-exp when that fills the GPU better); on CPU tensors
_fwd_kvcache_cpu below, a PyTorch implementation of the same semantics on the blockwise CPU forward. Each
implementation checks the tensors it receives (README.md, "Where each argument is checked").
"""

from __future__ import annotations

import math
from numbers import Integral

import torch
from torch import Tensor

from .cpu import MAX_KVCACHE_HEAD_DIM, check_alibi_slopes, check_index_tensor, check_learnable_sink, check_same_device
from .cpu import check_tensor, check_v_head_dim, out_shape
from . import fp8
from .interface import _check_bool, _check_implementation, _check_softcap, _check_tensors
from .interface import _kernel_padding, _Padding, _pad, _resolve_softmax_scale, _window_sides
from .ops import KVCACHE_SCHEMA

__all__ = ["KVCACHE_SCHEMA", "KVCache", "apply_rotary_emb", "flash_attn_with_kvcache"]


def apply_rotary_emb(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    interleaved: bool = False,
    inplace: bool = False,
    seqlen_offsets: int | Tensor = 0,
) -> Tensor:
    """Rotary position embedding of x (batch, seqlen, nheads, headdim), FlashAttention-2's function.

    cos, sin: (seqlen_ro, rotary_dim / 2); the first rotary_dim channels of x rotate, the rest pass
    through. Row i of sequence b is at position i + seqlen_offsets (an int, or a (batch,) int tensor),
    which must be below seqlen_ro. interleaved=True rotates channel pairs (2j, 2j + 1) (GPT-J),
    False the halves (j, j + rotary_dim / 2) (GPT-NeoX). Differentiable; computed in fp32.
    """
    batch, seqlen, _, head_dim = x.shape
    rotary_dim = 2 * cos.shape[-1]
    if rotary_dim > head_dim:
        raise ValueError(f"apply_rotary_emb: rotary_dim (2 * cos.shape[-1] = {rotary_dim}) exceeds the head dim "
                         f"({head_dim})")
    positions = torch.arange(seqlen, device=x.device).unsqueeze(0)  # [1, S]
    offsets = seqlen_offsets if isinstance(seqlen_offsets, Tensor) else torch.tensor([seqlen_offsets], device=x.device)
    positions = positions + offsets.reshape(-1, 1).to(x.device)  # [B or 1, S]
    c = cos.float()[positions].unsqueeze(2)  # [B or 1, S, 1, rotary_dim / 2]
    s = sin.float()[positions].unsqueeze(2)
    rot, rest = x[..., :rotary_dim].float(), x[..., rotary_dim:]
    if interleaved:
        a, b = rot[..., 0::2], rot[..., 1::2]
        rotated = torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)
    else:
        a, b = rot.chunk(2, dim=-1)
        rotated = torch.cat((a * c - b * s, a * s + b * c), dim=-1)
    out = torch.cat((rotated.to(x.dtype), rest), dim=-1)
    if inplace:
        return x.copy_(out)
    return out


def flash_attn_with_kvcache(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k: Tensor | None = None,
    v: Tensor | None = None,
    rotary_cos: Tensor | None = None,
    rotary_sin: Tensor | None = None,
    cache_seqlens: int | Tensor | None = None,
    cache_batch_idx: Tensor | None = None,
    cache_leftpad: Tensor | None = None,
    block_table: Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: Tensor | None = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
    *,
    learnable_sink: Tensor | None = None,
    q_descale: Tensor | None = None,
    k_descale: Tensor | None = None,
    v_descale: Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Attention of q over a KV cache, after appending k and v to it in place (FlashAttention-2's function).

    Args:
        q: (batch, seqlen_q, nheads, headdim): one query per sequence when decoding, a few for
            speculative decoding or chunked prefill. headdim up to 256 here (the KV-cache kernels'
            largest; flash_attn_func and the varlen functions take up to 512).
        k_cache, v_cache: (batch_cache, seqlen_cache, nheads_k, headdim), or with block_table a paged
            cache (num_blocks, page_block_size, nheads_k, headdim) of pages of any size (16, 256, ...).
            v_cache's headdim may be smaller than q's and k_cache's (as flash_attn_func's v).
        k, v: (batch, seqlen_new, nheads_k, headdim) or None (v with v_cache's headdim): written into the
            cache at rows cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1 before attending.
        rotary_cos, rotary_sin: (seqlen_ro, rotary_dim / 2) or None: rotary embedding applied to k
            (position: its cache row, counted from row 0 whatever cache_leftpad is, as flash-attn does)
            and to q (positions cache_seqlens + i with causal or a window, all at cache_seqlens
            otherwise), interleaved or not
            (rotary_interleaved). Rotary positions must stay below seqlen_ro, checked on both: on CPU a
            ValueError, on CUDA as the other index values are (below).
        cache_seqlens: int or (batch,) int32: the keys already in each sequence's cache; None: the whole
            cache. The attention sees rows cache_leftpad[b] .. cache_seqlens[b] + seqlen_new - 1.
        cache_batch_idx: (batch,) int32: the cache row of each sequence (contiguous caches only).
        cache_leftpad: (batch,) int32: the first valid cache row of each sequence (at most cache_seqlens).
        block_table: (batch, max_blocks_per_seq) int32: the pages of each sequence, in order; only the
            entries it uses (j * page_block_size < cache_seqlens + seqlen_new) are read and checked, the
            rest may hold anything (padding such as -1).
        softmax_scale, causal, window_size, softcap, alibi_slopes: as flash_attn_func; causal and the
            window are bottom-right aligned with the cached keys (query i sits at key
            cache_seqlens + seqlen_new - seqlen_q + i).
        num_splits: split each sequence's keys across this many thread blocks, merged by log-sum-exp;
            0 picks a number that fills the GPU (decoding with a small batch needs it).
        return_softmax_lse: also return the LSE (batch, nheads, seqlen_q), fp32.
        learnable_sink: keyword-only; fp32 (nheads,) on q's device, or None: as flash_attn_func's
            (a per-head logit in every row's softmax denominator, without a value; the LSE includes
            it). Split-KV partial results leave it out; their merge adds it once.
        q_descale, k_descale, v_descale, out_dtype: keyword-only, for an FP8 cache (FlashAttention-3's
            names, as in flash_attn_func): k_cache and v_cache float8_e4m3fn (and k, v, appended as
            they are), q float8_e4m3fn or 16-bit; descales fp32 (batch, nheads_k) or None (1), real
            value = stored value x descale, a page or cache row taking the descale of the sequence that
            uses it (sequences that share one must share its descales); out_dtype bf16 (default) or
            fp16 for FP8 q, q's dtype for a 16-bit q. An FP8 q is dequantised first (it is small).
            On CUDA, decoding calls (up to 16 query rows per KV head: seqlen_q, or with seqlen_q 1 the
            query heads of a KV head) with head dims that are multiples of 16 run the FP8 KV-cache
            kernel (torch.ops.flashattn.fwd_kvcache_fp8, fp8.runs_kvcache_kernel): it reads the
            e4m3 cache (half a 16-bit cache's bytes) and converts it to q's dtype exactly, the
            descales applied in fp32, so its error is 16-bit attention's on the real values. Other
            calls (more query rows, other head dims, CPU) run 16-bit attention on dequantised
            copies of the whole caches (flashattn/fp8.py: the dequantising path), which is correct
            and slower than a 16-bit cache by those copies on every call. With rotary, the
            appended keys are dequantised, rotated in q's dtype and stored re-quantised with
            k_descale; the kernel attends to them as stored, the dequantising path to them before
            that rounding in the call that appends them.

    Returns out (batch, seqlen_q, nheads, v_cache's headdim), or (out, softmax_lse). Not differentiable
    (inference). The cache tensors are modified in place when k and v are given. Runs on CUDA
    (fp16/bf16) and on CPU tensors (fp16, bf16, fp32). On CUDA a headdim that is not a multiple of 8
    runs as FlashAttention-2 runs it: on zero-padded copies of q, k, v and the whole k_cache and
    v_cache, the appended rows then copied back into the caller's caches; that copies the caches on
    every call (slow: memory traffic of the whole cache, and its size again in memory). Head dims that
    are multiples of 8 run in place (v_cache's too, when it is narrower than k_cache). The index tensors are
    not read on the host (no synchronisation): on CUDA each kernel checks the values it reads where it
    reads them, and a value out of range (cache_seqlens + seqlen_new beyond the cache, cache_leftpad
    beyond cache_seqlens, cache_batch_idx or a used block_table entry outside k_cache, a rotary
    position at or past seqlen_ro) is clamped into its range, so nothing is read or written out of
    bounds, and recorded: the next flashattn call on the device, or flashattn.check_faults(),
    raises a RuntimeError naming the argument and the value; the bad call's outputs and appended
    rows are not valid, the CUDA context is unaffected. On CPU the same checks raise ValueError.
    """
    _check_tensors(q=q, k_cache=k_cache, v_cache=v_cache)
    _check_tensors(optional=True, k=k, v=v, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
                   cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad, block_table=block_table,
                   alibi_slopes=alibi_slopes, learnable_sink=learnable_sink)
    descales = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
    fp8_out_dtype = fp8.check_kvcache(q, k_cache, v_cache, k, v, descales, out_dtype)
    if fp8_out_dtype is not None and q.dtype == fp8.FP8_DTYPE:  # a query is small: dequantised whichever way
        factor = None if q_descale is None else fp8.query_factors(q_descale, q.shape[2], k_cache.shape[2])
        q, descales = fp8.times(q, factor, fp8_out_dtype), {**descales, "q_descale": None}
    fp8_kernel = fp8_out_dtype is not None and fp8.runs_kvcache_kernel(q, k_cache, v_cache, k, v, alibi_slopes)
    if fp8_out_dtype is not None and not fp8_kernel:
        return _fp8_kvcache(
            q, k_cache, v_cache, k, v, descales, fp8_out_dtype, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
            cache_seqlens=cache_seqlens, cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad,
            block_table=block_table, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
            softcap=softcap, rotary_interleaved=rotary_interleaved, alibi_slopes=alibi_slopes, num_splits=num_splits,
            return_softmax_lse=return_softmax_lse, learnable_sink=learnable_sink,
        )
    _check_implementation(q, "q")
    _check_bool(causal=causal, rotary_interleaved=rotary_interleaved)
    window_left, window_right = _window_sides(window_size)
    _check_softcap(softcap)
    if not isinstance(num_splits, Integral) or isinstance(num_splits, bool) or num_splits < 0:
        raise ValueError(f"flashattn: num_splits must be an int >= 0 (0: automatic), got {num_splits!r}")
    scale = _resolve_softmax_scale(softmax_scale, q.shape[-1] if q.dim() else 1)
    cache_seqlens = _seqlens_tensor(cache_seqlens, q, k_cache, block_table)
    arguments = [q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
                 block_table, scale, bool(causal), window_left, window_right, float(softcap),
                 bool(rotary_interleaved), alibi_slopes, int(num_splits), learnable_sink]  # fmt: skip

    if fp8_kernel:
        out, lse = torch.ops.flashattn.fwd_kvcache_fp8(*arguments[:5], descales["k_descale"], descales["v_descale"],
                                                       *arguments[5:])  # fmt: skip
        return (out, lse) if return_softmax_lse else out
    padding = _kernel_padding(q, (k_cache, v_cache), (k, v), max_head_dim=MAX_KVCACHE_HEAD_DIM)
    if not any(padding):
        out, lse = torch.ops.flashattn.fwd_kvcache(*arguments)
    else:
        out, lse = _fwd_kvcache_padded(arguments, padding)
    return (out, lse) if return_softmax_lse else out


def _fp8_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Tensor | None, v: Tensor | None,
                 descales: dict[str, Tensor | None], out_dtype: torch.dtype, **arguments: object):
    """flash_attn_with_kvcache over FP8 caches (fp8.check_kvcache accepted them; q 16-bit, an FP8 q
    dequantised by the caller) where the FP8 KV-cache kernel does not serve the call
    (fp8.runs_kvcache_kernel): the 16-bit function on dequantised copies of the caches and k, v
    (each cache row or page times the descale of the sequence that uses it), then the appended
    rows written into the FP8 caches: k and v as they
    are, or, with rotary, the rotated keys of the copy re-quantised. Index tensors are clamped
    wherever they are read here, so that a bad value reaches the 16-bit function's own checks (an
    error on CPU, a recorded fault on CUDA) rather than an indexing error; rows whose position or
    page is out of range are not written."""
    batch = q.shape[0]
    k_descale, v_descale = descales["k_descale"], descales["v_descale"]  # q: 16-bit already
    seqlen_new = 0 if k is None else k.shape[1]
    cache_seqlens, cache_batch_idx, block_table = (arguments[name] for name in ("cache_seqlens", "cache_batch_idx",
                                                                                 "block_table"))
    seqlens = _seqlens_tensor(cache_seqlens, q, k_cache, block_table)
    _check_kvcache_tensors(q, k_cache, v_cache, k, v, arguments["rotary_cos"], arguments["rotary_sin"], seqlens,
                           cache_batch_idx, arguments["cache_leftpad"], block_table, arguments["alibi_slopes"],
                           arguments["learnable_sink"], dtypes=False)
    ends = seqlens.long() + seqlen_new
    copies = [fp8.times(cache, fp8.cache_row_factors(descale, cache, batch, ends, cache_batch_idx, block_table),
                        out_dtype)
              for cache, descale in ((k_cache, k_descale), (v_cache, v_descale))]  # fmt: skip
    new = [None if t is None else fp8.times(t, d, out_dtype) for t, d in ((k, k_descale), (v, v_descale))]
    result = flash_attn_with_kvcache(q, *copies, *new, **arguments)
    if k is not None:
        pages, rows, in_range = _appended_rows(k_cache, seqlen_new, seqlens, cache_batch_idx, block_table)
        index, valid = (pages, rows), in_range[..., None, None]
        keys = k
        if arguments["rotary_cos"] is not None:  # the rotated keys, re-quantised (saturated at e4m3's largest)
            keys = copies[0][index].float()
            keys = keys if k_descale is None else keys / k_descale[:, None, :, None]
            keys = keys.clamp(-fp8.E4M3_MAX, fp8.E4M3_MAX).to(fp8.FP8_DTYPE)
        for cache, rows in ((k_cache, keys), (v_cache, v)):
            stored = cache.view(torch.uint8)
            stored[index] = torch.where(valid, rows.view(torch.uint8), stored[index])
    return result


def _fwd_kvcache_padded(arguments: list, padding: _Padding) -> tuple[Tensor, Tensor]:
    """fwd_kvcache on zero-padded copies of q, the caches and k, v (zero columns change neither q @ k^T
    nor the other columns of out), as FlashAttention-2 runs a head dim that is not a multiple of 8 (and,
    for now, as the kernels run a v head dim below q's); the rows the append wrote are then copied back
    into the caller's caches. A cache that needs no padding is used in place; a padded one is a whole
    copy, made on every call."""
    q, k_cache, v_cache, k, v = arguments[:5]
    padded = [_pad(t, padding.qk) for t in (q, k_cache, k)]
    padded_v_cache, padded_v = _pad(v_cache, padding.v), _pad(v, padding.v)
    out, lse = torch.ops.flashattn.fwd_kvcache(padded[0], padded[1], padded_v_cache, padded[2], padded_v,
                                               *arguments[5:])  # fmt: skip
    if k is not None:
        cache_seqlens, cache_batch_idx, block_table = arguments[7], arguments[8], arguments[10]
        pages, rows, _ = _appended_rows(k_cache, k.shape[1], cache_seqlens, cache_batch_idx, block_table)
        index = (pages, rows)
        for cache, copy in ((k_cache, padded[1]), (v_cache, padded_v_cache)):
            if copy is not cache:
                cache[index] = copy[index][..., : cache.shape[-1]]
    return out[..., : v_cache.shape[-1]], lse


def _appended_rows(cache: Tensor, seqlen_new: int, cache_seqlens: Tensor, cache_batch_idx: Tensor | None,
                   block_table: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """(index into cache's first dim, into its second) of the rows [cache_seqlens[b], + seqlen_new) of every
    sequence b, computed on the device (no sync), and which of them are the rows asked for (bool, [B,
    seqlen_new]). Clamped into the cache: where the kernels refused an out-of-range row, the clamped row
    holds what it held, and copying it back changes nothing."""
    num_rows, page_size = cache.shape[0], cache.shape[1]
    rows = cache_seqlens.long()[:, None] + torch.arange(seqlen_new, device=cache.device)  # [B, seqlen_new]
    if block_table is None:
        in_range = (rows >= 0) & (rows < page_size)
        batch = torch.arange(rows.shape[0], device=cache.device) if cache_batch_idx is None else cache_batch_idx.long()
        in_range &= ((batch >= 0) & (batch < num_rows))[:, None]
        return batch.clamp(0, num_rows - 1)[:, None].expand_as(rows), rows.clamp(0, page_size - 1), in_range
    capacity = block_table.shape[1] * page_size
    in_range = (rows >= 0) & (rows < capacity)
    rows = rows.clamp(0, capacity - 1)
    pages = block_table.long().gather(1, rows // page_size)
    in_range &= (pages >= 0) & (pages < num_rows)
    return pages.clamp(0, num_rows - 1), rows % page_size, in_range


def _seqlens_tensor(cache_seqlens: object, q: Tensor, k_cache: Tensor, block_table: Tensor | None) -> Tensor:
    """cache_seqlens as the operator takes it: a (batch,) int32 tensor (a tensor passes as it is)."""
    if isinstance(cache_seqlens, Tensor):
        return cache_seqlens
    if cache_seqlens is not None and (not isinstance(cache_seqlens, Integral) or isinstance(cache_seqlens, bool)):
        raise TypeError(f"flashattn: cache_seqlens must be an int or a (batch,) int32 tensor, got "
                        f"{type(cache_seqlens).__name__}")
    # The cache's rows per sequence; 0 for malformed tensors, which the operator refuses.
    paged = block_table is not None
    shapes_ok = k_cache.dim() >= 2 and (not paged or block_table.dim() == 2)
    capacity = (block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]) if shapes_ok else 0
    if cache_seqlens is None:
        cache_seqlens = capacity
    elif not 0 <= cache_seqlens <= capacity:
        raise ValueError(f"flashattn: cache_seqlens={cache_seqlens} is outside [0, {capacity}] (the cache's rows)")
    batch = q.shape[0] if q.dim() else 0
    return torch.full((batch,), int(cache_seqlens), dtype=torch.int32, device=q.device)


def _check_kvcache_tensors(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                           cache_leftpad, block_table, alibi_slopes, learnable_sink=None, dtypes=True) -> None:
    """The tensors of flashattn::fwd_kvcache, checked as the binding checks them (csrc/api/flash_api.cpp);
    dtypes=False: all but the data tensors' dtypes (an FP8 call, whose dtypes fp8.check_kvcache checked)."""

    def check_data(name, t, layout):
        if dtypes:
            check_tensor(name, t, q, 4, layout)
        elif t.dim() != 4:
            raise ValueError(f"flashattn: {name} must be 4-D {layout}, got shape {tuple(t.shape)}")
        else:
            check_same_device(name, t, q)

    check_data("q", q, "(batch, seqlen_q, nheads, headdim)")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_data(name, t, "(batch_cache, seqlen_cache, nheads_k, headdim)")
    if k_cache.shape[:-1] != v_cache.shape[:-1]:
        raise ValueError(f"flashattn: k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} must have "
                         "the same shape")
    batch, _, num_heads, head_dim = q.shape
    num_heads_k = k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"flashattn: head dims differ: q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}")
    if not 1 <= head_dim <= MAX_KVCACHE_HEAD_DIM:
        raise ValueError(f"flashattn: headdim {head_dim} is not supported by flash_attn_with_kvcache; accepted: "
                         f"1 to {MAX_KVCACHE_HEAD_DIM}")
    check_v_head_dim(q, k_cache, v_cache, ("q", "k_cache", "v_cache"))
    if num_heads_k == 0 or num_heads % num_heads_k:
        raise ValueError(f"flashattn: the number of query heads ({num_heads}) must be a multiple of the number of "
                         f"key/value heads in k_cache ({num_heads_k})")
    for name, t in (("cache_seqlens", cache_seqlens), ("cache_batch_idx", cache_batch_idx),
                    ("cache_leftpad", cache_leftpad)):
        check_index_tensor(name, t, q, (batch,))
    check_index_tensor("block_table", block_table, q, (batch,), matrix=True)
    if block_table is not None and cache_batch_idx is not None:
        raise ValueError("flashattn: cache_batch_idx cannot be combined with block_table (a paged cache)")
    if block_table is None and cache_batch_idx is None and k_cache.shape[0] < batch:
        raise ValueError(f"flashattn: k_cache holds {k_cache.shape[0]} sequences but q has a batch of {batch}")
    if (k is None) != (v is None):
        raise ValueError("flashattn: k and v must be given together")
    if k is not None:
        for name, t, cache in (("k", k, k_cache), ("v", v, v_cache)):
            check_data(name, t, "(batch, seqlen_new, nheads_k, headdim)")
            if t.shape[0] != batch or t.shape[2:] != cache.shape[2:]:
                raise ValueError(f"flashattn: {name} must have shape ({batch}, seqlen_new, {num_heads_k}, "
                                 f"{cache.shape[3]}), got {tuple(t.shape)}")
        if k.shape[:-1] != v.shape[:-1]:
            raise ValueError(f"flashattn: k {tuple(k.shape)} and v {tuple(v.shape)} must have the same seqlen_new")
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("flashattn: rotary_cos and rotary_sin must be given together")
    if rotary_cos is not None:
        check_same_device("rotary_cos", rotary_cos, q)
        check_same_device("rotary_sin", rotary_sin, q)
        if rotary_cos.dim() != 2 or rotary_cos.shape != rotary_sin.shape or 2 * rotary_cos.shape[1] > head_dim:
            raise ValueError(f"flashattn: rotary_cos and rotary_sin must be (seqlen_ro, rotary_dim / 2) with "
                             f"rotary_dim <= headdim ({head_dim}), got {tuple(rotary_cos.shape)} and "
                             f"{tuple(rotary_sin.shape)}")
    check_alibi_slopes(alibi_slopes, q, batch)
    check_learnable_sink(learnable_sink, q)


def _check_kvcache_values(k_cache, k, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, rotary_cos, q,
                          positions_per_row) -> None:
    """The index values, read on the host (the CUDA kernels check the same on the device)."""
    seqlen_new = 0 if k is None else k.shape[1]
    capacity = block_table.shape[1] * k_cache.shape[1] if block_table is not None else k_cache.shape[1]
    end = cache_seqlens.long() + seqlen_new
    if bool((cache_seqlens < 0).any()) or bool((end > capacity).any()):
        raise ValueError(f"flashattn: cache_seqlens + seqlen_new must be in [0, {capacity}] (the cache's rows), got "
                         f"{end.tolist()}")
    if cache_leftpad is not None and bool(((cache_leftpad < 0) | (cache_leftpad > cache_seqlens)).any()):
        raise ValueError(f"flashattn: cache_leftpad must be in [0, cache_seqlens] (the padding lies in the cached "
                         f"rows), got {cache_leftpad.tolist()} with cache_seqlens {cache_seqlens.tolist()}")
    if block_table is not None:
        # Only the entries a sequence uses: tables are often padded with -1.
        page_size = k_cache.shape[1]
        used = torch.arange(block_table.shape[1]) * page_size < end[:, None]
        if bool((used & ((block_table < 0) | (block_table >= k_cache.shape[0]))).any()):
            raise ValueError(f"flashattn: block_table entries must be in [0, {k_cache.shape[0]}) (k_cache's pages) "
                             "where the sequence uses them")
    if cache_batch_idx is not None and bool(((cache_batch_idx < 0) | (cache_batch_idx >= k_cache.shape[0])).any()):
        raise ValueError(f"flashattn: cache_batch_idx entries must be in [0, {k_cache.shape[0]})")
    if rotary_cos is not None:
        # Key rows rotate at their cache row; queries at cache_seqlens (+ i when causal or windowed).
        start = cache_seqlens.long()
        last = start + max(seqlen_new - 1, q.shape[1] - 1 if positions_per_row else 0, 0)
        if bool((last >= rotary_cos.shape[0]).any()):
            raise ValueError(f"flashattn: rotary positions up to {int(last.max())} need rotary_cos/sin of at least "
                             f"{int(last.max()) + 1} rows, got {rotary_cos.shape[0]}")


def _cache_rows(cache: Tensor, b: int, rows: Tensor, cache_batch_idx: Tensor | None,
                block_table: Tensor | None) -> tuple[Tensor, Tensor]:
    """(index into cache's first dim, index into its second) of sequence b's cache rows `rows`."""
    if block_table is not None:
        page_size = cache.shape[1]
        return block_table[b].long()[rows // page_size], rows % page_size
    batch_row = int(cache_batch_idx[b]) if cache_batch_idx is not None else b
    return torch.full_like(rows, batch_row), rows


def _fwd_kvcache_cpu(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                     cache_leftpad, block_table, softmax_scale, causal, window_left, window_right, softcap,
                     rotary_interleaved, alibi_slopes, num_splits, learnable_sink=None):
    """The semantics in plain PyTorch, one sequence at a time, on the blockwise CPU forward; the
    tensors and the index values checked first."""
    _check_kvcache_tensors(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                           cache_leftpad, block_table, alibi_slopes, learnable_sink)
    positions_per_row = causal or window_left >= 0 or window_right >= 0
    _check_kvcache_values(k_cache, k, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, rotary_cos, q,
                          positions_per_row)
    batch, seqlen_q, num_heads, _ = q.shape
    seqlen_new = 0 if k is None else k.shape[1]
    out = q.new_empty(out_shape(q, v_cache))
    lse = q.new_empty((batch, num_heads, seqlen_q), dtype=torch.float32)
    for b in range(batch):
        start = int(cache_seqlens[b])
        leftpad = int(cache_leftpad[b]) if cache_leftpad is not None else 0
        if seqlen_new:
            new_rows = torch.arange(start, start + seqlen_new)
            k_new = k[b : b + 1]
            if rotary_cos is not None:
                k_new = apply_rotary_emb(k_new, rotary_cos, rotary_sin, rotary_interleaved, seqlen_offsets=start)
            index = _cache_rows(k_cache, b, new_rows, cache_batch_idx, block_table)
            k_cache[index] = k_new[0]
            v_cache[index] = v[b]
        rows = torch.arange(leftpad, start + seqlen_new)
        index = _cache_rows(k_cache, b, rows, cache_batch_idx, block_table)
        keys, values = k_cache[index].unsqueeze(0), v_cache[index].unsqueeze(0)
        q_b = q[b : b + 1]
        if rotary_cos is not None:
            # Causal or windowed: query i at position start + i; otherwise every query there.
            rows_as_batch = q_b if positions_per_row else q_b.transpose(0, 1)
            q_b = apply_rotary_emb(rows_as_batch, rotary_cos, rotary_sin, rotary_interleaved, seqlen_offsets=start)
            q_b = q_b if positions_per_row else q_b.transpose(0, 1)
        slopes = None
        if alibi_slopes is not None:
            slopes = alibi_slopes[b] if alibi_slopes.dim() == 2 else alibi_slopes
        o_b, lse_b = torch.ops.flashattn.fwd(
            q_b, keys, values, softmax_scale, causal, False, window_left, window_right, softcap, slopes,
            learnable_sink=learnable_sink,
        )
        out[b] = o_b[0]
        lse[b] = lse_b[0]
    return out, lse


torch.library.impl("flashattn::fwd_kvcache", "cpu", _fwd_kvcache_cpu)


class KVCache:
    """Per-layer key/value caches for a generation loop: allocated once, appended by flash_attn_with_kvcache.

        cache = KVCache(batch=4, max_seqlen=4096, num_heads_k=8, head_dim=128, num_layers=32,
                        device="cuda", dtype=torch.bfloat16)           # or page_size=16 for a paged cache
        out = cache.attend(layer, q, k, v, causal=True)                 # appends k, v; attends
        cache.advance(k.shape[1])                                       # after the last layer of a step

    seqlens (batch,) int32 holds the cached length of every sequence; a paged cache hands each sequence
    the pages it needs up to max_seqlen in order (block_table); `reset()` empties it. v_head_dim (default
    head_dim) may be smaller than head_dim, as flash_attn_with_kvcache's v_cache.
    """

    def __init__(self, batch: int, max_seqlen: int, num_heads_k: int, head_dim: int, num_layers: int = 1,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.bfloat16,
                 page_size: int | None = None, v_head_dim: int | None = None) -> None:
        self.batch, self.max_seqlen, self.page_size = batch, max_seqlen, page_size
        if page_size is None:
            rows = (batch, max_seqlen)
            self.block_table = None
        else:
            pages_per_seq = math.ceil(max_seqlen / page_size)
            rows = (batch * pages_per_seq, page_size)
            self.block_table = torch.arange(batch * pages_per_seq, device=device, dtype=torch.int32).reshape(
                batch, pages_per_seq)
        v_head_dim = head_dim if v_head_dim is None else v_head_dim
        self.k = [torch.zeros((*rows, num_heads_k, head_dim), device=device, dtype=dtype) for _ in range(num_layers)]
        self.v = [torch.zeros((*rows, num_heads_k, v_head_dim), device=device, dtype=dtype)
                  for _ in range(num_layers)]
        self.seqlens = torch.zeros(batch, device=device, dtype=torch.int32)

    def attend(self, layer: int, q: Tensor, k: Tensor | None = None, v: Tensor | None = None, **kwargs) -> Tensor:
        """flash_attn_with_kvcache on this layer's cache at the current lengths (kwargs pass through)."""
        return flash_attn_with_kvcache(q, self.k[layer], self.v[layer], k, v, cache_seqlens=self.seqlens,
                                       block_table=self.block_table, **kwargs)

    def advance(self, tokens: int) -> None:
        """Counts `tokens` new tokens as cached in every sequence (call once per step, after all layers)."""
        self.seqlens += tokens

    def reset(self) -> None:
        self.seqlens.zero_()
