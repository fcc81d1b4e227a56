"""FlashAttention-2's ``flash_attn.flash_attn_interface``, over flashattn's operators.

The public functions, re-exported, and the private entry points that context-parallel and
ring-attention libraries import, with flash-attn 2.8's signatures and results:

- ``_flash_attn_forward(q, k, v, dropout_p, softmax_scale, causal, window_size_left,
  window_size_right, softcap, alibi_slopes, return_softmax) -> (out, softmax_lse, S_dmask, rng_state)``
- ``_flash_attn_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
  dropout_p, softmax_scale, causal, window_size_left=-1, window_size_right=-1, softcap=0.0,
  alibi_slopes=None, return_softmax=False, block_table=None, leftpad_k=None, seqused_k=None,
  zero_tensors=False)``, same results (softmax_lse (nheads, total_q))
- ``_flash_attn_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale, causal,
  window_size_left, window_size_right, softcap, alibi_slopes, deterministic, rng_state=None) -> softmax_d``:
  writes the gradients into the caller's dq, dk, dv (each may be None: not wanted)
- ``_flash_attn_varlen_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
  max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal, window_size_left, window_size_right,
  softcap, alibi_slopes, deterministic, rng_state=None, zero_tensors=False) -> softmax_d``

They are custom operators (``torch.ops.flashattn._flash_attn_forward``, ...), as flash-attn 2.7+'s are,
with fake implementations for torch.compile; ``_wrapped_flash_attn_forward`` and friends are the
operator handles, as in flash-attn. Like flash-attn's they are not differentiable: the caller's own
autograd.Function runs the backward. rng_state is the dropout seed and offset (int64 (2,)) to hand
back to the backward (zeros without dropout). S_dmask is as flash_attn_func returns it with dropout
(return_softmax=True needs dropout_p > 0, as in flash-attn), else an empty (0,) tensor. softmax_d is
rowsum(dout * out) * (1 - dropout_p), fp32, in flash-attn's layout: (batch, nheads, seqlen_q rounded
up to 128), or (nheads, total_q + 128 * batch) with sequence b's rows from cu_seqlens_q[b] + 128 * b;
0 elsewhere. Unlike flash-attn's, they take any head dim up to 512 on CUDA too (padded as
flash_attn_func pads it), a head dim of v smaller than q's and k's (out and dout then have v's, as in
FlashAttention-3) and CPU tensors. (flashattn.interface._flash_attn_forward is another
function: the forward of flashattn's own public functions.)
"""

import torch
from torch import Tensor

from . import interface
from .interface import *  # noqa: F403 (flash_attn_func and the other public functions, re-exported)
from .cpu import out_shape
from .interface import _S_DMASK_ROUND, _attn_probs, _kernel_padding, _new_rng_state, _pad, _round_up, _window_sides
from .kvcache import flash_attn_with_kvcache

__all__ = [*interface.__all__, "flash_attn_with_kvcache"]


@torch.library.custom_op("flashattn::_flash_attn_forward", mutates_args=())
def _flash_attn_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dropout_p: float,
    softmax_scale: float,
    causal: bool,
    window_size_left: int,
    window_size_right: int,
    softcap: float,
    alibi_slopes: Tensor | None,
    return_softmax: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return _forward(q, k, v, dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap,
                    alibi_slopes, return_softmax)


@torch.library.custom_op("flashattn::_flash_attn_varlen_forward", mutates_args=())
def _flash_attn_varlen_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float,
    softmax_scale: float,
    causal: bool,
    window_size_left: int = -1,
    window_size_right: int = -1,
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    return_softmax: bool = False,
    block_table: Tensor | None = None,
    leftpad_k: Tensor | None = None,
    seqused_k: Tensor | None = None,
    zero_tensors: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    varlen = {"cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k, "max_seqlen_q": max_seqlen_q,
              "max_seqlen_k": max_seqlen_k, "seqused_k": seqused_k, "leftpad_k": leftpad_k,
              "block_table": block_table}  # fmt: skip
    out, softmax_lse, s_dmask, rng_state = _forward(q, k, v, dropout_p, softmax_scale, causal, window_size_left,
                                                    window_size_right, softcap, alibi_slopes, return_softmax, varlen)
    # zero_tensors needs nothing: rows no sequence uses get out 0 and lse -inf on every path.
    return out, softmax_lse, s_dmask, rng_state


@torch.library.custom_op("flashattn::_flash_attn_backward", mutates_args=("dq", "dk", "dv"))
def _flash_attn_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    softmax_lse: Tensor,
    dq: Tensor | None,
    dk: Tensor | None,
    dv: Tensor | None,
    dropout_p: float,
    softmax_scale: float,
    causal: bool,
    window_size_left: int,
    window_size_right: int,
    softcap: float,
    alibi_slopes: Tensor | None,
    deterministic: bool,
    rng_state: Tensor | None = None,
) -> Tensor:
    grads = _backward(dout, q, k, v, out, softmax_lse, dropout_p, softmax_scale, causal, deterministic,
                      window_size_left, window_size_right, softcap, alibi_slopes, rng_state)
    _write_grads((dq, dk, dv), grads)
    return _softmax_d(dout, out, dropout_p)


@torch.library.custom_op("flashattn::_flash_attn_varlen_backward", mutates_args=("dq", "dk", "dv"))
def _flash_attn_varlen_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    softmax_lse: Tensor,
    dq: Tensor | None,
    dk: Tensor | None,
    dv: Tensor | None,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float,
    softmax_scale: float,
    causal: bool,
    window_size_left: int,
    window_size_right: int,
    softcap: float,
    alibi_slopes: Tensor | None,
    deterministic: bool,
    rng_state: Tensor | None = None,
    zero_tensors: bool = False,
) -> Tensor:
    grads = _backward(dout, q, k, v, out, softmax_lse, dropout_p, softmax_scale, causal, deterministic,
                      window_size_left, window_size_right, softcap, alibi_slopes, rng_state,
                      cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)  # fmt: skip
    _write_grads((dq, dk, dv), grads)
    return _softmax_d(dout, out, dropout_p, cu_seqlens_q)


_wrapped_flash_attn_forward = torch.ops.flashattn._flash_attn_forward
_wrapped_flash_attn_varlen_forward = torch.ops.flashattn._flash_attn_varlen_forward
_wrapped_flash_attn_backward = torch.ops.flashattn._flash_attn_backward
_wrapped_flash_attn_varlen_backward = torch.ops.flashattn._flash_attn_varlen_backward


def _forward(q, k, v, dropout_p, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
             return_softmax, varlen=None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    if return_softmax and not dropout_p > 0:
        raise ValueError(f"flashattn: return_softmax=True needs dropout_p > 0 (as in flash-attn), got dropout_p="
                         f"{dropout_p}")
    dropout = dropout_p > 0
    rng_state = _new_rng_state(q.device) if dropout else torch.zeros(2, dtype=torch.int64, device=q.device)
    options = {"window_size": _window_sides((window_left, window_right)), "softcap": softcap,
               "alibi_slopes": alibi_slopes, "dropout_p": dropout_p, "rng_state": rng_state if dropout else None,
               **(varlen or {})}  # fmt: skip
    out, softmax_lse = interface._flash_attn_forward(q, k, v, softmax_scale, causal, **options)
    s_dmask = _attn_probs(q, k, softmax_scale, causal, **options) if return_softmax else q.new_empty((0,))
    # A custom operator's outputs may not alias each other or its inputs: out may be a slice of a padded copy.
    return out.contiguous(), softmax_lse, s_dmask, rng_state


def _backward(dout, q, k, v, out, softmax_lse, dropout_p, softmax_scale, causal, deterministic, window_left,
              window_right, softcap, alibi_slopes, rng_state, *varlen) -> tuple[Tensor, Tensor, Tensor]:
    """flashattn::bwd, with the head dims padded on CUDA as interface._flash_attn_forward pads them
    (interface._kernel_padding); dq, dk and dv sliced back to the shapes of q, k and v."""
    left, right = _window_sides((window_left, window_right))
    if alibi_slopes is not None:
        alibi_slopes = alibi_slopes.contiguous()
    options = (softcap, alibi_slopes, dropout_p, rng_state if dropout_p > 0 else None, *varlen)

    padding = _kernel_padding(q, (k, v))
    widths = (q.shape[-1], k.shape[-1], v.shape[-1])
    q, k = _pad(q, padding.qk), _pad(k, padding.qk)
    dout, v, out = (_pad(t, padding.v) for t in (dout, v, out))
    grads = torch.ops.flashattn.bwd(dout, q, k, v, out, softmax_lse, softmax_scale, causal, deterministic, left,
                                    right, *options)[:3]  # no sink: the fourth is an empty dsink
    return tuple(grad[..., :width] for grad, width in zip(grads, widths))


def _write_grads(destinations: tuple[Tensor | None, ...], grads: tuple[Tensor, ...]) -> None:
    for destination, grad in zip(destinations, grads):
        if destination is not None:
            destination.copy_(grad)


def _softmax_d(dout: Tensor, out: Tensor, dropout_p: float, cu_seqlens_q: Tensor | None = None) -> Tensor:
    """flash-attn's softmax_d: rowsum(dout * out), scaled by the keep probability, in its layout."""
    rowsum = (dout.float() * out.float()).sum(-1) * (1 - dropout_p)  # [B, Sq, H] or [total_q, H]
    if cu_seqlens_q is None:
        batch, seqlen_q, num_heads = rowsum.shape
        softmax_d = rowsum.new_zeros((batch, num_heads, _round_up(seqlen_q, _S_DMASK_ROUND)))
        softmax_d[:, :, :seqlen_q] = rowsum.transpose(1, 2)
        return softmax_d
    total_q, num_heads = rowsum.shape
    batch = cu_seqlens_q.shape[0] - 1
    rows = torch.arange(total_q, device=out.device)
    sequence = torch.searchsorted(cu_seqlens_q[1:].long(), rows, right=True)  # on the device: no sync
    softmax_d = rowsum.new_zeros((num_heads, total_q + _S_DMASK_ROUND * batch))
    softmax_d[:, rows + _S_DMASK_ROUND * sequence] = rowsum.masked_fill((sequence >= batch)[:, None], 0).T
    return softmax_d


@_flash_attn_forward.register_fake
def _(q, k, v, dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap, alibi_slopes,
      return_softmax):
    batch, seqlen_q, num_heads, _ = q.shape
    softmax_lse = q.new_empty((batch, num_heads, seqlen_q), dtype=torch.float32)
    s_dmask = _fake_s_dmask(q, return_softmax, batch, seqlen_q, k.shape[1])
    return q.new_empty(out_shape(q, v)), softmax_lse, s_dmask, q.new_empty((2,), dtype=torch.int64)


@_flash_attn_varlen_forward.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
      window_size_left=-1, window_size_right=-1, softcap=0.0, alibi_slopes=None, return_softmax=False,
      block_table=None, leftpad_k=None, seqused_k=None, zero_tensors=False):
    total_q, num_heads, _ = q.shape
    softmax_lse = q.new_empty((num_heads, total_q), dtype=torch.float32)
    s_dmask = _fake_s_dmask(q, return_softmax, cu_seqlens_q.shape[0] - 1, max_seqlen_q, max_seqlen_k)
    return q.new_empty(out_shape(q, v)), softmax_lse, s_dmask, q.new_empty((2,), dtype=torch.int64)


def _fake_s_dmask(q: Tensor, return_softmax: bool, batch: int, seqlen_q: int, seqlen_k: int) -> Tensor:
    if not return_softmax:
        return q.new_empty((0,))
    return q.new_empty((batch, q.shape[-2], _round_up(seqlen_q, _S_DMASK_ROUND), _round_up(seqlen_k, _S_DMASK_ROUND)))


@_flash_attn_backward.register_fake
def _(dout, q, k, v, out, softmax_lse, dq, dk, dv, *options):
    batch, seqlen_q, num_heads, _ = q.shape
    return q.new_empty((batch, num_heads, _round_up(seqlen_q, _S_DMASK_ROUND)), dtype=torch.float32)


@_flash_attn_varlen_backward.register_fake
def _(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, *options):
    total_q, num_heads, _ = q.shape
    batch = cu_seqlens_q.shape[0] - 1
    return q.new_empty((num_heads, total_q + _S_DMASK_ROUND * batch), dtype=torch.float32)
