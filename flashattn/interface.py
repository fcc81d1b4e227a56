"""flash_attn_func and friends: the public functions, with FlashAttention-2's signatures.

Each checks its arguments (an error names the argument, what was given and
what is accepted), prepares the inputs the CUDA kernels need (head-dim padding,
row alignment) and runs torch.ops.flashattn.fwd. The operator is
differentiable (flashattn.ops registers its autograd formula, which runs
flashattn::bwd on the saved q, k, v, out and LSE), so the padding and copies
made here are differentiated by autograd like any other tensor operation.
"""

import math
from numbers import Integral, Real

import torch
import torch.nn.functional as F
from torch import Tensor

from . import ops  # noqa: F401  registers torch.ops.flashattn.fwd and .bwd
from ._extension import HAS_CUDA_KERNELS, NOT_BUILT_REASON, unsupported_gpu_reason

__all__ = ["flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func"]

MAX_HEAD_DIM = 256
CUDA_DTYPES = (torch.float16, torch.bfloat16)
CPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# The kernel moves 16-byte chunks, 8 elements of fp16/bf16: head dims and row
# starts must be multiples of that.
_KERNEL_CHUNK_ELEMS = 8
_KERNEL_CHUNK_BYTES = 16

_Q_LAYOUT = "(batch, seqlen_q, nheads, headdim)"
_KV_LAYOUT = "(batch, seqlen_k, nheads_k, headdim)"


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
) -> Tensor:
    """Exact attention ``softmax(q @ k^T * softmax_scale) @ v``, computed tile by tile.

    A drop-in for ``flash_attn.flash_attn_func`` (FlashAttention-2).

    Args:
        q: (batch, seqlen_q, nheads, headdim).
        k, v: (batch, seqlen_k, nheads_k, headdim). nheads must be a multiple of
            nheads_k (GQA/MQA): query head h uses key/value head h // (nheads // nheads_k).
            headdim may be anything up to 256. The last dimension of q, k and v
            must be contiguous; other strides are honoured.
        dropout_p: must be 0.0: dropout is not implemented yet.
        softmax_scale: scale of q @ k^T; default 1 / sqrt(headdim).
        causal: mask aligned to the bottom-right corner: query i sees key j iff
            j <= i + seqlen_k - seqlen_q. A query row that sees no key outputs 0
            (and gets zero gradients).
        window_size, softcap, alibi_slopes, return_attn_probs: must keep their
            defaults: these options are not implemented yet.
        deterministic: make the backward pass bitwise reproducible run after run
            (on CUDA the default may sum dq with atomics, in a varying order).

    The options not implemented yet are checked as FlashAttention-2 checks them
    before they are refused: dropout_p outside [0, 1), a window_size that is not
    two ints >= -1, a negative softcap, or alibi_slopes that are not an fp32
    (nheads,) or (batch, nheads) tensor on q's device raise ValueError or
    TypeError (RuntimeError for the device); a valid value other than the
    default raises NotImplementedError. Each error names the argument.

    Returns:
        out: (batch, seqlen_q, nheads, headdim) in the dtype of q. It is
        differentiable with respect to q, k and v; the backward pass keeps
        nothing of size seqlen_q x seqlen_k.

    Runs on CUDA tensors (fp16, bf16; GPU sm_80 or newer; kernels built) and on
    CPU tensors (fp16, bf16, fp32) with a PyTorch implementation of the same
    algorithm. On CUDA the kernel needs a head dim that is a multiple of 8 and
    16-byte aligned rows: a head dim that is not is zero-padded (which leaves
    q @ k^T unchanged) and the output and gradients sliced back; an input whose
    start or strides other than the last are not multiples of 8 elements is
    copied. Everything else is read in place, e.g. slices of a packed qkv.
    """
    _check_qkv(q, k, v, ("q", "k", "v"))
    _check_unimplemented(q, dropout_p, window_size, softcap, alibi_slopes, return_attn_probs)
    return _attention(q, k, v, softmax_scale, causal, deterministic)


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
) -> Tensor:
    """flash_attn_func on q, k, v packed as qkv: (batch, seqlen, 3, nheads, headdim).

    q, k and v are read as slices of qkv, without a copy; the gradient of qkv
    stacks their gradients. Other arguments and the result as in flash_attn_func.
    """
    _check_packed("qkv", qkv, 3, "(batch, seqlen, 3, nheads, headdim)")
    q, k, v = qkv.unbind(dim=2)
    _check_qkv(q, k, v, ("qkv[:, :, 0]", "qkv[:, :, 1]", "qkv[:, :, 2]"))
    _check_unimplemented(q, dropout_p, window_size, softcap, alibi_slopes, return_attn_probs)
    return _attention(q, k, v, softmax_scale, causal, deterministic)


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
) -> Tensor:
    """flash_attn_func with k and v packed as kv: (batch, seqlen_k, 2, nheads_k, headdim).

    k and v are read as slices of kv, without a copy; the gradient of kv stacks
    their gradients. Other arguments and the result as in flash_attn_func.
    """
    _check_packed("kv", kv, 2, "(batch, seqlen_k, 2, nheads_k, headdim)")
    k, v = kv.unbind(dim=2)
    _check_qkv(q, k, v, ("q", "kv[:, :, 0]", "kv[:, :, 1]"))
    _check_unimplemented(q, dropout_p, window_size, softcap, alibi_slopes, return_attn_probs)
    return _attention(q, k, v, softmax_scale, causal, deterministic)


def _attention(q: Tensor, k: Tensor, v: Tensor, softmax_scale: object, causal: bool, deterministic: bool) -> Tensor:
    """Checks the scale and runs the forward on checked q, k and v; returns out."""
    scale = _resolve_softmax_scale(softmax_scale, q.shape[-1])
    out, _ = _flash_attn_forward(q, k, v, scale, bool(causal), bool(deterministic))
    return out


def _flash_attn_forward(
    q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, causal: bool, deterministic: bool = False
) -> tuple[Tensor, Tensor]:
    """Runs the operator on checked inputs: out [B, Sq, H, D] and softmax_lse [B, H, Sq].

    The forward of every public function; tests call it to see the LSE. On CUDA
    it pads and aligns the inputs as flash_attn_func describes. out is
    differentiable in q, k and v; `deterministic` picks the backward's path.
    """
    if not q.is_cuda:
        return torch.ops.flashattn.fwd(q, k, v, softmax_scale, causal, deterministic)
    head_dim = q.shape[-1]
    pad = -head_dim % _KERNEL_CHUNK_ELEMS
    q, k, v = (_kernel_layout(t, pad) for t in (q, k, v))
    out, softmax_lse = torch.ops.flashattn.fwd(q, k, v, softmax_scale, causal, deterministic)
    return out[..., :head_dim], softmax_lse


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
        # Traced tensors have no address; the caching allocator aligns every
        # storage, so the storage offset decides (the binding checks the address).
        return strides_ok and t.storage_offset() % _KERNEL_CHUNK_ELEMS == 0
    return strides_ok and t.data_ptr() % _KERNEL_CHUNK_BYTES == 0


def _not_implemented(name: str, given: object, default: object) -> NotImplementedError:
    shown = f"a tensor of shape {tuple(given.shape)}" if isinstance(given, Tensor) else repr(given)
    return NotImplementedError(
        f"flashattn: {name}={shown} is not implemented yet; only the default {name}={default!r} is supported"
    )


def _check_unimplemented(
    q: Tensor,
    dropout_p: object,
    window_size: object,
    softcap: object,
    alibi_slopes: object,
    return_attn_probs: object,
) -> None:
    """The options a later issue implements: a value no implementation would accept is a
    ValueError or TypeError naming the option; a valid one other than the default is
    refused by name, never ignored."""
    _check_dropout_p(dropout_p)
    _check_window_size(window_size)
    _check_softcap(softcap)
    _check_alibi_slopes(alibi_slopes, q)
    if dropout_p != 0.0:
        raise _not_implemented("dropout_p", dropout_p, 0.0)
    if tuple(window_size) != (-1, -1):
        raise _not_implemented("window_size", window_size, (-1, -1))
    if softcap != 0.0:
        raise _not_implemented("softcap", softcap, 0.0)
    if alibi_slopes is not None:
        raise _not_implemented("alibi_slopes", alibi_slopes, None)
    if return_attn_probs:
        raise _not_implemented("return_attn_probs", return_attn_probs, False)


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


def _check_alibi_slopes(alibi_slopes: object, q: Tensor) -> None:
    """None, or fp32 slopes of shape (nheads,) or (batch, nheads) on q's device."""
    if alibi_slopes is None:
        return
    batch, _, num_heads, _ = q.shape
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


def _check_packed(name: str, packed: object, count: int, layout: str) -> None:
    if not isinstance(packed, Tensor):
        raise TypeError(f"flashattn: {name} must be a torch.Tensor, got {type(packed).__name__}")
    if packed.dim() != 5 or packed.shape[2] != count:
        raise ValueError(f"flashattn: {name} must have shape {layout}, got {tuple(packed.shape)}")


def _check_qkv(q: object, k: object, v: object, names: tuple[str, str, str]) -> None:
    """Every check of q, k and v, in the order a user would want to hear about them."""
    for name, t, layout in zip(names, (q, k, v), (_Q_LAYOUT, _KV_LAYOUT, _KV_LAYOUT)):
        if not isinstance(t, Tensor):
            raise TypeError(f"flashattn: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"flashattn: {name} must be 4-D {layout}, got shape {tuple(t.shape)}")
    _check_device_and_dtype(q, k, v, names)
    _check_shapes(q, k, v, names)


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


def _check_shapes(q: Tensor, k: Tensor, v: Tensor, names: tuple[str, str, str]) -> None:
    q_name, k_name, v_name = names
    shapes = f"{q_name} {tuple(q.shape)}, {k_name} {tuple(k.shape)}, {v_name} {tuple(v.shape)}"
    batch, _, num_heads, head_dim = q.shape
    num_heads_k = k.shape[2]
    if k.shape[0] != batch or v.shape[0] != batch:
        raise ValueError(f"flashattn: batch sizes differ ({shapes}); they must be equal")
    if k.shape != v.shape:
        raise ValueError(
            f"flashattn: {k_name} and {v_name} must have the same shape {_KV_LAYOUT}, got {shapes}"
        )
    if k.shape[3] != head_dim:
        raise ValueError(f"flashattn: head dims differ ({shapes}); q, k and v must share one headdim")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(
            f"flashattn: headdim {head_dim} ({shapes}) is not supported; accepted: 1 to {MAX_HEAD_DIM}"
        )
    if num_heads_k == 0 or num_heads % num_heads_k != 0:
        raise ValueError(
            f"flashattn: the number of query heads ({q_name}.shape[2] = {num_heads}) must be a multiple of "
            f"the number of key/value heads ({k_name}.shape[2] = {num_heads_k})"
        )
    for name, t in zip(names, (q, k, v)):
        if t.stride(-1) != 1:
            raise ValueError(
                f"flashattn: the last dimension of {name} must be contiguous (stride 1), got strides "
                f"{t.stride()}; call .contiguous() on it first"
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
