"""flash_attn_func and friends: the public functions, with FlashAttention-2's signatures.

Each checks its Python arguments (their types, the options' values and
combinations; an error names the argument, what was given and what is
accepted), unpacks packed tensors, zero-pads head dims for the CUDA kernels and
runs torch.ops.flashattn.fwd, whose implementations check the tensors: which
layer checks what is tabled in README.md, "Where each argument is checked".
FP8 inputs (flash_attn_func and flash_attn_varlen_func) run torch.ops.flashattn.fwd_fp8
where flashattn.fp8.runs_kernel says the FP8 kernel takes the call, and fwd on the
dequantised values otherwise.
The operator is differentiable (flashattn.ops registers its autograd formula,
which runs flashattn::bwd on the saved q, k, v, out and LSE), so the padding
made here is differentiated by autograd like any other tensor operation.

Two layouts: padded batches, q (batch, seqlen_q, nheads, headdim), for
flash_attn_func and its packed twins; variable-length batches, q
(total_q, nheads, headdim) with cu_seqlens offsets, for flash_attn_varlen_func
and its packed twins (flashattn.padding converts a padding mask to that layout).
"""

import itertools
import math
import re
from numbers import Integral, Real
from typing import Callable, NamedTuple, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor

from . import cpu, fp8, ops
from ._extension import HAS_CUDA_KERNELS, NOT_BUILT_REASON, unsupported_gpu_reason
from .cpu import MAX_HEAD_DIM

__all__ = [
    "flash_attn_combine",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
]

# The kernels move 16-byte chunks, 8 elements of fp16/bf16: head dims must be multiples of that.
_KERNEL_CHUNK_ELEMS = 8
# A window side at least this wide is unbounded for any sequence the kernels take
# (lengths fit int32), and the binding takes window sides as int32.
_MAX_WINDOW = 2**31 - 1
# Dropout's Philox seed and offset: drawn from torch's generator, so torch.manual_seed
# reproduces them and a CUDA graph's replay draws fresh ones.
_RNG_STATE_HIGH = 2**62
# S_dmask's sequence dimensions are rounded up to this, as FlashAttention-2's (its kernel writes whole tiles).
_S_DMASK_ROUND = 128

_Result = TypeVar("_Result")


def flash_attn_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    learnable_sink: Tensor | None = None,
    q_descale: Tensor | None = None,
    k_descale: Tensor | None = None,
    v_descale: Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """Exact attention ``softmax(q @ k^T * softmax_scale) @ v``, computed tile by tile.

    A drop-in for ``flash_attn.flash_attn_func`` (FlashAttention-2).

    Args:
        q: (batch, seqlen_q, nheads, headdim).
        k, v: (batch, seqlen_k, nheads_k, headdim). nheads must be a multiple of
            nheads_k (GQA/MQA): query head h uses key/value head h // (nheads // nheads_k).
            headdim may be anything up to 512. v's headdim (headdim_v) may be smaller
            than q's and k's (DeepSeek MLA: 192 for q and k, 128 for v), not larger.
            The last dimension of q, k and v must be contiguous; other strides are honoured.
        dropout_p: probability of dropping each attention probability, in [0, 1);
            kept ones are scaled by 1 / (1 - dropout_p). Pass 0.0 in evaluation.
            The mask comes from a Philox generator keyed by a seed and offset
            drawn with torch.randint from torch's default generator of q's
            device, once per call: torch.manual_seed reproduces it, and a CUDA
            graph's replay draws a fresh one. The backward redraws the same mask.
        softmax_scale: scale of q @ k^T; default 1 / sqrt(headdim).
        causal: mask aligned to the bottom-right corner: query i sees key j iff
            j <= i + seqlen_k - seqlen_q. A query row that sees no key outputs 0
            (and gets zero gradients).
        window_size: (left, right): query i sees keys j in [i + seqlen_k - seqlen_q - left,
            i + seqlen_k - seqlen_q + right]; -1 (any negative) leaves a side unbounded. causal sets
            right to 0. A tuple or list of ints (or 0-d integer tensors), or a 1-D integer tensor of
            two, whose values are read with int() (a host sync for a CUDA tensor).
        softcap: if > 0, scores become softcap * tanh(scores / softcap) (before ALiBi and masking).
        alibi_slopes: fp32 (nheads,) or (batch, nheads) on q's device: adds
            -slope * |i + seqlen_k - seqlen_q - j| to the score of query i and key j.
        deterministic: make the backward pass bitwise reproducible run after run
            (on CUDA the default may sum dq with atomics, in a varying order).
        return_attn_probs: also return softmax_lse and S_dmask (for tests, see Returns).
        learnable_sink: keyword-only; fp32 (nheads,) on q's device, or None (FlashAttention-4's
            argument, gpt-oss's sinks): per head a logit that joins every row's softmax
            denominator and has no value: P_ij = exp(s_ij - lse_i) with lse_i =
            log(sum_j exp(s_ij) + exp(sink_h)). Used as given: not multiplied by softmax_scale,
            not capped, no ALiBi bias. A row that sees no key outputs 0 (lse = sink_h).
            Differentiable (its gradient is fp32 (nheads,), summed in a fixed order).
        q_descale, k_descale, v_descale, out_dtype: keyword-only, for q, k and v in
            torch.float8_e4m3fn (FlashAttention-3's names and meaning): the real values are the
            stored ones times the descale, an fp32 (batch, nheads_k) tensor on q's device or None
            (1); a query head takes its KV head's q_descale. out is out_dtype (torch.bfloat16, the
            default, or torch.float16). Forward only. Two routes (flashattn.fp8): on a GPU that the
            sm90 kernel family serves (H100, H200), a call without dropout, softcap, alibi_slopes
            or learnable_sink, whose head dims are multiples of 16 (v's at most q's, q's at most
            256) with contiguous last dimensions and no broadcast (stride 0) dimension, runs the FP8
            kernel (e4m3 products on the tensor cores, P rounded to e4m3: FP8 arithmetic's error,
            larger than 16-bit attention's); every other call and device (other GPUs, the sm80
            family, CPU) computes 16-bit attention on the dequantised values, stored x descale
            rounded to out_dtype, slower than a 16-bit call (the dequantisation's pass). Given
            with 16-bit inputs, they raise ValueError.

    Bad option values raise ValueError or TypeError (RuntimeError for a tensor
    on another device) naming the option: dropout_p outside [0, 1), a
    window_size that is not two ints, a negative or non-finite softcap,
    alibi_slopes that are not an fp32 (nheads,) or (batch, nheads) tensor.

    Returns:
        out: (batch, seqlen_q, nheads, headdim_v) in the dtype of q (out_dtype for FP8 q). It is
        differentiable with respect to q, k and v; the backward pass keeps
        nothing of size seqlen_q x seqlen_k. With return_attn_probs=True,
        (out, softmax_lse, S_dmask), as FlashAttention-2 returns them:
        softmax_lse (batch, nheads, seqlen_q) fp32, the natural-log log-sum-exp
        of the scores (undropped; with the sink's term when there is one). It is
        differentiable too (d lse_i / d s_ij = P_ij), in q and k (and the sink),
        as context parallelism needs (flash_attn_combine): the backward kernels
        take its gradient as D - dlse. S_dmask only with dropout_p > 0 (otherwise an
        empty tensor of shape (0,), so that asking for the LSE stays linear in
        memory): (batch, nheads, seqlen_q rounded up to 128, seqlen_k rounded
        up to 128) in q's dtype, FlashAttention-2's encoding: per block of
        flashattn.cpu.s_dmask_block_n(headdim) keys, exp(score - m) with m the
        row max over that block and the blocks right of it (multiply by
        exp(m - softmax_lse) for the probabilities), 0 where masked and in the
        rounding, negated (sign bit set) where dropout dropped. It is recomputed
        in PyTorch from q and k and materialises seqlen_q x seqlen_k per head:
        for tests and inspection, not for long sequences.

    Runs on CUDA tensors (fp16, bf16; GPU sm_80 or newer; kernels built) and on
    CPU tensors (fp16, bf16, fp32) with a PyTorch implementation of the same
    algorithm. On CUDA the kernel needs head dims (q's and k's, and v's) that
    are multiples of 8 and 16-byte aligned rows: a head dim that is not is
    zero-padded (which leaves q @ k^T unchanged, and adds zero columns to out)
    and the output and gradients sliced back; an input whose start or strides
    other than the last are not multiples of 8 elements is copied. Everything
    else is read in place, e.g. slices of a packed qkv. A headdim_v below
    headdim is read as it is (the kernels' V tiles and P V are that wide where
    a kernel for it is compiled: 192 / 128 on sm90; elsewhere V's columns past
    headdim_v are zeros in shared memory, never read from memory).
    """
    _check_tensors(q=q, k=k, v=v)
    descales = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
    out_dtype = fp8.check(q, k, v, descales, out_dtype)
    if out_dtype is not None:
        if fp8.runs_kernel(q, k, v, dropout_p, softcap, alibi_slopes, learnable_sink):
            return _fp8_attention(q, k, v, None, descales, out_dtype, dropout_p, softmax_scale, causal, window_size,
                                  softcap, deterministic, return_attn_probs)  # fmt: skip
        q, k, v = fp8.dequantize(q, k, v, descales, out_dtype)
    return _attention(
        q, k, v, None, _NAMES, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        return_attn_probs, learnable_sink,
    )  # fmt: skip


def flash_attn_qkvpacked_func(
    qkv: Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    learnable_sink: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """flash_attn_func on q, k, v packed as qkv: (batch, seqlen, 3, nheads, headdim).

    q, k and v are read as slices of qkv, without a copy; the gradient of qkv
    stacks their gradients. Other arguments and the result as in flash_attn_func.
    """
    _check_packed("qkv", qkv, 5, 3, "(batch, seqlen, 3, nheads, headdim)")
    q, k, v = qkv.unbind(dim=2)
    names = {**_NAMES, "q": "qkv[:, :, 0]", "k": "qkv[:, :, 1]", "v": "qkv[:, :, 2]"}
    return _attention(
        q, k, v, None, names, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        return_attn_probs, learnable_sink,
    )  # fmt: skip


def flash_attn_kvpacked_func(
    q: Tensor,
    kv: Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    learnable_sink: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """flash_attn_func with k and v packed as kv: (batch, seqlen_k, 2, nheads_k, headdim).

    k and v are read as slices of kv, without a copy; the gradient of kv stacks
    their gradients. Packed, they share one head dim, q's: a v head dim smaller
    than q's needs flash_attn_func. Other arguments and the result as in flash_attn_func.
    """
    _check_packed("kv", kv, 5, 2, "(batch, seqlen_k, 2, nheads_k, headdim)")
    k, v = kv.unbind(dim=2)
    _check_tensors(q=q)
    _check_kv_head_dim(q, kv, "flash_attn_func")
    names = {**_NAMES, "k": "kv[:, :, 0]", "v": "kv[:, :, 1]"}
    return _attention(
        q, k, v, None, names, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        return_attn_probs, learnable_sink,
    )  # fmt: skip


def flash_attn_varlen_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: Tensor | None = None,
    *,
    seqused_q: Tensor | None = None,
    seqused_k: Tensor | None = None,
    learnable_sink: Tensor | None = None,
    q_descale: Tensor | None = None,
    k_descale: Tensor | None = None,
    v_descale: Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """flash_attn_func on a variable-length batch: the sequences' tokens packed one after another.

    A drop-in for ``flash_attn.flash_attn_varlen_func`` (FlashAttention-2).
    flashattn.unpad_input makes these arguments from a padded batch and its
    padding mask; flashattn.pad_input turns out back into a padded batch.

    Args:
        q: (total_q, nheads, headdim): the queries of every sequence, one after another.
        k, v: (total_k, nheads_k, headdim), likewise; heads and head dims as in flash_attn_func.
        cu_seqlens_q, cu_seqlens_k: int32 (batch + 1,) on q's device: sequence b is
            q[cu_seqlens_q[b]:cu_seqlens_q[b + 1]] attending to the keys
            k[cu_seqlens_k[b]:cu_seqlens_k[b + 1]]. Nondecreasing from 0; lengths 0 and 1 are
            fine. Rows past cu_seqlens_q[-1] (a batch padded to a fixed size, e.g. for CUDA
            graphs) belong to no sequence: their out is 0 and their gradients are 0, on CUDA
            and CPU; keys past cu_seqlens_k[-1] get zero gradients.
        max_seqlen_q, max_seqlen_k: at least the longest query (key) sequence: a Python int
            (a SymInt under torch.compile(dynamic=True)), or a 0-d integer tensor: read with
            int() (a host sync on CUDA), or under torch.compile replaced by the row count of q
            (k), a bound on every length that needs no read (S_dmask's rows are then that bound's).
        dropout_p, softmax_scale, causal, window_size, softcap, deterministic: as in
            flash_attn_func, applied to each sequence on its own: causal and window_size
            align each sequence's queries to the bottom-right corner of its own keys.
        alibi_slopes: fp32 (nheads,) or (batch, nheads), batch = len(cu_seqlens_q) - 1.
        return_attn_probs: as in flash_attn_func; softmax_lse is (nheads, total_q) and, with
            dropout, S_dmask (batch, nheads, max_seqlen_q, max_seqlen_k rounded up to 128), each
            sequence's rows and keys from 0, 0 outside.
        block_table: int32 (batch, max_blocks_per_seq), or None: paged keys and values (chunked
            prefill over a paged KV cache). k and v are then pages (num_blocks, page_block_size,
            nheads_k, headdim), any page_block_size >= 1; sequence b's key row r is row
            r % page_block_size of page block_table[b, r // page_block_size], and cu_seqlens_k
            (or seqused_k) gives the lengths only. Entries past a sequence's length are not read.
            Differentiable: dk and dv come back page-shaped, the shares of a page listed by
            several sequences summed (in an order `deterministic` does not fix).
        learnable_sink: as in flash_attn_func, one logit per head shared by every sequence.
        seqused_q, seqused_k: int32 (batch,), or None (FlashAttention-3's): sequence b uses only
            its first seqused_q[b] queries and seqused_k[b] keys of its cu_seqlens range (with
            block_table, seqused_k[b] is its length, at most the rows its pages hold). Unused query
            rows get out 0 (lse -inf) and, like unused keys, zero gradients.
        q_descale, k_descale, v_descale, out_dtype: as in flash_attn_func, for float8_e4m3fn q, k
            and v, the descales (batch, nheads_k) with batch the sequences of cu_seqlens_q. FP8
            pages (block_table): a page takes the descales of the sequence that uses it (pages
            that several sequences list must share theirs). The FP8 kernel runs the calls it
            would run in flash_attn_func that have no seqused_q, seqused_k or block_table; the
            others take the dequantising path.

    What is checked: cu_seqlens_* are int32 1-D tensors of one length on q's device,
    max_seqlen_* non-negative ints. On CPU tensors the values are checked too
    (cu_seqlens start at 0, never decrease, end within q's and k's rows; max_seqlen_*
    at least every length). On CUDA tensors the offsets are not checked: reading them
    would wait for the GPU. Offsets that break those rules there read out of bounds
    or leave rows unwritten, as they do in FlashAttention-2. seqused_q, seqused_k,
    block-table entries and paged lengths are checked where the kernels read them:
    a value out of range is clamped (nothing is read out of bounds) and raised as a
    RuntimeError at the next flashattn call or flashattn.check_faults() (on CPU: a
    ValueError at the call).

    Returns:
        out (total_q, nheads, headdim_v) in q's dtype (out_dtype for FP8 q), differentiable in q, k and v; or
        (out, softmax_lse, S_dmask) with return_attn_probs=True.
    """
    _check_tensors(q=q, k=k, v=v)
    _check_tensors(_OFFSETS, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    _check_tensors("an int32 tensor", optional=True, block_table=block_table, seqused_q=seqused_q,
                   seqused_k=seqused_k)
    descales = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
    sequences = cu_seqlens_q.numel() - 1
    out_dtype = fp8.check(q, k, v, descales, out_dtype, sequences, paged=block_table is not None)
    names = _NAMES
    varlen = _varlen(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, names, seqused_q=seqused_q,
                     seqused_k=seqused_k, block_table=block_table)
    if out_dtype is not None:
        if fp8.runs_kernel(q, k, v, dropout_p, softcap, alibi_slopes, learnable_sink, seqused_q=seqused_q,
                           seqused_k=seqused_k, block_table=block_table):
            return _fp8_attention(q, k, v, varlen, descales, out_dtype, dropout_p, softmax_scale, causal, window_size,
                                  softcap, deterministic, return_attn_probs)  # fmt: skip
        q, k, v = fp8.dequantize(q, k, v, descales, out_dtype, sequences, cu_seqlens_q, cu_seqlens_k, block_table,
                                 seqused_k)
    return _attention(
        q, k, v, varlen, names, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        return_attn_probs, learnable_sink,
    )  # fmt: skip


def flash_attn_varlen_qkvpacked_func(
    qkv: Tensor,
    cu_seqlens: Tensor,
    max_seqlen: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    learnable_sink: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """flash_attn_varlen_func on q, k, v packed as qkv: (total, 3, nheads, headdim).

    Queries and keys share cu_seqlens and max_seqlen. q, k and v are read as
    slices of qkv, without a copy; the gradient of qkv stacks their gradients.
    Other arguments and the result as in flash_attn_varlen_func.
    """
    _check_packed("qkv", qkv, 4, 3, "(total, 3, nheads, headdim)")
    q, k, v = qkv.unbind(dim=1)
    _check_tensors(_OFFSETS, cu_seqlens=cu_seqlens)
    names = {"q": "qkv[:, 0]", "k": "qkv[:, 1]", "v": "qkv[:, 2]", **dict.fromkeys(_CU_SEQLENS, "cu_seqlens"),
             **dict.fromkeys(_MAX_SEQLEN, "max_seqlen")}  # fmt: skip
    varlen = _varlen(q, k, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, names)
    return _attention(
        q, k, v, varlen, names, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        return_attn_probs, learnable_sink,
    )  # fmt: skip


def flash_attn_varlen_kvpacked_func(
    q: Tensor,
    kv: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    learnable_sink: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """flash_attn_varlen_func with k and v packed as kv: (total_k, 2, nheads_k, headdim).

    k and v are read as slices of kv, without a copy; the gradient of kv stacks
    their gradients. Packed, they share one head dim, q's: a v head dim smaller
    than q's needs flash_attn_varlen_func. Other arguments and the result as in
    flash_attn_varlen_func.
    """
    _check_packed("kv", kv, 4, 2, "(total_k, 2, nheads_k, headdim)")
    k, v = kv.unbind(dim=1)
    _check_tensors(q=q)
    _check_kv_head_dim(q, kv, "flash_attn_varlen_func")
    _check_tensors(_OFFSETS, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    names = {**_NAMES, "k": "kv[:, 0]", "v": "kv[:, 1]"}
    varlen = _varlen(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, names)
    return _attention(
        q, k, v, varlen, names, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        return_attn_probs, learnable_sink,
    )  # fmt: skip


def flash_attn_combine(
    out_partial: Tensor,
    lse_partial: Tensor,
    out: Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor]:
    """Merges attention computed over disjoint sets of keys by their LSE (FlashAttention-3's function).

    For context parallelism and ring attention: attend q to each chunk of keys with
    return_attn_probs=True (or flash_attn_varlen_func), stack the chunks' outputs and LSEs,
    and this returns attention over all the keys. Differentiable in out_partial and
    lse_partial, and the LSE that flashattn's functions return is differentiable in q and k, so
    the backward of such a ring flows to q, k and v.

    Args:
        out_partial: fp32 (num_splits, batch, seqlen, nheads, headdim): each split's output.
        lse_partial: fp32 (num_splits, batch, seqlen, nheads): each split's natural-log LSE
            (any strides; flashattn's softmax_lse (batch, nheads, seqlen) is lse.transpose(1, 2)).
            A split that saw no key of a row has lse -inf there.
        out: optional (batch, seqlen, nheads, headdim) tensor of out_dtype to write the result into.
        out_dtype: float32 (default: out_partial's dtype), float16 or bfloat16.

    Returns:
        (out, softmax_lse): out (batch, seqlen, nheads, headdim) = sum_s exp(lse_s - lse) * out_s
        in out_dtype, softmax_lse (batch, seqlen, nheads) fp32 = log(sum_s exp(lse_s)), as
        FlashAttention-3 returns them (its lse a (batch, nheads, seqlen) tensor seen transposed). A
        row that no split saw a key of gets out 0 and lse -inf.

    On CUDA a kernel (one warp per row, bound by reading out_partial; the backward in PyTorch
    operations), on CPU PyTorch arithmetic (flashattn.cpu.combine): flashattn::combine. With out=,
    the result is computed, then copied into out. Bad inputs raise errors naming the argument.
    """
    _check_tensors(out_partial=out_partial, lse_partial=lse_partial)
    _check_tensors(out=out, optional=True)
    if out_dtype is not None and not isinstance(out_dtype, torch.dtype):
        raise TypeError(f"flashattn: out_dtype must be a torch.dtype or None, got {out_dtype!r}")
    if out is not None:
        out_dtype = out_dtype or out.dtype
        want = (*out_partial.shape[1:],) if out_partial.dim() == 5 else None
        if tuple(out.shape) != want or out.dtype != out_dtype:
            raise ValueError(f"flashattn: out must be a {out_dtype} tensor of shape {want} (out_partial's without "
                             f"num_splits), got {out.dtype} of shape {tuple(out.shape)}")
        if out.device != out_partial.device:
            raise RuntimeError(f"flashattn: out is on {out.device} but out_partial is on {out_partial.device}")
    if out_partial.is_cuda:
        _check_cuda_ready(out_partial.device)
    combined, softmax_lse = torch.ops.flashattn.combine(out_partial, lse_partial, out_dtype or out_partial.dtype)
    if out is None:
        return combined, softmax_lse
    out.copy_(combined)
    return out, softmax_lse


def _attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    varlen: "_Varlen | None",
    names: dict[str, str],
    dropout_p: object,
    softmax_scale: object,
    causal: object,
    window_size: object,
    softcap: object,
    alibi_slopes: object,
    deterministic: object,
    return_attn_probs: object,
    learnable_sink: object = None,
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """Checks the options and runs the forward: out, or (out, lse, S_dmask). The tensors are the
    operator's to check; its errors name them as the caller passed them (`names`)."""
    _check_implementation(q, names["q"])
    _check_bool(causal=causal, deterministic=deterministic, return_attn_probs=return_attn_probs)
    _check_dropout_p(dropout_p)
    window = _window_sides(window_size)
    _check_softcap(softcap)
    _check_tensors(alibi_slopes=alibi_slopes, learnable_sink=learnable_sink, optional=True)
    scale = _resolve_softmax_scale(softmax_scale, q.shape[-1] if q.dim() else 1)
    rng_state = _new_rng_state(q.device) if dropout_p > 0 else None
    options = {
        "window_size": window,
        "softcap": float(softcap),
        "alibi_slopes": alibi_slopes,
        "dropout_p": float(dropout_p),
        "rng_state": rng_state,
    }
    if varlen is not None:
        options.update(varlen._asdict())
    out, softmax_lse = _named(names, _flash_attn_forward, q, k, v, scale, bool(causal), bool(deterministic), **options,
                              learnable_sink=learnable_sink)  # fmt: skip
    if not return_attn_probs:
        return out
    if options["dropout_p"] == 0:  # as FlashAttention-2: no Sq x Sk matrix unless dropout is on
        return out, softmax_lse, q.new_empty((0,))
    return out, softmax_lse, _attn_probs(q, k, scale, bool(causal), **options)


def _fp8_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    varlen: "_Varlen | None",
    descales: dict[str, Tensor | None],
    out_dtype: torch.dtype,
    dropout_p: object,
    softmax_scale: object,
    causal: object,
    window_size: object,
    softcap: object,
    deterministic: object,
    return_attn_probs: object,
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """The FP8 kernel's route (flashattn.fp8.runs_kernel chose it; flashattn.fp8.check has checked
    the FP8 arguments): the options checked as _attention checks them, then flashattn::fwd_fp8.
    Returns what _attention returns: out, or (out, lse, S_dmask), S_dmask empty (no dropout here)."""
    _check_bool(causal=causal, deterministic=deterministic, return_attn_probs=return_attn_probs)
    _check_dropout_p(dropout_p)
    _check_softcap(softcap)
    left, right = _window_sides(window_size)
    scale = _resolve_softmax_scale(softmax_scale, q.shape[-1])
    # The kernel reads each descale as (batch, nheads_k) with a row stride only, as it reads alibi_slopes.
    q_descale, k_descale, v_descale = (t if t is None else t.contiguous() for t in descales.values())
    sequences = (None, None, 0, 0)
    if varlen is not None:
        sequences = (varlen.cu_seqlens_q.contiguous(), varlen.cu_seqlens_k.contiguous(), varlen.max_seqlen_q,
                     varlen.max_seqlen_k)  # fmt: skip
    out, softmax_lse = torch.ops.flashattn.fwd_fp8(q, k, v, q_descale, k_descale, v_descale, scale, bool(causal), left,
                                                   right, *sequences, out_dtype)  # fmt: skip
    if not return_attn_probs:
        return out
    return out, softmax_lse, out.new_empty((0,))


def _new_rng_state(device: torch.device) -> Tensor:
    """A fresh dropout seed and offset, int64 (2,) on device, from torch's default generator there."""
    return torch.randint(0, _RNG_STATE_HIGH, (2,), dtype=torch.int64, device=device)


def _window_sides(window_size: object) -> tuple[int, int]:
    """window_size checked and read as the operator takes it: (left, right) Python ints, -1 for an
    unbounded side. Accepted as FlashAttention-2 accepts it (it reads window_size[0] and [1]): a tuple
    or list of two ints or 0-d integer tensors, or a 1-D integer tensor of two; any negative side is
    unbounded. A tensor's values are read with int() (a host sync on CUDA, a graph break under
    torch.compile), as FlashAttention-2 does. A side at least _MAX_WINDOW wide is unbounded for any
    sequence the kernels take (the kernels bound every side by the sequence, csrc/common/mask.cuh)."""
    accepted = "a pair (left, right) of ints (a tuple, a list or a 1-D integer tensor of 2), negative meaning unbounded"
    if isinstance(window_size, Tensor):
        if not _is_integer_tensor(window_size):
            raise TypeError(f"flashattn: window_size must be {accepted}, got a {window_size.dtype} tensor")
        if window_size.dim() != 1:
            raise ValueError(f"flashattn: window_size must be {accepted}, got a tensor of shape "
                             f"{tuple(window_size.shape)}")
    elif not isinstance(window_size, (tuple, list)):
        raise TypeError(f"flashattn: window_size must be {accepted}, got {type(window_size).__name__}")
    if len(window_size) != 2:
        raise ValueError(f"flashattn: window_size must be {accepted}, got {window_size!r}")
    for side in window_size:
        is_int = isinstance(side, Integral) and not isinstance(side, bool)
        if not (is_int or (isinstance(side, Tensor) and side.dim() == 0 and _is_integer_tensor(side))):
            raise TypeError(f"flashattn: window_size must be {accepted}, got {window_size!r}")
    return tuple(-1 if side < 0 or side >= _MAX_WINDOW else side for side in map(int, window_size))


def _is_integer_tensor(t: Tensor) -> bool:
    return not (t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool)


def _flash_attn_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    softmax_scale: float,
    causal: bool,
    deterministic: bool = False,
    *,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    dropout_p: float = 0.0,
    rng_state: Tensor | None = None,
    cu_seqlens_q: Tensor | None = None,
    cu_seqlens_k: Tensor | None = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
    seqused_q: Tensor | None = None,
    seqused_k: Tensor | None = None,
    leftpad_k: Tensor | None = None,
    block_table: Tensor | None = None,
    learnable_sink: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Runs the operator: out and softmax_lse ([B, Sq, H, Dv] and [B, H, Sq], or [total_q, H, Dv]
    and [H, total_q] with cu_seqlens; Dv is v's head dim).

    The forward of every public function; tests call it to see the LSE and to
    pass their own rng_state (dropout_p > 0 needs one). On CUDA it pads the
    head dims as flash_attn_func describes (_kernel_padding; the binding copies
    rows the kernels cannot read in place). out and softmax_lse are
    differentiable in q, k, v and learnable_sink; `deterministic` picks the
    backward's path.
    """
    left, right = _window_sides(window_size)
    if alibi_slopes is not None:
        alibi_slopes = alibi_slopes.contiguous()  # the kernels read (batch, nheads) with a row stride only
    if cu_seqlens_q is not None and cu_seqlens_k is not None:
        cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    options = (softcap, alibi_slopes, dropout_p, rng_state, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
               seqused_q, seqused_k, leftpad_k, block_table)
    if learnable_sink is not None:
        options = (*options, learnable_sink)

    padding = _kernel_padding(q, (k, v), paged=block_table is not None)
    if not any(padding):
        return ops.fwd(q, k, v, softmax_scale, causal, deterministic, left, right, *options)
    # Fresh tensors: zero columns change neither q @ k^T nor any other column of the output or the gradients.
    v_head_dim = v.shape[-1]
    q, k, v = _pad(q, padding.qk), _pad(k, padding.qk), _pad(v, padding.v)
    out, softmax_lse = ops.fwd(q, k, v, softmax_scale, causal, deterministic, left, right, *options)
    return out[..., :v_head_dim], softmax_lse


class _Padding(NamedTuple):
    """Zero columns that CUDA tensors get on their head dim before the kernels, sliced off the results:
    `qk` for q and k, `v` for v and for what has v's head dim (out, dout)."""

    qk: int = 0
    v: int = 0


def _kernel_padding(q: Tensor, *kv_pairs: tuple[Tensor | None, Tensor | None], paged: bool = False,
                    max_head_dim: int = MAX_HEAD_DIM) -> _Padding:
    """The padding of CUDA q and kv_pairs ((k, v) pairs, None where absent: k and v, or the KV cache and
    the new rows) for the kernels: q's and k's head dim d, and v's dv (at most d: DeepSeek MLA's 192 /
    128), each up to the multiple of 8 that the kernels read. No padding on CPU, which computes any head
    dims as they are, nor for inputs that padding would not make valid (ranks or shapes that disagree,
    head dims out of range, a last dimension that is not contiguous): those reach the operator as given,
    whose error then shows the caller's shapes and strides. `paged`: k and v are pages, one rank above q.
    max_head_dim: the largest d of the operator that runs the call (the KV cache's is 256)."""
    pairs = [(k, v) for k, v in kv_pairs if k is not None and v is not None]
    if not _runs_on_kernels(q) or q.dim() == 0 or not pairs:
        return _Padding()
    kv_rank = q.dim() + paged
    head_dim = q.shape[-1]
    v_head_dim = pairs[0][1].shape[-1] if pairs[0][1].dim() else 0
    for k, v in pairs:
        if k.dim() != kv_rank or v.dim() != kv_rank or k.shape[:-1] != v.shape[:-1]:
            return _Padding()
        if k.shape[-1] != head_dim or v.shape[-1] != v_head_dim:
            return _Padding()
    if not 0 < v_head_dim <= head_dim <= max_head_dim:
        return _Padding()
    if any(t.stride(-1) != 1 and t.shape[-1] > 1 for t in (q, *itertools.chain(*pairs))):
        return _Padding()
    return _Padding(-head_dim % _KERNEL_CHUNK_ELEMS, -v_head_dim % _KERNEL_CHUNK_ELEMS)


def _runs_on_kernels(q: Tensor) -> bool:
    """Whether the CUDA kernels run a call on q (the tests force this path on CPU tensors too)."""
    return q.is_cuda


def _pad(t: Tensor | None, columns: int) -> Tensor | None:
    """t with `columns` zero columns appended to its last dimension (a fresh tensor), or t itself
    when there are none (or no t)."""
    return t if t is None or not columns else F.pad(t, (0, columns))


@torch.no_grad()
def _attn_probs(
    q: Tensor,
    k: Tensor,
    softmax_scale: float,
    causal: bool,
    *,
    window_size: tuple[int, int],
    softcap: float,
    alibi_slopes: Tensor | None,
    dropout_p: float,
    rng_state: Tensor | None,
    cu_seqlens_q: Tensor | None = None,
    cu_seqlens_k: Tensor | None = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
    seqused_q: Tensor | None = None,
    seqused_k: Tensor | None = None,
    leftpad_k: Tensor | None = None,
    block_table: Tensor | None = None,
) -> Tensor:
    """S_dmask of return_attn_probs with dropout, in FlashAttention-2's layout and encoding
    (flashattn.cpu.attention_probs): (B, H, Sq, Sk) rounded up to multiples of _S_DMASK_ROUND, in q's
    dtype, 0 in the padding; with cu_seqlens (B, H, max_seqlen_q, max_seqlen_k) rounded up, sequence b's
    used rows and keys from 0 (the offsets are read on the host: a sync on CUDA)."""
    options = (*window_size, softcap, alibi_slopes, dropout_p, rng_state)
    num_heads = q.shape[-2]
    if cu_seqlens_q is None:
        batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
    else:
        batch, seqlen_q, seqlen_k = cu_seqlens_q.shape[0] - 1, int(max_seqlen_q), int(max_seqlen_k)
    shape = (batch, num_heads, _round_up(seqlen_q, _S_DMASK_ROUND), _round_up(seqlen_k, _S_DMASK_ROUND))
    s_dmask = q.new_zeros(shape)
    if cu_seqlens_q is None:
        s_dmask[:, :, :seqlen_q, :seqlen_k] = cpu.attention_probs(q, k, softmax_scale, causal, *options)
        return s_dmask
    paged = block_table is not None
    sequences = cpu._sequences(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, leftpad_k, block_table,
                               k.shape[0], k.shape[1] if paged else 1)  # fmt: skip
    for b, (rows, keys) in enumerate(sequences):
        slopes = alibi_slopes[b : b + 1] if alibi_slopes is not None and alibi_slopes.dim() == 2 else alibi_slopes
        s_dmask[b, :, : rows.stop - rows.start, : keys.stop - keys.start] = cpu.attention_probs(
            q[rows][None], cpu._key_rows(k, keys, block_table, b)[None], softmax_scale, causal, *window_size,
            softcap, slopes, dropout_p, rng_state, batch_start=b,
        )[0]  # fmt: skip
    return s_dmask


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


_NAMES = {"q": "q", "k": "k", "v": "v"}
_CU_SEQLENS = ("cu_seqlens_q", "cu_seqlens_k")
_MAX_SEQLEN = ("max_seqlen_q", "max_seqlen_k")
_OFFSETS = "an int32 tensor of shape (batch + 1,): the offsets of the sequences"
# The operator's names of its parameters in its messages; not after "but ", where q is the tensor that
# the others must agree with ("k has dtype ... but q has ..."), named q whatever the caller passed.
_OPERATOR_NAMES = re.compile(
    r"(?<![\w\[.])(?<!but )(" + "|".join((*_NAMES, *_CU_SEQLENS, *_MAX_SEQLEN)) + r")(?![\w\[])"
)


def _named(names: dict[str, str], run: Callable[..., _Result], *args, **kwargs) -> _Result:
    """run(*args, **kwargs), whose errors from the operator name its parameters (q, k, v,
    cu_seqlens_q, ...), with those errors naming the caller's arguments instead (qkv[:, :, 0] for
    q, ...): same type, same message otherwise. (Under torch.compile the errors come from the fake
    implementation, as they are.)"""
    renamed = {op_name: name for op_name, name in names.items() if op_name != name}
    if not renamed or torch.compiler.is_compiling():
        return run(*args, **kwargs)
    try:
        return run(*args, **kwargs)
    except (TypeError, ValueError, RuntimeError) as err:
        if len(err.args) == 1 and isinstance(err.args[0], str):
            err.args = (_OPERATOR_NAMES.sub(lambda m: renamed.get(m.group(1), m.group(1)), err.args[0]),)
        raise


def _check_implementation(q: Tensor, name: str) -> None:
    """That an implementation runs on q's device: the CPU one, or the built CUDA kernels on a GPU
    they support. (Which other tensors are where is the operator's to check.)"""
    if q.device.type not in ("cpu", "cuda"):
        raise RuntimeError(f"flashattn: {name} is on {q.device}; accepted devices: cpu, cuda")
    if q.is_cuda:
        _check_cuda_ready(q.device)


def _check_cuda_ready(device: torch.device) -> None:
    if not HAS_CUDA_KERNELS:
        raise RuntimeError(NOT_BUILT_REASON)
    reason = unsupported_gpu_reason(device)
    if reason is not None:
        raise RuntimeError(reason)


def _check_tensors(accepted: str = "a torch.Tensor", optional: bool = False, **arguments: object) -> None:
    """That each argument is a torch.Tensor (or None, with `optional`): the type of a Python argument;
    the tensors themselves (device, dtype, shape, strides) are the operator's to check."""
    for name, value in arguments.items():
        if optional and value is None:
            continue
        if not isinstance(value, Tensor):
            raise TypeError(f"flashattn: {name} must be {'None or ' if optional else ''}{accepted}, "
                            f"got {type(value).__name__}")


def _check_packed(name: str, packed: object, rank: int, count: int, layout: str) -> None:
    """packed is a `rank`-D tensor holding `count` tensors in the dimension before the heads."""
    if not isinstance(packed, Tensor):
        raise TypeError(f"flashattn: {name} must be a torch.Tensor, got {type(packed).__name__}")
    if packed.dim() != rank or packed.shape[rank - 3] != count:
        raise ValueError(f"flashattn: {name} must have shape {layout}, got {tuple(packed.shape)}")


def _check_kv_head_dim(q: Tensor, kv: Tensor, unpacked: str) -> None:
    """kv's head dim is q's: packed, k and v share one, so a v head dim other than q's (DeepSeek MLA's
    192 / 128) cannot be packed, and the error says which function takes k and v apart. (q's shape is
    the operator's to check: a 0-d q passes here.)"""
    if q.dim() and kv.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"flashattn: head dims differ (q {tuple(q.shape)}, kv {tuple(kv.shape)}): kv packs k and v with one "
            f"headdim, which must be q's ({q.shape[-1]}); for a v headdim other than q's pass k and v apart to "
            f"{unpacked}"
        )


def _is_real(x: object) -> bool:
    """A Python or NumPy real number, not a bool."""
    return isinstance(x, Real) and not isinstance(x, bool)


def _check_bool(**flags: object) -> None:
    """Flags are bools (or the ints 0 and 1): FlashAttention-2 hands them to C++ as bool, and a
    truthy string or tensor taken as True would hide a mistake."""
    for name, value in flags.items():
        if not (isinstance(value, bool) or (isinstance(value, Integral) and value in (0, 1))):
            raise TypeError(f"flashattn: {name} must be a bool (True or False), got {type(value).__name__} {value!r}")


def _check_dropout_p(dropout_p: object) -> None:
    if not _is_real(dropout_p):
        raise TypeError(f"flashattn: dropout_p must be a number in [0, 1), got {type(dropout_p).__name__}")
    if not 0 <= dropout_p < 1:
        raise ValueError(f"flashattn: dropout_p must be in [0, 1), got {dropout_p}")


def _check_softcap(softcap: object) -> None:
    if not _is_real(softcap):
        raise TypeError(f"flashattn: softcap must be a finite number >= 0, got {type(softcap).__name__}")
    if not 0 <= softcap < math.inf:  # NaN fails too
        raise ValueError(f"flashattn: softcap must be a finite number >= 0 (0: no capping), got {softcap}")


class _Varlen(NamedTuple):
    """The operator's arguments of a variable-length batch."""

    cu_seqlens_q: Tensor
    cu_seqlens_k: Tensor
    max_seqlen_q: int  # or a SymInt under torch.compile
    max_seqlen_k: int
    seqused_q: Tensor | None = None
    seqused_k: Tensor | None = None
    leftpad_k: Tensor | None = None
    block_table: Tensor | None = None


def _varlen(
    q: Tensor,
    k: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: object,
    max_seqlen_k: object,
    names: dict[str, str],
    **sequence_tensors: Tensor | None,
) -> _Varlen:
    """max_seqlen_* checked and read as ints (the offsets and sequence_tensors, _Varlen's last fields,
    are the operator's to check: see flash_attn_varlen_func)."""
    max_q = _check_max_seqlen(names.get("max_seqlen_q", "max_seqlen_q"), max_seqlen_q, _rows(q))
    paged = sequence_tensors.get("block_table") is not None
    key_rows = k.shape[0] * k.shape[1] if paged and k.dim() >= 2 else _rows(k)
    max_k = _check_max_seqlen(names.get("max_seqlen_k", "max_seqlen_k"), max_seqlen_k, key_rows)
    return _Varlen(cu_seqlens_q, cu_seqlens_k, max_q, max_k, **sequence_tensors)


def _rows(t: Tensor) -> int:
    """The rows of packed t (0 for a 0-d tensor, which the operator refuses)."""
    return t.shape[0] if t.dim() else 0


def _check_max_seqlen(name: str, value: object, rows: int) -> int:
    """A non-negative Python int, a SymInt (under torch.compile) or a 0-d integer tensor, as an int.

    Under torch.compile a tensor's value cannot be read without a graph break; `rows` (the packed
    tensor's row count, a bound on every sequence's length) stands in for it: the kernels size their
    grid from it and the blocks past a sequence's end exit at once."""
    accepted = "a non-negative Python int (or a 0-d integer tensor)"
    if isinstance(value, Tensor):
        if value.dim() != 0 or not _is_integer_tensor(value):
            raise TypeError(
                f"flashattn: {name} must be {accepted}, got a {value.dtype} tensor of shape {tuple(value.shape)}"
            )
        if torch.compiler.is_compiling():
            return rows
        value = int(value)  # on the host: a sync on CUDA
    if isinstance(value, torch.SymInt):
        return value
    if not isinstance(value, Integral) or isinstance(value, bool):
        raise TypeError(f"flashattn: {name} must be {accepted}, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"flashattn: {name} must be {accepted}, got {value}")
    return int(value)


def _resolve_softmax_scale(softmax_scale: object, head_dim: int) -> float:
    """softmax_scale checked, or 1/sqrt(headdim) of the unpadded head dim when None (1.0 for a head
    dim of 0, which the operator refuses)."""
    if softmax_scale is None:
        return max(head_dim, 1) ** -0.5
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, Real):
        raise TypeError(
            "flashattn: softmax_scale must be a positive finite number or None, "
            f"got {type(softmax_scale).__name__}"
        )
    if not (math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ValueError(f"flashattn: softmax_scale must be a positive finite number, got {softmax_scale}")
    return float(softmax_scale)
