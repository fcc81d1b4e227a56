"""FP8 inputs (torch.float8_e4m3fn) with FlashAttention-3's scaling factors.

q, k and v stored in e4m3 stand for stored value x descale: q_descale, k_descale and
v_descale are fp32 (batch, nheads_k) tensors, one factor per sequence and KV head (a query
head uses its KV head's q factor), or None for 1. The output is 16-bit (out_dtype: bf16 by
default, or fp16), the LSE fp32.

One set of checks (`check`: dtypes, ranks, descales, out_dtype, no gradients), then one of two routes:

- The FP8 kernel, torch.ops.flashattn.fwd_fp8 (flashattn.ops), where `runs_kernel` says so: a CUDA
  tensor on a device that the sm90 kernel family serves (H100, H200 with a build that includes 9.0a),
  no dropout, softcap, ALiBi, learnable sink, seqused_q/k or block_table, head dims (q's and k's D,
  v's Dv) multiples of 16 with Dv <= D <= 256, last dimensions contiguous. It multiplies e4m3 on the
  tensor cores (Q K^T, and P V with P rounded to e4m3) with the descales folded into the softmax
  scale and the output, so its error is FP8 arithmetic's, larger than 16-bit attention's
  (tests/test_fp8.py states the bound, fp8_error_bound).
- Everywhere else (CPU, other GPUs and families, the options above), `dequantize`: stored value x
  descale rounded to out_dtype, then the 16-bit kernels (CUDA) or the PyTorch implementation (CPU).
  The result is 16-bit attention's on those values, slower than a 16-bit call by the dequantisation
  (on CUDA one kernel pass, dequantize_fp8: 0.71-0.96x a bf16 call's speed on an H200, README).

flash_attn_with_kvcache over FP8 caches (`check_kvcache`) decodes on the FP8 KV-cache kernel,
torch.ops.flashattn.fwd_kvcache_fp8, where `runs_kvcache_kernel` says so: a CUDA tensor on any
family, at most KVCACHE_KERNEL_MAX_ROWS query rows per (batch, KV head) block (decoding, GQA packed),
head dims multiples of 16 up to 256, rows the kernel reads in place. It reads the cache's e4m3 bytes
(half a 16-bit cache's memory traffic) and turns them into 16-bit operands exactly, q staying
16-bit (an FP8 q is dequantised first: it is small), so its error is 16-bit attention's on the
stored values. Other KV-cache calls (chunked prefill, CPU, ...) and flash_attn_varlen_func over FP8
pages (block_table) take the dequantising path (flashattn/kvcache.py: _fp8_kvcache; `dequantize`),
a cache row or page taking the descales of the sequence that uses it (`cache_row_factors`).

Forward only: nothing here is differentiable.
"""

import torch
from torch import Tensor

FP8_DTYPE = torch.float8_e4m3fn
OUT_DTYPES = (torch.bfloat16, torch.float16)
E4M3_MAX = 448.0  # float8_e4m3fn's largest finite magnitude
_DESCALES = ("q_descale", "k_descale", "v_descale")
# The FP8 kernel's head dims: its rows move in 16-byte chunks, 16 elements of e4m3; the sm90
# family's kernels end at 256.
KERNEL_HEAD_DIM_MULTIPLE = 16
KERNEL_MAX_HEAD_DIM = 256
# The kernel family that has an FP8 forward kernel (flashattn.kernel_family's names).
KERNEL_FAMILY = "sm90"
# The FP8 KV-cache kernel (the decoding kernel, every family): its rows per (batch, KV head)
# block (flash.h: kFp8KvcacheMaxRows) and the multiple its head dims take.
KVCACHE_KERNEL_MAX_ROWS = 16
KVCACHE_KERNEL_HEAD_DIM_MULTIPLE = 16


def is_fp8(t: object) -> bool:
    return isinstance(t, Tensor) and t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz,
                                                 torch.float8_e5m2fnuz)


def check(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    descales: dict[str, object],
    out_dtype: object,
    sequences: int | None = None,
    paged: bool = False,
) -> torch.dtype | None:
    """The FP8 arguments checked, for both routes: None where q, k and v are not FP8 (then no
    descale and no out_dtype may be given), else the out dtype (out_dtype, bf16 when None).

    Padded layout: q (batch, seqlen_q, nheads, headdim), k and v (batch, seqlen_k, nheads_k,
    headdim[_v]), descales (batch, nheads_k). Packed (varlen): q (total_q, nheads, headdim), k
    and v (total_k, nheads_k, ...), or with `paged` pages (num_blocks, page_block_size,
    nheads_k, ...), `sequences` sequences, descales (sequences, nheads_k).
    Errors name the argument: ValueError or TypeError for a value, dtype or shape (RuntimeError
    for a device), NotImplementedError for gradients. The other shapes (head counts, head dims,
    lengths) are the operator's to check."""
    if not any(is_fp8(t) for t in (q, k, v)):
        _refuse_fp8_arguments(q, descales, out_dtype)
        return None
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
    for name, t in (("q", q), ("k", k), ("v", v)):
        pages = paged and name != "q"
        if t.dim() != (3 if packed and not pages else 4):
            layout = ("(num_blocks, page_block_size, nheads_k, headdim)" if pages
                      else "(total, nheads, headdim)" if packed else "(batch, seqlen, nheads, headdim)")
            raise ValueError(f"flashattn: {name} must be {layout}, got shape {tuple(t.shape)}")
    batch = sequences if packed else q.shape[0]
    for name, value in descales.items():
        _check_descale(name, value, batch, k.shape[-2], q.device)
    return out_dtype


def check_kvcache(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k: Tensor | None,
    v: Tensor | None,
    descales: dict[str, object],
    out_dtype: object,
) -> torch.dtype | None:
    """flash_attn_with_kvcache's FP8 arguments checked: None where neither q nor the caches nor k, v
    are FP8 (then no descale and no out_dtype may be given), else the out dtype.

    FP8 caches: k_cache and v_cache float8_e4m3fn, the new k and v (when given) too (they go into
    the cache as they are); q float8_e4m3fn (out_dtype, bf16 when None) or 16-bit (a 16-bit
    query over an FP8 cache: no q_descale, out in q's dtype). Descales (batch, nheads_k) as
    `check`'s, batch being q's. Errors name the argument, as `check`'s do."""
    tensors = (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v))
    if not any(is_fp8(t) for _, t in tensors):
        _refuse_fp8_arguments(q, descales, out_dtype)
        return None
    for name, t in tensors[1:]:
        if t is not None and t.dtype != FP8_DTYPE:
            raise TypeError(f"flashattn: FP8 attention over a KV cache takes float8_e4m3fn k_cache and v_cache, "
                            f"and k and v of that dtype to append; {name} is {t.dtype}")
    if q.dtype == FP8_DTYPE:
        out_dtype = torch.bfloat16 if out_dtype is None else out_dtype
        if out_dtype not in OUT_DTYPES:
            raise ValueError(f"flashattn: out_dtype must be torch.bfloat16 or torch.float16 for FP8 inputs, "
                             f"got {out_dtype!r}")
    elif q.dtype in OUT_DTYPES:
        if descales["q_descale"] is not None:
            raise ValueError(f"flashattn: q_descale applies to float8_e4m3fn q; q is {q.dtype}")
        if out_dtype not in (None, q.dtype):
            raise ValueError(f"flashattn: out_dtype must be None or q's dtype ({q.dtype}) for a 16-bit q over "
                             f"an FP8 cache, got {out_dtype!r}")
        out_dtype = q.dtype
    else:
        raise TypeError(f"flashattn: q over an FP8 KV cache must be float8_e4m3fn, float16 or bfloat16, "
                        f"got {q.dtype}")
    for name, t in tensors:
        if t is not None and t.dim() != 4:
            raise ValueError(f"flashattn: {name} must be 4-dimensional, got shape {tuple(t.shape)}")
    for name, value in descales.items():
        _check_descale(name, value, q.shape[0], k_cache.shape[2], q.device)
    return out_dtype


def _refuse_fp8_arguments(q: Tensor, descales: dict[str, object], out_dtype: object) -> None:
    """A call without FP8 tensors takes no descale and no out_dtype (ValueError naming them)."""
    given = [name for name, value in descales.items() if value is not None]
    if out_dtype is not None:
        given.append("out_dtype")
    if given:
        raise ValueError(f"flashattn: {', '.join(given)} apply to float8_e4m3fn q, k and v only; q is {q.dtype}")


def query_factors(q_descale: Tensor, heads: int, heads_k: int) -> Tensor:
    """q_descale (batch, nheads_k) as one factor per query head (batch, nheads): a query head takes
    its KV head's, head h that of KV head h * nheads_k // nheads (h // (nheads / nheads_k) where it
    divides; where it does not, the operators refuse the shapes)."""
    return q_descale[:, torch.arange(heads, device=q_descale.device) * heads_k // max(heads, 1)]


def runs_kernel(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dropout_p: object = 0.0,
    softcap: object = 0.0,
    alibi_slopes: object = None,
    learnable_sink: object = None,
    **sequence_tensors: object,
) -> bool:
    """Whether a call on FP8 q, k and v (that `check` accepted) runs the FP8 kernel,
    torch.ops.flashattn.fwd_fp8, rather than the dequantising path: q on a CUDA device that the
    sm90 family serves, none of the options the kernel lacks (dropout_p 0, softcap 0, no
    alibi_slopes, no learnable_sink, no sequence_tensors: seqused_q, seqused_k, block_table), q's
    and k's head dim D and v's Dv multiples of KERNEL_HEAD_DIM_MULTIPLE with 0 < Dv <= D <=
    KERNEL_MAX_HEAD_DIM, last dimensions contiguous and no dimension broadcast (stride 0 over
    more than one index: the kernel's tensor maps cannot step it); the dequantising path copies
    such views.
    Values these comparisons do not take (a string dropout_p, ...) leave the call to the
    dequantising path, whose checks raise the error."""
    if not q.is_cuda:
        return False
    head_dim, v_head_dim = q.shape[-1], v.shape[-1]
    return (
        dropout_p == 0 and softcap == 0 and alibi_slopes is None and learnable_sink is None
        and all(t is None for t in sequence_tensors.values())
        and k.shape[-1] == head_dim and 0 < v_head_dim <= head_dim <= KERNEL_MAX_HEAD_DIM
        and head_dim % KERNEL_HEAD_DIM_MULTIPLE == 0 and v_head_dim % KERNEL_HEAD_DIM_MULTIPLE == 0
        and all(t.stride(-1) == 1 for t in (q, k, v))
        and not any(size > 1 and stride == 0 for t in (q, k, v) for size, stride in zip(t.shape, t.stride()))
        and _kernel_family(q.device.index) == KERNEL_FAMILY
    )  # fmt: skip


def kvcache_block_rows(seqlen_q: int, heads_per_kv_head: int, alibi: bool) -> int:
    """flash_attn_with_kvcache's query rows per (batch, head) block (flash.h: kvcache_block_rows):
    decoding (seqlen_q 1) with GQA packs a KV head's query heads as one block's rows, except with
    ALiBi (its slopes differ per query head)."""
    return heads_per_kv_head if seqlen_q == 1 and heads_per_kv_head > 1 and not alibi else seqlen_q


def runs_kvcache_kernel(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Tensor | None, v: Tensor | None,
                        alibi_slopes: object = None) -> bool:
    """Whether flash_attn_with_kvcache over FP8 caches (that `check_kvcache` accepted; q already
    16-bit) runs the FP8 KV-cache kernel, torch.ops.flashattn.fwd_kvcache_fp8, rather than the
    dequantising path: q on a CUDA device that a kernel family serves, at most
    KVCACHE_KERNEL_MAX_ROWS rows per block (kvcache_block_rows), q's and k_cache's head dim D and
    v_cache's Dv multiples of 16 with 0 < Dv <= D <= KERNEL_MAX_HEAD_DIM, and the caches (and k, v)
    read in place: last dimension contiguous, the others' strides multiples of 16 elements (the
    dequantising path takes any strides; a cache that does not start 16-byte aligned is refused as
    the 16-bit caches are)."""
    if not q.is_cuda or q.dim() != 4 or k_cache.dim() != 4 or k_cache.shape[2] == 0:
        return False
    _, seqlen_q, heads, head_dim = q.shape
    heads_k, v_head_dim = k_cache.shape[2], v_cache.shape[-1]

    def in_place(t: Tensor) -> bool:
        return (t.stride(-1) == 1
                and all(size <= 1 or stride % 16 == 0 for size, stride in zip(t.shape[:-1], t.stride()[:-1])))

    return (
        heads % heads_k == 0
        and kvcache_block_rows(seqlen_q, heads // heads_k, alibi_slopes is not None) <= KVCACHE_KERNEL_MAX_ROWS
        and k_cache.shape[-1] == head_dim and 0 < v_head_dim <= head_dim <= KERNEL_MAX_HEAD_DIM
        and head_dim % KVCACHE_KERNEL_HEAD_DIM_MULTIPLE == 0 and v_head_dim % KVCACHE_KERNEL_HEAD_DIM_MULTIPLE == 0
        and all(in_place(t) for t in (k_cache, v_cache, k, v) if t is not None and t.numel() > 0)
        and _kernel_family(q.device.index) is not None
    )  # fmt: skip


# flashattn.kernel_family of each CUDA device index, read once (see _kernel_family).
_KERNEL_FAMILIES: dict[int, str | None] = {}


@torch.compiler.assume_constant_result  # torch.compile calls it once while tracing and keeps the answer
def _kernel_family(device_index: int) -> str | None:
    """The kernel family that serves CUDA device device_index (flashattn.kernel_family), or None
    where the kernels cannot run there (then the dequantising path raises why). Read once per
    device: the binding picks a device's family once per process (FLASHATTN_FAMILY included)."""
    if device_index not in _KERNEL_FAMILIES:
        from . import _extension  # here, not at the top: _extension imports ops, which imports this module

        runs = (_extension.cuda_unavailable_reason() is None
                and _extension.unsupported_gpu_reason(torch.device("cuda", device_index)) is None)
        _KERNEL_FAMILIES[device_index] = _extension.kernel_family(device_index) if runs else None
    return _KERNEL_FAMILIES[device_index]


def dequantize(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    descales: dict[str, object],
    out_dtype: torch.dtype,
    sequences: int | None = None,
    cu_seqlens_q: Tensor | None = None,
    cu_seqlens_k: Tensor | None = None,
    block_table: Tensor | None = None,
    seqused_k: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """FP8 q, k, v (that `check` accepted, out_dtype the dtype it returned) as the 16-bit tensors
    the 16-bit kernels take: stored value x descale, rounded to out_dtype.

    Layouts as in `check`; packed (varlen): `sequences` sequences given by cu_seqlens_q and
    cu_seqlens_k (ValueError naming them where they are not 1-D tensors of sequences + 1 offsets
    on q's device); rows past a sequence's end take factor 1 (their out is 0). Paged (k and v
    pages, block_table given): a page takes the descales of the sequence whose first seqused_k[b]
    (else cu_seqlens_k's length) keys it holds (cache_row_factors), 1 where none uses it."""
    batch, heads, heads_k = (sequences if sequences is not None else q.shape[0]), q.shape[-2], k.shape[-2]
    factors = {name: torch.ones(batch, heads_k, device=q.device) if value is None else value
               for name, value in descales.items()}  # fmt: skip
    q_factor = query_factors(factors["q_descale"], heads, heads_k)  # (batch, nheads)
    # A factor per (row of t, head): a sequence's, a packed row's (its sequence's) or a page's.
    if sequences is None:
        q_scale, k_scale, v_scale = q_factor, factors["k_descale"], factors["v_descale"]
    else:
        q_scale = _with_unit_row(q_factor)[_sequence_of_rows("cu_seqlens_q", cu_seqlens_q, q, batch)]
        if block_table is None:
            k_rows = _sequence_of_rows("cu_seqlens_k", cu_seqlens_k, k, batch)
            k_scale, v_scale = (_with_unit_row(factors[name])[k_rows] for name in ("k_descale", "v_descale"))
        else:  # pages: a page's rows take the descales of the sequence that holds keys there
            _check_offsets("cu_seqlens_k", cu_seqlens_k, batch, q.device)
            ends = seqused_k.long() if seqused_k is not None else (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).long()
            k_scale, v_scale = (cache_row_factors(factors[name], k, batch, ends, None, block_table)
                                for name in ("k_descale", "v_descale"))
    return tuple(times(t, s, out_dtype) for t, s in ((q, q_scale), (k, k_scale), (v, v_scale)))


def times(t: Tensor, factor: Tensor | None, dtype: torch.dtype) -> Tensor:
    """FP8 t, (rows, seqlen, nheads, headdim) or packed (rows, nheads, headdim), times factor (fp32
    (rows, nheads); None: 1), each product rounded once to the 16-bit dtype: what
    (t.float() * factor).to(dtype) gives, in one pass (torch.ops.flashattn.dequantize_fp8; without
    a factor, t.to(dtype), which is exact: every e4m3 value is a bf16 and an fp16 value)."""
    if factor is None:
        return t.to(dtype)
    if t.stride(-1) != 1:  # the kernel reads rows of head dim whole (a copy of one byte an element)
        t = t.contiguous()
    packed = t.dim() == 3
    out = torch.ops.flashattn.dequantize_fp8(t.unsqueeze(1) if packed else t, factor, dtype)
    return out.squeeze(1) if packed else out


def check_times(t: Tensor, scale: Tensor, out_dtype: torch.dtype) -> None:
    """dequantize_fp8's arguments (the same messages as csrc/api/checks.h's check_dequantize_fp8)."""
    if t.dim() != 4:
        raise ValueError(f"flashattn: t must be 4-D (rows, seqlen, nheads, headdim), got shape {tuple(t.shape)}")
    if t.dtype != FP8_DTYPE:
        raise TypeError(f"flashattn: t must be float8_e4m3fn, got {t.dtype}")
    if scale.dim() != 2 or tuple(scale.shape) != (t.shape[0], t.shape[2]):
        raise ValueError(f"flashattn: scale must have shape (rows, nheads) = {(t.shape[0], t.shape[2])}, "
                         f"got {tuple(scale.shape)}")
    if scale.dtype != torch.float32:
        raise TypeError(f"flashattn: scale must be float32, got {scale.dtype}")
    if scale.device != t.device:
        raise RuntimeError(f"flashattn: scale is on {scale.device} but t is on {t.device}; they must be on "
                           f"one device")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"flashattn: out_dtype must be torch.float16 or torch.bfloat16, got {out_dtype}")


def cache_row_factors(descale: Tensor | None, cache: Tensor, batch: int, ends: Tensor,
                      cache_batch_idx: Tensor | None, block_table: Tensor | None) -> Tensor | None:
    """(cache rows or pages, nheads_k): the descale of the sequence that uses each (its batch row b, its
    cache_batch_idx[b], or the block_table pages below ends[b] rows), 1 where none does; None for None.
    A page that several sequences use takes one of their descales (give them the same one). Entries
    are clamped into range: a bad one is the kernels' to report, not read out of bounds here."""
    if descale is None:
        return None
    num_rows = cache.shape[0]
    factors = descale.new_ones(num_rows + 1, descale.shape[1])  # the last row takes what no row keeps
    if block_table is None:
        rows = torch.arange(batch, device=cache.device) if cache_batch_idx is None else cache_batch_idx.long()
        factors[rows.clamp(0, num_rows - 1)] = descale
    else:
        used = torch.arange(block_table.shape[1], device=cache.device) * cache.shape[1] < ends[:, None]
        pages = torch.where(used, block_table.long().clamp(0, num_rows - 1), num_rows)
        factors[pages.flatten()] = descale[:, None, :].expand(-1, pages.shape[1], -1).reshape(-1, descale.shape[1])
    return factors[:num_rows]


def _check_descale(name: str, value: object, batch: int, heads_k: int, device: torch.device) -> None:
    """A descale is None or an fp32 (batch, nheads_k) tensor on device."""
    if value is None:
        return
    if not isinstance(value, Tensor):
        raise TypeError(f"flashattn: {name} must be a tensor or None, got {type(value).__name__}")
    if value.dtype != torch.float32:
        raise TypeError(f"flashattn: {name} must be float32, got {value.dtype}")
    if tuple(value.shape) != (batch, heads_k):
        raise ValueError(f"flashattn: {name} must have shape (batch, nheads_k) = {(batch, heads_k)}, "
                         f"got {tuple(value.shape)}")
    if value.device != device:
        raise RuntimeError(f"flashattn: {name} is on {value.device}, q on {device}")


def _with_unit_row(factors: Tensor) -> Tensor:
    """factors (batch, heads) with one more row of ones: the factor of rows no sequence owns."""
    return torch.cat([factors, factors.new_ones(1, factors.shape[1])])


def _sequence_of_rows(name: str, cu_seqlens: Tensor, rows_of: Tensor, batch: int) -> Tensor:
    """For each packed row of rows_of, the sequence that owns it by cu_seqlens, or batch for rows
    past the last one. A binary search on the device: no host read, any offsets give indices in
    range."""
    _check_offsets(name, cu_seqlens, batch, rows_of.device)
    positions = torch.arange(rows_of.shape[0], device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    return torch.searchsorted(cu_seqlens[1:].contiguous(), positions, right=True).clamp(max=batch)


def _check_offsets(name: str, cu_seqlens: Tensor, batch: int, device: torch.device) -> None:
    """cu_seqlens is a 1-D tensor of batch + 1 offsets on device (ValueError naming it otherwise)."""
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() != batch + 1 or cu_seqlens.device != device:
        raise ValueError(f"flashattn: {name} must be a 1-D tensor of {batch + 1} offsets on {device}, "
                         f"got shape {tuple(cu_seqlens.shape)} on {cu_seqlens.device}")
