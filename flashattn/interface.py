"""flash_attn_func and friends: the public functions, with FlashAttention-2's signatures.

Each checks its arguments (an error names the argument, what was given and
what is accepted), prepares the inputs the CUDA kernels need (head-dim padding,
row alignment) and runs torch.ops.flashattn.fwd. The operator is
differentiable (flashattn.ops registers its autograd formula, which runs
flashattn::bwd on the saved q, k, v, out and LSE), so the padding and copies
made here are differentiated by autograd like any other tensor operation.

Two layouts: padded batches, q (batch, seqlen_q, nheads, headdim), for
flash_attn_func and its packed twins; variable-length batches, q
(total_q, nheads, headdim) with cu_seqlens offsets, for flash_attn_varlen_func
and its packed twins (flashattn.padding converts a padding mask to that layout).
"""

import math
from numbers import Integral, Real
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from . import ops  # registers torch.ops.flashattn.fwd and .bwd
from ._extension import HAS_CUDA_KERNELS, NOT_BUILT_REASON, unsupported_gpu_reason

__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
]

MAX_HEAD_DIM = 256
CUDA_DTYPES = (torch.float16, torch.bfloat16)
CPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# The kernel moves 16-byte chunks, 8 elements of fp16/bf16: head dims and row
# starts must be multiples of that.
_KERNEL_CHUNK_ELEMS = 8
_KERNEL_CHUNK_BYTES = 16
# A window side at least this wide is unbounded for any sequence the kernels take
# (lengths fit int32), and the binding takes window sides as int32.
_MAX_WINDOW = 2**31 - 1
# Dropout's Philox seed and offset: drawn from torch's generator, so torch.manual_seed
# reproduces them and a CUDA graph's replay draws fresh ones.
_RNG_STATE_HIGH = 2**62

_Q_LAYOUT = "(batch, seqlen_q, nheads, headdim)"
_KV_LAYOUT = "(batch, seqlen_k, nheads_k, headdim)"
_VARLEN_Q_LAYOUT = "(total_q, nheads, headdim)"
_VARLEN_KV_LAYOUT = "(total_k, nheads_k, headdim)"


class _Varlen(NamedTuple):
    """The checked description of a variable-length batch."""

    cu_seqlens_q: Tensor  # int32 [B + 1], contiguous, on q's device
    cu_seqlens_k: Tensor
    max_seqlen_q: int  # or a SymInt under torch.compile
    max_seqlen_k: int

    @property
    def batch(self) -> int:
        return self.cu_seqlens_q.shape[0] - 1


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
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """Exact attention ``softmax(q @ k^T * softmax_scale) @ v``, computed tile by tile.

    A drop-in for ``flash_attn.flash_attn_func`` (FlashAttention-2).

    Args:
        q: (batch, seqlen_q, nheads, headdim).
        k, v: (batch, seqlen_k, nheads_k, headdim). nheads must be a multiple of
            nheads_k (GQA/MQA): query head h uses key/value head h // (nheads // nheads_k).
            headdim may be anything up to 256. The last dimension of q, k and v
            must be contiguous; other strides are honoured.
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
            i + seqlen_k - seqlen_q + right]; -1 leaves a side unbounded. causal sets right to 0.
        softcap: if > 0, scores become softcap * tanh(scores / softcap) (before ALiBi and masking).
        alibi_slopes: fp32 (nheads,) or (batch, nheads) on q's device: adds
            -slope * |i + seqlen_k - seqlen_q - j| to the score of query i and key j.
        deterministic: make the backward pass bitwise reproducible run after run
            (on CUDA the default may sum dq with atomics, in a varying order).
        return_attn_probs: also return softmax_lse and S_dmask (for tests, see Returns).

    Bad option values raise ValueError or TypeError (RuntimeError for a tensor
    on another device) naming the option: dropout_p outside [0, 1), a
    window_size that is not two ints >= -1, a negative or non-finite softcap,
    alibi_slopes that are not an fp32 (nheads,) or (batch, nheads) tensor.

    Returns:
        out: (batch, seqlen_q, nheads, headdim) in the dtype of q. It is
        differentiable with respect to q, k and v; the backward pass keeps
        nothing of size seqlen_q x seqlen_k. With return_attn_probs=True,
        (out, softmax_lse, S_dmask): softmax_lse (batch, nheads, seqlen_q)
        fp32, the natural-log log-sum-exp of the scores (undropped); S_dmask
        (batch, nheads, seqlen_q, seqlen_k) fp32, the attention probabilities
        (undropped, after softcap, ALiBi and masking: 0 where masked), negated
        (sign bit set) where dropout dropped them. S_dmask is recomputed in
        PyTorch from q, k and the LSE and materialises seqlen_q x seqlen_k per
        head: it is for tests and inspection, not for long sequences.

    Runs on CUDA tensors (fp16, bf16; GPU sm_80 or newer; kernels built) and on
    CPU tensors (fp16, bf16, fp32) with a PyTorch implementation of the same
    algorithm. On CUDA the kernel needs a head dim that is a multiple of 8 and
    16-byte aligned rows: a head dim that is not is zero-padded (which leaves
    q @ k^T unchanged) and the output and gradients sliced back; an input whose
    start or strides other than the last are not multiples of 8 elements is
    copied. Everything else is read in place, e.g. slices of a packed qkv.
    """
    _check_qkv(q, k, v, ("q", "k", "v"))
    return _attention(
        q, k, v, None, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        return_attn_probs,
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
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """flash_attn_func on q, k, v packed as qkv: (batch, seqlen, 3, nheads, headdim).

    q, k and v are read as slices of qkv, without a copy; the gradient of qkv
    stacks their gradients. Other arguments and the result as in flash_attn_func.
    """
    _check_packed("qkv", qkv, 5, 3, "(batch, seqlen, 3, nheads, headdim)")
    q, k, v = qkv.unbind(dim=2)
    _check_qkv(q, k, v, ("qkv[:, :, 0]", "qkv[:, :, 1]", "qkv[:, :, 2]"))
    return _attention(
        q, k, v, None, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        return_attn_probs,
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
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """flash_attn_func with k and v packed as kv: (batch, seqlen_k, 2, nheads_k, headdim).

    k and v are read as slices of kv, without a copy; the gradient of kv stacks
    their gradients. Other arguments and the result as in flash_attn_func.
    """
    _check_packed("kv", kv, 5, 2, "(batch, seqlen_k, 2, nheads_k, headdim)")
    k, v = kv.unbind(dim=2)
    _check_qkv(q, k, v, ("q", "kv[:, :, 0]", "kv[:, :, 1]"))
    return _attention(
        q, k, v, None, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        return_attn_probs,
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
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """flash_attn_func on a variable-length batch: the sequences' tokens packed one after another.

    A drop-in for ``flash_attn.flash_attn_varlen_func`` (FlashAttention-2).
    flashattn.unpad_input makes these arguments from a padded batch and its
    padding mask; flashattn.pad_input turns out back into a padded batch.

    Args:
        q: (total_q, nheads, headdim): the queries of every sequence, one after another.
        k, v: (total_k, nheads_k, headdim), likewise; heads and headdim as in flash_attn_func.
        cu_seqlens_q, cu_seqlens_k: int32 (batch + 1,) on q's device: sequence b is
            q[cu_seqlens_q[b]:cu_seqlens_q[b + 1]] attending to the keys
            k[cu_seqlens_k[b]:cu_seqlens_k[b + 1]]. Nondecreasing from 0; lengths 0 and 1 are
            fine. Rows past cu_seqlens_q[-1] belong to no sequence (their out is unspecified
            on CUDA, 0 on CPU; their gradients are 0).
        max_seqlen_q, max_seqlen_k: at least the longest query (key) sequence: a Python int
            (a SymInt under torch.compile(dynamic=True)), or a 0-d integer tensor: read with
            int() (a host sync on CUDA), or under torch.compile replaced by the row count of q
            (k), a bound on every length that needs no read (S_dmask then has that many rows).
        dropout_p, softmax_scale, causal, window_size, softcap, deterministic: as in
            flash_attn_func, applied to each sequence on its own: causal and window_size
            align each sequence's queries to the bottom-right corner of its own keys.
        alibi_slopes: fp32 (nheads,) or (batch, nheads), batch = len(cu_seqlens_q) - 1.
        return_attn_probs: as in flash_attn_func; softmax_lse is (nheads, total_q) and
            S_dmask (batch, nheads, max_seqlen_q, max_seqlen_k), 0 outside each sequence.
        block_table: paged KV cache; not implemented yet, must be None.

    What is checked: cu_seqlens_* are int32 1-D tensors of one length on q's device,
    max_seqlen_* non-negative ints. On CPU tensors the values are checked too
    (cu_seqlens start at 0, never decrease, end within q's and k's rows; max_seqlen_*
    at least every length). On CUDA tensors the values are not checked: reading them
    would wait for the GPU. Offsets that break those rules there read out of bounds
    or leave rows unwritten, as they do in FlashAttention-2.

    Returns:
        out (total_q, nheads, headdim) in q's dtype, differentiable in q, k and v; or
        (out, softmax_lse, S_dmask) with return_attn_probs=True.
    """
    if block_table is not None:
        raise NotImplementedError(
            "flashattn: block_table (a paged KV cache) is not implemented yet in flash_attn_varlen_func; "
            "only block_table=None is supported"
        )
    _check_qkv(q, k, v, ("q", "k", "v"), varlen=True)
    varlen = _check_varlen(
        q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"),
    )  # fmt: skip
    return _attention(
        q, k, v, varlen, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        return_attn_probs,
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
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """flash_attn_varlen_func on q, k, v packed as qkv: (total, 3, nheads, headdim).

    Queries and keys share cu_seqlens and max_seqlen. q, k and v are read as
    slices of qkv, without a copy; the gradient of qkv stacks their gradients.
    Other arguments and the result as in flash_attn_varlen_func.
    """
    _check_packed("qkv", qkv, 4, 3, "(total, 3, nheads, headdim)")
    q, k, v = qkv.unbind(dim=1)
    _check_qkv(q, k, v, ("qkv[:, 0]", "qkv[:, 1]", "qkv[:, 2]"), varlen=True)
    varlen = _check_varlen(
        q, k, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, ("cu_seqlens", "cu_seqlens", "max_seqlen", "max_seqlen")
    )
    return _attention(
        q, k, v, varlen, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        return_attn_probs,
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
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """flash_attn_varlen_func with k and v packed as kv: (total_k, 2, nheads_k, headdim).

    k and v are read as slices of kv, without a copy; the gradient of kv stacks
    their gradients. Other arguments and the result as in flash_attn_varlen_func.
    """
    _check_packed("kv", kv, 4, 2, "(total_k, 2, nheads_k, headdim)")
    k, v = kv.unbind(dim=1)
    _check_qkv(q, k, v, ("q", "kv[:, 0]", "kv[:, 1]"), varlen=True)
    varlen = _check_varlen(
        q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"),
    )  # fmt: skip
    return _attention(
        q, k, v, varlen, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        return_attn_probs,
    )  # fmt: skip


def _attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    varlen: _Varlen | None,
    dropout_p: object,
    softmax_scale: object,
    causal: object,
    window_size: object,
    softcap: object,
    alibi_slopes: object,
    deterministic: object,
    return_attn_probs: object,
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """Checks the options and runs the forward on checked q, k and v: out, or (out, lse, S_dmask)."""
    batch = q.shape[0] if varlen is None else varlen.batch
    _check_options(q, batch, dropout_p, window_size, softcap, alibi_slopes)
    scale = _resolve_softmax_scale(softmax_scale, q.shape[-1])
    rng_state = _new_rng_state(q.device) if dropout_p > 0 else None
    options = {
        "window_size": tuple(window_size),
        "softcap": float(softcap),
        "alibi_slopes": alibi_slopes,
        "dropout_p": float(dropout_p),
        "rng_state": rng_state,
    }
    if varlen is not None:
        options.update(varlen._asdict())
    out, softmax_lse = _flash_attn_forward(q, k, v, scale, bool(causal), bool(deterministic), **options)
    if not return_attn_probs:
        return out
    return out, softmax_lse, _attn_probs(q, k, softmax_lse, scale, bool(causal), **options)


def _new_rng_state(device: torch.device) -> Tensor:
    """A fresh dropout seed and offset, int64 (2,) on device, from torch's default generator there."""
    return torch.randint(0, _RNG_STATE_HIGH, (2,), dtype=torch.int64, device=device)


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
) -> tuple[Tensor, Tensor]:
    """Runs the operator on checked inputs: out and softmax_lse ([B, Sq, H, D] and [B, H, Sq], or
    [total_q, H, D] and [H, total_q] with cu_seqlens).

    The forward of every public function; tests call it to see the LSE and to
    pass their own rng_state (dropout_p > 0 needs one). On CUDA it pads and
    aligns the inputs as flash_attn_func describes. out is differentiable in q,
    k and v; `deterministic` picks the backward's path.
    """
    left, right = (min(side, _MAX_WINDOW) for side in window_size)
    if alibi_slopes is not None:
        alibi_slopes = alibi_slopes.contiguous()  # the kernels read (batch, nheads) with a row stride only
    if cu_seqlens_q is not None:
        cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    options = (softcap, alibi_slopes, dropout_p, rng_state, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if not q.is_cuda:
        return torch.ops.flashattn.fwd(q, k, v, softmax_scale, causal, deterministic, left, right, *options)
    head_dim = q.shape[-1]
    pad = -head_dim % _KERNEL_CHUNK_ELEMS
    q, k, v = (_kernel_layout(t, pad) for t in (q, k, v))
    out, softmax_lse = torch.ops.flashattn.fwd(q, k, v, softmax_scale, causal, deterministic, left, right, *options)
    return out[..., :head_dim], softmax_lse


@torch.no_grad()
def _attn_probs(
    q: Tensor,
    k: Tensor,
    softmax_lse: Tensor,
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
) -> Tensor:
    """S_dmask of return_attn_probs: fp32 (B, H, Sq, Sk), or (B, H, max_seqlen_q, max_seqlen_k) with 0
    outside each sequence (read on the host: a sync on CUDA)."""
    options = (*window_size, softcap, alibi_slopes, dropout_p, rng_state)
    if cu_seqlens_q is None:
        return ops.attention_probs(q, k, softmax_lse, softmax_scale, causal, *options)
    num_heads = q.shape[1]
    batch = cu_seqlens_q.shape[0] - 1
    probs = q.new_zeros((batch, num_heads, int(max_seqlen_q), int(max_seqlen_k)), dtype=torch.float32)
    starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(batch):
        rows, keys = slice(starts_q[b], starts_q[b + 1]), slice(starts_k[b], starts_k[b + 1])
        slopes = alibi_slopes[b : b + 1] if alibi_slopes is not None and alibi_slopes.dim() == 2 else alibi_slopes
        probs[b, :, : rows.stop - rows.start, : keys.stop - keys.start] = ops.attention_probs(
            q[rows][None], k[keys][None], softmax_lse[:, rows][None], softmax_scale, causal,
            *window_size, softcap, slopes, dropout_p, rng_state, batch_start=b,
        )[0]  # fmt: skip
    return probs


def _kernel_layout(t: Tensor, pad: int) -> Tensor:
    """t, whose last dimension is contiguous (checked), as the CUDA kernels read it: head dim
    zero-padded by `pad` (zero columns change neither q @ k^T nor any other column of the
    output or the gradients), rows 16-byte aligned."""
    if pad:
        return F.pad(t, (0, pad))  # a fresh, hence aligned, tensor
    if _rows_aligned(t):
        return t
    # clone, not contiguous(): a contiguous tensor at an odd storage offset stays misaligned.
    return t.clone(memory_format=torch.contiguous_format)


def _rows_aligned(t: Tensor) -> bool:
    """Whether every row of t starts on a 16-byte boundary."""
    strides_ok = all(
        size <= 1 or stride % _KERNEL_CHUNK_ELEMS == 0 for size, stride in zip(t.shape[:-1], t.stride()[:-1])
    )
    if torch.compiler.is_compiling():
        # Traced tensors have no address (and a view's storage offset may not be
        # traceable): the binding copies a misaligned start itself.
        return strides_ok
    return strides_ok and t.data_ptr() % _KERNEL_CHUNK_BYTES == 0


def _check_options(
    q: Tensor, batch: int, dropout_p: object, window_size: object, softcap: object, alibi_slopes: object
) -> None:
    """Every option's value, checked as FlashAttention-2 checks them: an error names the option."""
    _check_dropout_p(dropout_p)
    _check_window_size(window_size)
    _check_softcap(softcap)
    _check_alibi_slopes(alibi_slopes, q, batch)


def _is_real(x: object) -> bool:
    """A Python or NumPy real number, not a bool."""
    return isinstance(x, Real) and not isinstance(x, bool)


def _check_dropout_p(dropout_p: object) -> None:
    if not _is_real(dropout_p):
        raise TypeError(f"flashattn: dropout_p must be a number in [0, 1), got {type(dropout_p).__name__}")
    if not 0 <= dropout_p < 1:
        raise ValueError(f"flashattn: dropout_p must be in [0, 1), got {dropout_p}")


def _check_window_size(window_size: object) -> None:
    accepted = "a pair (left, right) of ints >= -1, -1 meaning unbounded on that side"
    if not isinstance(window_size, (tuple, list)):
        raise TypeError(f"flashattn: window_size must be {accepted}, got {type(window_size).__name__}")
    if len(window_size) != 2:
        raise ValueError(f"flashattn: window_size must be {accepted}, got {window_size!r}")
    if not all(isinstance(side, Integral) and not isinstance(side, bool) for side in window_size):
        raise TypeError(f"flashattn: window_size must be {accepted}, got {window_size!r}")
    if min(window_size) < -1:
        raise ValueError(f"flashattn: window_size must be {accepted}, got {window_size!r}")


def _check_softcap(softcap: object) -> None:
    if not _is_real(softcap):
        raise TypeError(f"flashattn: softcap must be a finite number >= 0, got {type(softcap).__name__}")
    if not 0 <= softcap < math.inf:  # NaN fails too
        raise ValueError(f"flashattn: softcap must be a finite number >= 0 (0: no capping), got {softcap}")


def _check_alibi_slopes(alibi_slopes: object, q: Tensor, batch: int | None = None) -> None:
    """None, or fp32 slopes of shape (nheads,) or (batch, nheads) on q's device; batch defaults to
    padded q's (a variable-length batch passes its number of sequences)."""
    if alibi_slopes is None:
        return
    batch = q.shape[0] if batch is None else batch
    num_heads = q.shape[-2]
    accepted = f"a float32 tensor of shape (nheads,) = ({num_heads},) or (batch, nheads) = ({batch}, {num_heads})"
    if not isinstance(alibi_slopes, Tensor):
        raise TypeError(f"flashattn: alibi_slopes must be {accepted}, got {type(alibi_slopes).__name__}")
    if alibi_slopes.dtype != torch.float32:
        raise TypeError(f"flashattn: alibi_slopes must be {accepted}, got dtype {alibi_slopes.dtype}")
    if alibi_slopes.shape not in ((num_heads,), (batch, num_heads)):
        raise ValueError(f"flashattn: alibi_slopes must be {accepted}, got shape {tuple(alibi_slopes.shape)}")
    if alibi_slopes.device != q.device:
        raise RuntimeError(
            f"flashattn: alibi_slopes is on {alibi_slopes.device} but q is on {q.device}; they must be on one device"
        )


def _check_packed(name: str, packed: object, rank: int, count: int, layout: str) -> None:
    """packed is a `rank`-D tensor holding `count` tensors in the dimension before the heads."""
    if not isinstance(packed, Tensor):
        raise TypeError(f"flashattn: {name} must be a torch.Tensor, got {type(packed).__name__}")
    if packed.dim() != rank or packed.shape[rank - 3] != count:
        raise ValueError(f"flashattn: {name} must have shape {layout}, got {tuple(packed.shape)}")


def _check_qkv(q: object, k: object, v: object, names: tuple[str, str, str], varlen: bool = False) -> None:
    """Every check of q, k and v, in the order a user would want to hear about them."""
    rank = 3 if varlen else 4
    q_layout, kv_layout = (_VARLEN_Q_LAYOUT, _VARLEN_KV_LAYOUT) if varlen else (_Q_LAYOUT, _KV_LAYOUT)
    layouts = (q_layout, kv_layout, kv_layout)
    for name, t, layout in zip(names, (q, k, v), layouts):
        if not isinstance(t, Tensor):
            raise TypeError(f"flashattn: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != rank:
            raise ValueError(f"flashattn: {name} must be {rank}-D {layout}, got shape {tuple(t.shape)}")
    _check_device_and_dtype(q, k, v, names)
    _check_shapes(q, k, v, names, layouts[1])


def _check_device_and_dtype(q: Tensor, k: Tensor, v: Tensor, names: tuple[str, str, str]) -> None:
    q_name = names[0]
    for name, t in zip(names[1:], (k, v)):
        if t.device != q.device:
            raise RuntimeError(
                f"flashattn: {name} is on {t.device} but {q_name} is on {q.device}; "
                "q, k and v must be on one device"
            )
    if q.device.type not in ("cpu", "cuda"):
        raise RuntimeError(f"flashattn: {q_name} is on {q.device}; accepted devices: cpu, cuda")
    accepted = CUDA_DTYPES if q.is_cuda else CPU_DTYPES
    if q.dtype not in accepted:
        raise TypeError(
            f"flashattn: {q_name} has dtype {q.dtype}; accepted on {q.device.type}: "
            + ", ".join(str(dtype) for dtype in accepted)
        )
    for name, t in zip(names[1:], (k, v)):
        if t.dtype != q.dtype:
            raise TypeError(
                f"flashattn: {name} has dtype {t.dtype} but {q_name} has {q.dtype}; "
                "q, k and v must share one dtype"
            )
    if q.is_cuda:
        _check_cuda_ready(q.device)


def _check_cuda_ready(device: torch.device) -> None:
    if not HAS_CUDA_KERNELS:
        raise RuntimeError(NOT_BUILT_REASON)
    reason = unsupported_gpu_reason(device)
    if reason is not None:
        raise RuntimeError(reason)


def _check_shapes(q: Tensor, k: Tensor, v: Tensor, names: tuple[str, str, str], kv_layout: str) -> None:
    """Shapes of padded (4-D: batch sizes must agree) or variable-length (3-D) q, k and v."""
    q_name, k_name, v_name = names
    shapes = f"{q_name} {tuple(q.shape)}, {k_name} {tuple(k.shape)}, {v_name} {tuple(v.shape)}"
    num_heads, head_dim = q.shape[-2:]
    num_heads_k = k.shape[-2]
    heads_dim = q.dim() - 2
    if q.dim() == 4 and (k.shape[0] != q.shape[0] or v.shape[0] != q.shape[0]):
        raise ValueError(f"flashattn: batch sizes differ ({shapes}); they must be equal")
    if k.shape != v.shape:
        raise ValueError(f"flashattn: {k_name} and {v_name} must have the same shape {kv_layout}, got {shapes}")
    if k.shape[-1] != head_dim:
        raise ValueError(f"flashattn: head dims differ ({shapes}); q, k and v must share one headdim")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(
            f"flashattn: headdim {head_dim} ({shapes}) is not supported; accepted: 1 to {MAX_HEAD_DIM}"
        )
    if num_heads_k == 0 or num_heads % num_heads_k != 0:
        raise ValueError(
            f"flashattn: the number of query heads ({q_name}.shape[{heads_dim}] = {num_heads}) must be a multiple "
            f"of the number of key/value heads ({k_name}.shape[{heads_dim}] = {num_heads_k})"
        )
    for name, t in zip(names, (q, k, v)):
        if t.stride(-1) != 1:
            raise ValueError(
                f"flashattn: the last dimension of {name} must be contiguous (stride 1), got strides "
                f"{t.stride()}; call .contiguous() on it first"
            )


def _check_varlen(
    q: Tensor,
    k: Tensor,
    cu_seqlens_q: object,
    cu_seqlens_k: object,
    max_seqlen_q: object,
    max_seqlen_k: object,
    names: tuple[str, str, str, str],
) -> _Varlen:
    """cu_seqlens_* and max_seqlen_* checked (their values on CPU only: see flash_attn_varlen_func)."""
    cu_q_name, cu_k_name, max_q_name, max_k_name = names
    for name, cu in ((cu_q_name, cu_seqlens_q), (cu_k_name, cu_seqlens_k)):
        accepted = "an int32 tensor of shape (batch + 1,): the offsets of the sequences"
        if not isinstance(cu, Tensor):
            raise TypeError(f"flashattn: {name} must be {accepted}, got {type(cu).__name__}")
        if cu.dtype != torch.int32:
            raise TypeError(f"flashattn: {name} must be {accepted}, got dtype {cu.dtype}")
        if cu.dim() != 1 or cu.shape[0] == 0:
            raise ValueError(f"flashattn: {name} must be {accepted}, got shape {tuple(cu.shape)}")
        if cu.device != q.device:
            raise RuntimeError(
                f"flashattn: {name} is on {cu.device} but q is on {q.device}; it must be on q's device"
            )
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(
            f"flashattn: {cu_q_name} {tuple(cu_seqlens_q.shape)} and {cu_k_name} {tuple(cu_seqlens_k.shape)} "
            "must have the same length (batch + 1)"
        )
    max_q = _check_max_seqlen(max_q_name, max_seqlen_q, q.shape[0])
    max_k = _check_max_seqlen(max_k_name, max_seqlen_k, k.shape[0])
    if not q.is_cuda and not torch.compiler.is_compiling():
        _check_offsets(cu_q_name, cu_seqlens_q, q.shape[0], "q", max_q_name, max_q)
        _check_offsets(cu_k_name, cu_seqlens_k, k.shape[0], "k", max_k_name, max_k)
    return _Varlen(cu_seqlens_q, cu_seqlens_k, max_q, max_k)


def _check_max_seqlen(name: str, value: object, rows: int) -> int:
    """A non-negative Python int, a SymInt (under torch.compile) or a 0-d integer tensor, as an int.

    Under torch.compile a tensor's value cannot be read without a graph break; `rows` (the packed
    tensor's row count, a bound on every sequence's length) stands in for it: the kernels size their
    grid from it and the blocks past a sequence's end exit at once."""
    accepted = "a non-negative Python int (or a 0-d integer tensor)"
    if isinstance(value, Tensor):
        if value.dim() != 0 or value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
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


def _check_offsets(
    name: str, cu_seqlens: Tensor, rows: int, tensor_name: str, max_name: str, max_seqlen: int
) -> None:
    """The values of CPU offsets: 0 first, nondecreasing, within the rows of the tensor, lengths <= max_seqlen."""
    offsets = cu_seqlens.tolist()
    if offsets[0] != 0:
        raise ValueError(f"flashattn: {name} must start at 0, got {name}[0] = {offsets[0]}")
    lengths = [stop - start for start, stop in zip(offsets, offsets[1:])]
    if any(length < 0 for length in lengths):
        raise ValueError(f"flashattn: {name} must be nondecreasing, got {offsets}")
    if offsets[-1] > rows:
        raise ValueError(
            f"flashattn: {name}[-1] = {offsets[-1]} is past the {rows} rows of {tensor_name}; "
            f"{name} must end at most at {tensor_name}.shape[0]"
        )
    longest = max(lengths, default=0)
    if isinstance(max_seqlen, int) and longest > max_seqlen:
        raise ValueError(
            f"flashattn: {max_name} = {max_seqlen} is less than the longest sequence of {name} ({longest}); "
            f"it must be at least every sequence's length"
        )


def _resolve_softmax_scale(softmax_scale: object, head_dim: int) -> float:
    """softmax_scale checked, or 1/sqrt(headdim) of the unpadded head dim when None."""
    if softmax_scale is None:
        return head_dim**-0.5
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, Real):
        raise TypeError(
            "flashattn: softmax_scale must be a positive finite number or None, "
            f"got {type(softmax_scale).__name__}"
        )
    if not (math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ValueError(f"flashattn: softmax_scale must be a positive finite number, got {softmax_scale}")
    return float(softmax_scale)
