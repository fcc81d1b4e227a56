"""The flashattn operators, registered: schemas, fake (meta) implementations, autograd.

``torch.ops.flashattn.fwd(q, k, v, softmax_scale, causal, deterministic=False, window_left=-1,
window_right=-1, softcap=0.0, alibi_slopes=None, dropout_p=0.0, rng_state=None, cu_seqlens_q=None,
cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0) -> (out, softmax_lse)``
  Two layouts. Padded (cu_seqlens_q None): q [B, Sq, H, D], k and v
  [B, Sk, Hk, D]; out [B, Sq, H, D], softmax_lse [B, H, Sq]. Variable-length
  (cu_seqlens_q and cu_seqlens_k, int32 [B + 1], nondecreasing from 0): q
  [total_q, H, D], k and v [total_k, Hk, D], sequence b holding rows
  cu_seqlens_q[b]:cu_seqlens_q[b + 1] and keys cu_seqlens_k[b]:cu_seqlens_k[b + 1];
  out [total_q, H, D], softmax_lse [H, total_q]; max_seqlen_q/k bound every
  sequence's length (the CUDA grid is sized from them). H % Hk == 0, any
  strides; out in q's dtype and softmax_lse in fp32, both contiguous.
  Everything below holds per sequence, positions counted from its start:
  - Query i sees key j iff (left < 0 or j >= d - left) and (right < 0 or
    j <= d + right), d = i + Sk - Sq (the bottom-right diagonal), left =
    window_left, right = 0 if causal else window_right.
  - The score of a visible pair is s = softmax_scale * q_i . k_j, then
    softcap * tanh(s / softcap) if softcap > 0, then minus slope[b, h] * |d - j|
    with alibi_slopes fp32 [H] or [B, H].
  - softmax_lse is the natural-log log-sum-exp of the visible scores. A row
    that sees no key gets out = 0, lse = -inf; a row whose scores hold a NaN
    gets out = NaN, lse = NaN.
  - dropout_p > 0 (needs rng_state, int64 [2] on q's device: Philox seed and
    offset): out_i = sum_j P_ij * keep_ij / (1 - dropout_p) * v_j with P the
    undropped probabilities and keep the mask of flashattn.philox; the LSE is
    the undropped one.
  The op is differentiable in q, k and v (softmax_lse is not): its backward runs
  bwd below with the same arguments. `deterministic` is the backward's; the
  forward is deterministic either way.

``torch.ops.flashattn.bwd(dout, q, k, v, out, softmax_lse, softmax_scale, causal, deterministic,
<fwd's options from window_left on>) -> (dq, dk, dv)``
  The gradients of fwd's out, given dout shaped like q and fwd's out and
  softmax_lse on the same inputs and options; any strides. dq, dk and dv have
  the shapes of q, k and v, their dtype, and are contiguous. dk and dv of KV
  head j sum over the query heads that share it (h // (H // Hk) == j). A query
  row that saw no key (lse = -inf) gets dq = 0 and adds nothing to dk, dv.
  With dropout: dV = (P * keep / (1 - p))^T dO, dP = (dO V^T) * keep / (1 - p),
  dS = P * (dP - rowsum(dO * O)); softcap multiplies dS by 1 - tanh^2.
  deterministic=True promises bitwise-identical results run after run.

``torch.ops.flashattn.fwd_kvcache(...)`` (KVCACHE_SCHEMA)
  flashattn.kvcache.flash_attn_with_kvcache's operator: appends k and v to the
  cache in place, then attends from q over it (see that function).

The schemas are defined here and only here, for every device: the compiled
extension (csrc/api/flash_api.cpp) registers CUDA implementations of them
(TORCH_LIBRARY_IMPL), which is why flashattn._extension imports this module
before it loads flashattn._C. The CPU implementations are flashattn.cpu's
(flashattn.kvcache's for fwd_kvcache). Each implementation checks the tensors
it receives (csrc/api/checks.h for CUDA, flashattn.cpu for CPU, with the same
messages); the public functions check the Python arguments (README.md, "Where
each argument is checked").
"""

import torch
from torch import Tensor

from . import cpu

__all__ = ["BWD_SCHEMA", "FWD_SCHEMA", "KVCACHE_SCHEMA"]

FWD_SCHEMA = (
    "fwd(Tensor q, Tensor k, Tensor v, float softmax_scale, bool causal, bool deterministic=False, "
    "int window_left=-1, int window_right=-1, float softcap=0.0, Tensor? alibi_slopes=None, "
    "float dropout_p=0.0, Tensor? rng_state=None, Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, "
    "int max_seqlen_q=0, int max_seqlen_k=0) -> (Tensor out, Tensor softmax_lse)"
)
BWD_SCHEMA = (
    "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, float softmax_scale, "
    "bool causal, bool deterministic, int window_left=-1, int window_right=-1, float softcap=0.0, "
    "Tensor? alibi_slopes=None, float dropout_p=0.0, Tensor? rng_state=None, Tensor? cu_seqlens_q=None, "
    "Tensor? cu_seqlens_k=None, int max_seqlen_q=0, int max_seqlen_k=0) -> (Tensor dq, Tensor dk, Tensor dv)"
)
KVCACHE_SCHEMA = (
    "fwd_kvcache(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k, Tensor? v, Tensor? rotary_cos, "
    "Tensor? rotary_sin, Tensor cache_seqlens, Tensor? cache_batch_idx, Tensor? cache_leftpad, "
    "Tensor? block_table, float softmax_scale, bool causal, int window_left, int window_right, float softcap, "
    "bool rotary_interleaved, Tensor? alibi_slopes, int num_splits) -> (Tensor out, Tensor softmax_lse)"
)

_lib = torch.library.Library("flashattn", "DEF")
for _schema in (FWD_SCHEMA, BWD_SCHEMA, KVCACHE_SCHEMA):
    _lib.define(_schema)


def _fwd_fake(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    softmax_scale: float,
    causal: bool,
    deterministic: bool = False,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    dropout_p: float = 0.0,
    rng_state: Tensor | None = None,
    cu_seqlens_q: Tensor | None = None,
    cu_seqlens_k: Tensor | None = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
) -> tuple[Tensor, Tensor]:
    """Output shapes and dtypes without computing: what torch.compile traces with (and what meta
    tensors get). It checks the tensors as the implementations do, so tracing stops where eager would."""
    cpu.check_fwd(q, k, v, alibi_slopes, dropout_p, rng_state, cu_seqlens_q, cu_seqlens_k)
    out = q.new_empty(q.shape)  # [B, Sq, H, D] or [total_q, H, D]
    if cu_seqlens_q is None:
        batch, seqlen_q, num_heads, _ = q.shape
        softmax_lse = q.new_empty((batch, num_heads, seqlen_q), dtype=torch.float32)
    else:
        total_q, num_heads, _ = q.shape
        softmax_lse = q.new_empty((num_heads, total_q), dtype=torch.float32)
    return out, softmax_lse


def _bwd_fake(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    softmax_lse: Tensor,
    softmax_scale: float,
    causal: bool,
    deterministic: bool,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    dropout_p: float = 0.0,
    rng_state: Tensor | None = None,
    cu_seqlens_q: Tensor | None = None,
    cu_seqlens_k: Tensor | None = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradient shapes and dtypes without computing: what torch.compile traces the backward with."""
    cpu.check_bwd(dout, q, k, v, out, softmax_lse, alibi_slopes, dropout_p, rng_state, cu_seqlens_q, cu_seqlens_k)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _fwd_kvcache_fake(q: Tensor, k_cache: Tensor, v_cache: Tensor, *args) -> tuple[Tensor, Tensor]:
    batch, seqlen_q, num_heads, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((batch, num_heads, seqlen_q), dtype=torch.float32)


def _fwd_setup_context(ctx, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    """Saves what the backward recomputes the probabilities from: q, k, v, out and the LSE (and
    the options' tensors), nothing of size Sq x Sk, so training memory stays linear in the
    sequence length."""
    (q, k, v, softmax_scale, causal, deterministic, window_left, window_right, softcap, alibi_slopes,
     dropout_p, rng_state, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) = inputs  # fmt: skip
    out, softmax_lse = output
    ctx.save_for_backward(q, k, v, out, softmax_lse, alibi_slopes, rng_state, cu_seqlens_q, cu_seqlens_k)
    ctx.options = (softmax_scale, causal, deterministic, window_left, window_right, softcap)
    ctx.dropout_p = dropout_p
    ctx.max_seqlens = (max_seqlen_q, max_seqlen_k)
    ctx.mark_non_differentiable(softmax_lse)


def _fwd_backward(ctx, dout: Tensor, _dlse: Tensor) -> tuple:
    """fwd's gradients in q, k and v: flashattn::bwd on the saved tensors with the forward's
    arguments. None for the LSE (not differentiable) and for every other input: the options,
    alibi_slopes, rng_state and cu_seqlens are not differentiated. dout comes in whatever
    layout the consumer of out produced; bwd accepts any."""
    q, k, v, out, softmax_lse, alibi_slopes, rng_state, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
    dq, dk, dv = torch.ops.flashattn.bwd(
        dout, q, k, v, out, softmax_lse, *ctx.options, alibi_slopes, ctx.dropout_p, rng_state,
        cu_seqlens_q, cu_seqlens_k, *ctx.max_seqlens,
    )  # fmt: skip
    return (dq, dk, dv) + (None,) * 13


torch.library.register_fake("flashattn::fwd", _fwd_fake)
torch.library.impl("flashattn::fwd", "cpu", cpu.fwd)
torch.library.register_autograd("flashattn::fwd", _fwd_backward, setup_context=_fwd_setup_context)
torch.library.register_fake("flashattn::bwd", _bwd_fake)
torch.library.impl("flashattn::bwd", "cpu", cpu.bwd)
torch.library.register_fake("flashattn::fwd_kvcache", _fwd_kvcache_fake)
