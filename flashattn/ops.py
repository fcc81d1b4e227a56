"""The flashattn operators, registered: schemas, fake (meta) implementations, autograd.

``torch.ops.flashattn.fwd(q, k, v, softmax_scale, causal, deterministic=False, window_left=-1,
window_right=-1, softcap=0.0, alibi_slopes=None, dropout_p=0.0, rng_state=None, cu_seqlens_q=None,
cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0, seqused_q=None, seqused_k=None, leftpad_k=None,
block_table=None, learnable_sink=None) -> (out, softmax_lse)``
  Two layouts. Padded (cu_seqlens_q None): q [B, Sq, H, D], k [B, Sk, Hk, D],
  v [B, Sk, Hk, Dv]; out [B, Sq, H, Dv], softmax_lse [B, H, Sq].
  Variable-length (cu_seqlens_q and cu_seqlens_k, int32 [B + 1], nondecreasing
  from 0): q [total_q, H, D], k [total_k, Hk, D], v [total_k, Hk, Dv], sequence
  b holding rows cu_seqlens_q[b]:cu_seqlens_q[b + 1] and keys
  cu_seqlens_k[b]:cu_seqlens_k[b + 1]; out [total_q, H, Dv], softmax_lse
  [H, total_q]; max_seqlen_q/k bound every sequence's length (the CUDA grid is
  sized from them). H % Hk == 0, any strides; out in q's dtype and softmax_lse
  in fp32, both contiguous. 1 <= Dv <= D <= 512: v's head dim may be smaller
  than q's and k's (DeepSeek MLA's 192 / 128), on CPU and CUDA alike (the
  CUDA kernels need both to be multiples of 8: the public functions pad them).
  Variable-length batches also take, each int32 [B] or None: seqused_q (sequence
  b uses its first seqused_q[b] query rows), seqused_k and leftpad_k (its keys
  are rows leftpad_k[b] to seqused_k[b] of its cu_seqlens_k range); and
  block_table, int32 [B, max_blocks_per_seq]: k and v are then pages
  [num_blocks, page_block_size, Hk, D (Dv)], sequence b's key row r is row
  r % page_block_size of page block_table[b, r // page_block_size], its length
  seqused_k[b] or cu_seqlens_k[b + 1] - cu_seqlens_k[b] (not with leftpad_k).
  Rows that no sequence uses get out 0 and softmax_lse -inf. Values out of
  range raise ValueError on CPU; on CUDA they are clamped and recorded, raised
  at the next call (flashattn.check_faults).
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
  - learnable_sink, fp32 [H] or None (FlashAttention-4's): per head h a logit
    that joins every row's softmax denominator and has no value, as given (not
    scaled by softmax_scale, not capped, no ALiBi). P_ij = exp(s_ij - lse_i),
    lse_i = log(sum_j exp(s_ij) + exp(sink_h)) (softmax_lse includes it); a row
    that sees no key gets out 0 and lse = sink_h. A sink of -inf is none.
  - dropout_p > 0 (needs rng_state, int64 [2] on q's device: Philox seed and
    offset): out_i = sum_j P_ij * keep_ij / (1 - dropout_p) * v_j with P the
    undropped probabilities and keep the mask of flashattn.philox; the LSE is
    the undropped one.
  The op is differentiable in q, k, v and learnable_sink, through out and
  through softmax_lse (d lse_i / d s_ij = P_ij): its backward runs bwd below
  with the same arguments. `deterministic` is the backward's; the forward is
  deterministic either way.

``torch.ops.flashattn.bwd(dout, q, k, v, out, softmax_lse, softmax_scale, causal, deterministic,
<fwd's options from window_left on, without block_table>, learnable_sink=None, dlse=None)
-> (dq, dk, dv, dsink)``
  The gradients of fwd's out (and softmax_lse), given dout shaped like out
  and fwd's out and softmax_lse on the same inputs and options; any strides. dq,
  dk and dv have the shapes of q, k and v, their dtype, and are contiguous. dk
  and dv of KV head j sum over the query heads that share it (h // (H // Hk) ==
  j). A query row that saw no key (lse = -inf) gets dq = 0 and adds nothing to
  dk, dv. With dropout: dV = (P * keep / (1 - p))^T dO, dP = (dO V^T) * keep /
  (1 - p), dS = P * (dP - D) with D = rowsum(dO * O); softcap multiplies dS by
  1 - tanh^2. dlse, fp32 shaped like softmax_lse, or None: the gradient of
  softmax_lse, folded in as D - dlse for D (rows with lse -inf drop it).
  learnable_sink: fwd's; dsink (fp32 [H]) = -sum over rows of exp(sink_h -
  lse_i) * (D_i - dlse_i), an empty (0,) tensor without a sink.
  deterministic=True promises bitwise-identical results run after run (dsink
  always is).
  fwd's autograd runs it on paged k and v by gathering each sequence's pages
  into a packed batch and summing the gradients back into the pages
  (_paged_backward).

``torch.ops.flashattn.fwd_kvcache(...)`` (KVCACHE_SCHEMA)
  flashattn.kvcache.flash_attn_with_kvcache's operator: appends k and v to the
  cache in place, then attends from q over it (see that function).

``torch.ops.flashattn.fwd_kvcache_fp8(q, k_cache, v_cache, k, v, k_descale, v_descale, ...)`` (KVCACHE_FP8_SCHEMA)
  fwd_kvcache over an FP8 cache: k_cache, v_cache (and k, v to append) float8_e4m3fn standing for
  stored value x descale, k_descale and v_descale fp32 [B, Hk] or None for 1 (batch b's keys and
  values take row b's, whichever cache rows or pages hold them); q float16 or bfloat16, out in
  q's dtype; the other arguments fwd_kvcache's. The scores are softmax_scale * q . (k x
  k_descale) in fp32, out = (P V) x v_descale with P rounded to q's dtype. Appended keys with
  rotary are dequantised (x k_descale, rounded to q's dtype), rotated, and stored re-quantised
  (/ k_descale, saturated at e4m3's largest). CUDA only, on the sm80 family's decoding kernel
  (sm80/kvcache/fp8_cache.cuh: e4m3 tiles converted to 16-bit fragments in registers), every
  family: head dims multiples of 16 up to 256, at most 16 query rows per (batch, KV head) block
  (seqlen_q, or with seqlen_q 1 and GQA the query heads of a KV head); other calls raise.
  flashattn.fp8.runs_kvcache_kernel says which calls of flash_attn_with_kvcache it serves; the
  others (and CPU) run the dequantising route.

``torch.ops.flashattn.fwd_fp8(q, k, v, q_descale, k_descale, v_descale, softmax_scale, causal,
window_left=-1, window_right=-1, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0,
max_seqlen_k=0, out_dtype=None) -> (out, softmax_lse)`` (FP8_SCHEMA)
  fwd on FP8 inputs (FlashAttention-3's): q, k, v float8_e4m3fn in fwd's layouts, padded or
  variable-length (cu_seqlens_q/k, max_seqlen_q/k as fwd's), standing for stored value x descale:
  q_descale, k_descale and v_descale fp32 [B, Hk] (B: the sequences of a variable-length batch) or
  None for 1; query head h takes KV head h // (H // Hk)'s q_descale. The scores are softmax_scale *
  (q * q_descale) . (k * k_descale); the mask (causal, window_left, window_right), the LSE and the
  rows that see no key, or that no sequence uses, as fwd's. out [..., Dv] in out_dtype (bfloat16
  when None, or float16) and softmax_lse fp32 (fwd's shapes), both contiguous. Forward only: no
  autograd (the public functions refuse inputs that require grad). CPU: fwd's CPU implementation
  on the dequantised values (flashattn.fp8.dequantize: stored x descale rounded to out_dtype), what
  the public functions compute wherever the kernel does not run. CUDA: the sm90 family's FP8 kernel
  (wgmma on e4m3, P rounded to e4m3: FP8 arithmetic's error, larger than 16-bit attention's), which
  takes D and Dv multiples of 16 with Dv <= D <= 256, and raises on a device whose family has no
  FP8 kernel; flashattn.fp8.runs_kernel says which calls of the public functions it serves.

``torch.ops.flashattn.dequantize_fp8(t, scale, out_dtype) -> Tensor`` (DEQUANTIZE_SCHEMA)
  The FP8 values of the dequantising route (flashattn.fp8.times): t float8_e4m3fn (rows, seqlen,
  nheads, headdim) times scale fp32 (rows, nheads), each product rounded once to out_dtype (float16
  or bfloat16), contiguous: bit for bit (t.float() * scale[:, None, :, None]).to(out_dtype). CPU: in
  PyTorch operations; CUDA: one pass (csrc/sm80/dequantize.cu; t's last dimension contiguous).

``torch.ops.flashattn.combine(out_partial, lse_partial, out_dtype=None) -> (out, softmax_lse)``
  flashattn.flash_attn_combine's operator (FlashAttention-3's semantics): fp32
  partial results over disjoint sets of keys, out_partial [splits, B, S, H, D]
  and lse_partial [splits, B, S, H] (any strides; CUDA: out_partial's last
  stride 1), merged: out [B, S, H, D] = sum_s exp(lse_s - lse) out_s in out_dtype
  (float32 by default, float16, bfloat16), softmax_lse [B, S, H] fp32 = log sum_s
  exp(lse_s), both contiguous; a row whose every part is -inf gets out 0 and lse
  -inf. Differentiable in out_partial and lse_partial (the backward in PyTorch
  operations, _combine_backward).

The schemas are defined here and only here, for every device: the compiled
extension (csrc/api/flash_api.cpp) registers CUDA implementations of them
(TORCH_LIBRARY_IMPL), which is why flashattn._extension imports this module
before it loads flashattn._C. The CPU implementations are flashattn.cpu's
(flashattn.kvcache's for fwd_kvcache; fwd's on the dequantised values for
fwd_fp8). Each implementation checks the tensors it receives (csrc/api/checks.h
for CUDA, flashattn.cpu for CPU, with the same messages; fwd_fp8's FP8
arguments also flashattn.fp8.check); the public functions check the Python
arguments (README.md, "Where each argument is checked").
"""

import math

import torch
from torch import Tensor

from . import cpu, fp8

__all__ = ["BWD_SCHEMA", "COMBINE_SCHEMA", "FP8_SCHEMA", "FWD_SCHEMA", "KVCACHE_FP8_SCHEMA", "KVCACHE_SCHEMA", "fwd"]

FWD_SCHEMA = (
    "fwd(Tensor q, Tensor k, Tensor v, float softmax_scale, bool causal, bool deterministic=False, "
    "int window_left=-1, int window_right=-1, float softcap=0.0, Tensor? alibi_slopes=None, "
    "float dropout_p=0.0, Tensor? rng_state=None, Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, "
    "int max_seqlen_q=0, int max_seqlen_k=0, Tensor? seqused_q=None, Tensor? seqused_k=None, "
    "Tensor? leftpad_k=None, Tensor? block_table=None, Tensor? learnable_sink=None) "
    "-> (Tensor out, Tensor softmax_lse)"
)
BWD_SCHEMA = (
    "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, float softmax_scale, "
    "bool causal, bool deterministic, int window_left=-1, int window_right=-1, float softcap=0.0, "
    "Tensor? alibi_slopes=None, float dropout_p=0.0, Tensor? rng_state=None, Tensor? cu_seqlens_q=None, "
    "Tensor? cu_seqlens_k=None, int max_seqlen_q=0, int max_seqlen_k=0, Tensor? seqused_q=None, "
    "Tensor? seqused_k=None, Tensor? leftpad_k=None, Tensor? learnable_sink=None, Tensor? dlse=None) "
    "-> (Tensor dq, Tensor dk, Tensor dv, Tensor dsink)"
)
KVCACHE_SCHEMA = (
    "fwd_kvcache(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k, Tensor? v, Tensor? rotary_cos, "
    "Tensor? rotary_sin, Tensor cache_seqlens, Tensor? cache_batch_idx, Tensor? cache_leftpad, "
    "Tensor? block_table, float softmax_scale, bool causal, int window_left, int window_right, float softcap, "
    "bool rotary_interleaved, Tensor? alibi_slopes, int num_splits, Tensor? learnable_sink=None) "
    "-> (Tensor out, Tensor softmax_lse)"
)

KVCACHE_FP8_SCHEMA = (
    "fwd_kvcache_fp8(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k, Tensor? v, Tensor? k_descale, "
    "Tensor? v_descale, Tensor? rotary_cos, Tensor? rotary_sin, Tensor cache_seqlens, Tensor? cache_batch_idx, "
    "Tensor? cache_leftpad, Tensor? block_table, float softmax_scale, bool causal, int window_left, "
    "int window_right, float softcap, bool rotary_interleaved, Tensor? alibi_slopes, int num_splits, "
    "Tensor? learnable_sink=None) -> (Tensor out, Tensor softmax_lse)"
)

COMBINE_SCHEMA = (
    "combine(Tensor out_partial, Tensor lse_partial, ScalarType? out_dtype=None) -> (Tensor out, Tensor softmax_lse)"
)
FP8_SCHEMA = (
    "fwd_fp8(Tensor q, Tensor k, Tensor v, Tensor? q_descale, Tensor? k_descale, Tensor? v_descale, "
    "float softmax_scale, bool causal, int window_left=-1, int window_right=-1, Tensor? cu_seqlens_q=None, "
    "Tensor? cu_seqlens_k=None, int max_seqlen_q=0, int max_seqlen_k=0, ScalarType? out_dtype=None) "
    "-> (Tensor out, Tensor softmax_lse)"
)

DEQUANTIZE_SCHEMA = "dequantize_fp8(Tensor t, Tensor scale, ScalarType out_dtype) -> Tensor"

_lib = torch.library.Library("flashattn", "DEF")
for _schema in (FWD_SCHEMA, BWD_SCHEMA, KVCACHE_SCHEMA, KVCACHE_FP8_SCHEMA, COMBINE_SCHEMA, FP8_SCHEMA,
                DEQUANTIZE_SCHEMA):
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
    seqused_q: Tensor | None = None,
    seqused_k: Tensor | None = None,
    leftpad_k: Tensor | None = None,
    block_table: Tensor | None = None,
    learnable_sink: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Output shapes and dtypes without computing: what torch.compile traces with (and what meta
    tensors get). It checks the tensors as the implementations do, so tracing stops where eager would."""
    cpu.check_fwd(q, k, v, alibi_slopes, dropout_p, rng_state, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k,
                  leftpad_k, block_table)
    cpu.check_learnable_sink(learnable_sink, q)
    out = q.new_empty(cpu.out_shape(q, v))  # [B, Sq, H, Dv] or [total_q, H, Dv]
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
    seqused_q: Tensor | None = None,
    seqused_k: Tensor | None = None,
    leftpad_k: Tensor | None = None,
    learnable_sink: Tensor | None = None,
    dlse: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradient shapes and dtypes without computing: what torch.compile traces the backward with."""
    cpu.check_bwd(dout, q, k, v, out, softmax_lse, alibi_slopes, dropout_p, rng_state, cu_seqlens_q, cu_seqlens_k,
                  seqused_q, seqused_k, leftpad_k)
    cpu.check_learnable_sink(learnable_sink, q)
    cpu.check_dlse(dlse, softmax_lse)
    dsink = q.new_empty((0,) if learnable_sink is None else learnable_sink.shape, dtype=torch.float32)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsink


def _fwd_kvcache_fake(q: Tensor, k_cache: Tensor, v_cache: Tensor, k, v, rotary_cos, rotary_sin, cache_seqlens,
                      cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal, window_left, window_right,
                      softcap, rotary_interleaved, alibi_slopes, num_splits,
                      learnable_sink: Tensor | None = None) -> tuple[Tensor, Tensor]:
    cpu.check_learnable_sink(learnable_sink, q)
    batch, seqlen_q, num_heads, _ = q.shape
    return q.new_empty(cpu.out_shape(q, v_cache)), q.new_empty((batch, num_heads, seqlen_q), dtype=torch.float32)


def _fwd_kvcache_fp8_fake(q: Tensor, k_cache: Tensor, v_cache: Tensor, k, v, k_descale, v_descale, rotary_cos,
                          rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal,
                          window_left, window_right, softcap, rotary_interleaved, alibi_slopes, num_splits,
                          learnable_sink: Tensor | None = None) -> tuple[Tensor, Tensor]:
    return _fwd_kvcache_fake(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                             cache_leftpad, block_table, softmax_scale, causal, window_left, window_right, softcap,
                             rotary_interleaved, alibi_slopes, num_splits, learnable_sink)


def _combine_fake(out_partial: Tensor, lse_partial: Tensor,
                  out_dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
    cpu.check_combine(out_partial, lse_partial, out_dtype)
    return (out_partial.new_empty(out_partial.shape[1:], dtype=out_dtype or torch.float32),
            lse_partial.new_empty(lse_partial.shape[1:]))


def _combine_cpu(out_partial: Tensor, lse_partial: Tensor,
                 out_dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
    cpu.check_combine(out_partial, lse_partial, out_dtype)
    out, lse = cpu.combine(out_partial, lse_partial)
    # Contiguous whatever the partials' strides, as the fake (and the CUDA kernel) makes them.
    return out.to(out_dtype or torch.float32).contiguous(), lse.contiguous()


def _check_fwd_fp8(q: Tensor, k: Tensor, v: Tensor, descales: dict[str, Tensor | None],
                   cu_seqlens_q: Tensor | None, cu_seqlens_k: Tensor | None,
                   out_dtype: torch.dtype | None) -> torch.dtype:
    """fwd_fp8's tensors checked as its CPU implementation takes them: the FP8 arguments by
    flashattn.fp8.check (the public functions' checks), the shapes as fwd checks them on the
    dequantised tensors (contiguous 16-bit tensors of q's, k's and v's shapes stand in for them:
    what only the CUDA kernel needs, head dims multiples of 16 up to 256 and contiguous last
    dimensions, is csrc/api/checks.h's). Returns the out dtype."""
    sequences = None if cu_seqlens_q is None else cu_seqlens_q.numel() - 1
    out_dtype = fp8.check(q, k, v, descales, out_dtype, sequences)
    if out_dtype is None:
        raise TypeError(f"flashattn: fwd_fp8 takes float8_e4m3fn q, k and v; q is {q.dtype}")
    stand_ins = (t.new_empty(t.shape, dtype=out_dtype) for t in (q, k, v))
    cpu.check_fwd(*stand_ins, None, 0.0, None, cu_seqlens_q, cu_seqlens_k)
    return out_dtype


def _fwd_fp8_fake(q: Tensor, k: Tensor, v: Tensor, q_descale: Tensor | None, k_descale: Tensor | None,
                  v_descale: Tensor | None, softmax_scale: float, causal: bool, window_left: int = -1,
                  window_right: int = -1, cu_seqlens_q: Tensor | None = None, cu_seqlens_k: Tensor | None = None,
                  max_seqlen_q: int = 0, max_seqlen_k: int = 0,
                  out_dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
    """fwd_fp8's output shapes and dtypes without computing, after the CPU implementation's checks."""
    descales = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
    out_dtype = _check_fwd_fp8(q, k, v, descales, cu_seqlens_q, cu_seqlens_k, out_dtype)
    out = q.new_empty(cpu.out_shape(q, v), dtype=out_dtype)  # [B, Sq, H, Dv] or [total_q, H, Dv]
    if cu_seqlens_q is None:
        batch, seqlen_q, num_heads, _ = q.shape
        return out, q.new_empty((batch, num_heads, seqlen_q), dtype=torch.float32)
    total_q, num_heads, _ = q.shape
    return out, q.new_empty((num_heads, total_q), dtype=torch.float32)


def _fwd_fp8_cpu(q: Tensor, k: Tensor, v: Tensor, q_descale: Tensor | None, k_descale: Tensor | None,
                 v_descale: Tensor | None, softmax_scale: float, causal: bool, window_left: int = -1,
                 window_right: int = -1, cu_seqlens_q: Tensor | None = None, cu_seqlens_k: Tensor | None = None,
                 max_seqlen_q: int = 0, max_seqlen_k: int = 0,
                 out_dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
    """fwd on the dequantised values (flashattn.fp8.dequantize): what the public functions compute
    on FP8 inputs wherever the FP8 kernel does not run."""
    descales = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
    out_dtype = _check_fwd_fp8(q, k, v, descales, cu_seqlens_q, cu_seqlens_k, out_dtype)
    sequences = None if cu_seqlens_q is None else cu_seqlens_q.numel() - 1
    q, k, v = fp8.dequantize(q, k, v, descales, out_dtype, sequences, cu_seqlens_q, cu_seqlens_k)
    out, softmax_lse = cpu.fwd(q, k, v, softmax_scale, causal, False, window_left, window_right,
                               cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                               max_seqlen_k=max_seqlen_k)  # fmt: skip
    return out.contiguous(), softmax_lse.contiguous()


def _dequantize_fp8_fake(t: Tensor, scale: Tensor, out_dtype: torch.dtype) -> Tensor:
    fp8.check_times(t, scale, out_dtype)
    return t.new_empty(t.shape, dtype=out_dtype)


def _dequantize_fp8_cpu(t: Tensor, scale: Tensor, out_dtype: torch.dtype) -> Tensor:
    fp8.check_times(t, scale, out_dtype)
    out = t.to(out_dtype).contiguous()  # exact: every e4m3 value is a bf16 and an fp16 value
    # bf16/fp16 x fp32 is computed in fp32 and rounded once to out_dtype.
    return torch.mul(out, scale[:, None, :, None], out=out)


def _combine_setup_context(ctx, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    out_partial, lse_partial, _ = inputs
    ctx.save_for_backward(out_partial, lse_partial, output[1])
    ctx.set_materialize_grads(False)


def _combine_backward(ctx, dout: Tensor | None, dlse: Tensor | None) -> tuple:
    """combine's gradients, in PyTorch operations (memory-bound; no kernel of its own). With w_s =
    exp(lse_s - lse): d out_s = w_s dout, and d lse_s = w_s (dout . out_s - dout . out + dlse),
    dout . out = sum_s w_s dout . out_s. A part that saw no key (lse_s -inf), and every part of a
    row that none saw, has w_s = 0: zero gradients, never NaN."""
    out_partial, lse_partial, lse = ctx.saved_tensors
    seen = lse != -math.inf  # [B, S, H]
    weights = torch.exp(lse_partial - torch.where(seen, lse, 0.0)).masked_fill(~seen, 0.0)  # [splits, B, S, H]
    dot = 0.0 if dlse is None else dlse.float()
    d_out_partial = None
    if dout is not None:
        dout = dout.float()
        d_out_partial = weights.unsqueeze(-1) * dout  # [splits, B, S, H, D]
        part_dots = (out_partial * dout).sum(-1)  # dout . out_s, [splits, B, S, H]
        dot = dot + part_dots - (weights * part_dots).sum(0)
    d_lse_partial = weights * dot if dout is not None or dlse is not None else None
    return d_out_partial, d_lse_partial, None


def _fwd_setup_context(ctx, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    """Saves what the backward recomputes the probabilities from: q, k, v, out and the LSE (and
    the options' tensors, the sink), nothing of size Sq x Sk, so training memory stays linear
    in the sequence length. Gradients that do not arrive stay None (no materialised zeros): the
    backward tells "nothing reached softmax_lse" from a gradient without reading it."""
    (q, k, v, softmax_scale, causal, deterministic, window_left, window_right, softcap, alibi_slopes,
     dropout_p, rng_state, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k,
     leftpad_k, block_table, learnable_sink) = inputs  # fmt: skip
    out, softmax_lse = output
    ctx.save_for_backward(q, k, v, out, softmax_lse, alibi_slopes, rng_state, cu_seqlens_q, cu_seqlens_k,
                          seqused_q, seqused_k, leftpad_k, block_table, learnable_sink)
    ctx.options = (softmax_scale, causal, deterministic, window_left, window_right, softcap)
    ctx.dropout_p = dropout_p
    ctx.max_seqlens = (max_seqlen_q, max_seqlen_k)
    ctx.set_materialize_grads(False)


def _fwd_backward(ctx, dout: Tensor | None, dlse: Tensor | None) -> tuple:
    """fwd's gradients in q, k, v and learnable_sink: flashattn::bwd on the saved tensors with the
    forward's arguments and the gradient that reached softmax_lse, if any (through _paged_backward
    for paged k and v). None for every other input: the options, alibi_slopes, rng_state and the
    sequence tensors are not differentiated. dout comes in whatever layout the consumer of out
    produced (bwd accepts any); None when only softmax_lse was used. dlse is made contiguous here:
    the binding reads it in the LSE's layout."""
    (q, k, v, out, softmax_lse, alibi_slopes, rng_state, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k,
     leftpad_k, block_table, learnable_sink) = ctx.saved_tensors  # fmt: skip
    if dout is None:
        dout = torch.zeros_like(out)
    if dlse is not None:
        dlse = dlse.contiguous()
    options = (*ctx.options, alibi_slopes, ctx.dropout_p, rng_state)
    ext = (learnable_sink, dlse)
    if block_table is not None:
        dq, dk, dv, dsink = _paged_backward(dout, q, k, v, out, softmax_lse, options, cu_seqlens_q, cu_seqlens_k,
                                            ctx.max_seqlens[0], seqused_q, seqused_k, block_table, ext)
    else:
        dq, dk, dv, dsink = torch.ops.flashattn.bwd(
            dout, q, k, v, out, softmax_lse, *options, cu_seqlens_q, cu_seqlens_k, *ctx.max_seqlens, seqused_q,
            seqused_k, leftpad_k, *ext,
        )  # fmt: skip
    return (dq, dk, dv) + (None,) * 17 + (dsink if learnable_sink is not None else None,)


def _paged_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, softmax_lse: Tensor, options: tuple,
                    cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int, seqused_q: Tensor | None,
                    seqused_k: Tensor | None, block_table: Tensor,
                    ext: tuple[Tensor | None, Tensor | None] = (None, None),
                    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The gradients of a paged forward: each sequence's block-table row gathered into a packed batch
    (sequence b at rows b * capacity, its length in seqused_k), bwd on it, then each page's share summed
    back into a page-shaped dk and dv, in fp32 (pages shared by sequences add up; the order of those
    additions is the device's, so pages listed more than once are exempt from `deterministic`). Block-table
    entries past a sequence's length are not read; lengths and entries out of range are clamped as the
    forward's kernels clamp them (the forward has raised or recorded them). ext: bwd's
    (learnable_sink, dlse); the fourth result is bwd's dsink."""
    batch, blocks = block_table.shape
    num_pages, page_size = k.shape[0], k.shape[1]
    capacity = blocks * page_size
    lengths = seqused_k if seqused_k is not None else cu_seqlens_k[1:] - cu_seqlens_k[:-1]
    lengths = lengths.clamp(0, capacity)
    used = torch.arange(blocks, device=k.device) * page_size < lengths[:, None]  # [B, blocks]
    pages = torch.where(used, block_table, 0).clamp(0, max(num_pages - 1, 0)).long().flatten()
    k_packed, v_packed = (t[pages].flatten(0, 1) for t in (k, v))  # [B * capacity, Hk, D (Dv)]
    cu_seqlens_packed = torch.arange(batch + 1, device=k.device, dtype=torch.int32) * capacity
    # Each packed range is `capacity` rows long (the blocks past a sequence's length exit at once).
    dq, dk_packed, dv_packed, dsink = torch.ops.flashattn.bwd(
        dout, q, k_packed, v_packed, out, softmax_lse, *options, cu_seqlens_q, cu_seqlens_packed, max_seqlen_q,
        capacity, seqused_q, lengths.to(torch.int32), None, *ext,
    )  # fmt: skip
    # Rows past a sequence's length have zero gradients: the unused entries' page 0 gains nothing.
    dk, dv = (
        torch.zeros(t.shape, dtype=torch.float32, device=t.device)
        .index_add_(0, pages, g.unflatten(0, (-1, page_size)).float())
        .to(t.dtype)
        for t, g in ((k, dk_packed), (v, dv_packed))
    )
    return dq, dk, dv, dsink


torch.library.register_fake("flashattn::fwd", _fwd_fake)
torch.library.impl("flashattn::fwd", "cpu", cpu.fwd)
torch.library.register_autograd("flashattn::fwd", _fwd_backward, setup_context=_fwd_setup_context)


class _FwdAutograd(torch.autograd.Function):
    """fwd's autograd in eager mode: the same setup_context and backward as its registration above.
    On every call with a gradient, the registration's wrapper fills the operator's 21 schema
    defaults back in, ~230 us of host time per call with torch 2.11 (more than the whole kernel
    of a causal S = 2k call: benchmarks/NOTES.md, fifth session); here the operator runs with grad
    off, which its registration passes straight through."""

    @staticmethod
    def forward(ctx, *inputs):
        output = torch.ops.flashattn.fwd(*inputs)
        _fwd_setup_context(ctx, inputs, output)
        return output

    backward = staticmethod(_fwd_backward)


# fwd's schema defaults, read once: what _FwdAutograd appends to a call that leaves them out.
_FWD_DEFAULTS = tuple(argument.default_value for argument in torch.ops.flashattn.fwd.default._schema.arguments)


def fwd(*inputs) -> tuple[Tensor, Tensor]:
    """torch.ops.flashattn.fwd(*inputs) (positional arguments, the trailing ones optional) with its
    gradient: through _FwdAutograd in eager mode when q, k, v or the sink needs one, through the operator
    itself otherwise and under torch.compile (which traces the operator and its registered autograd)."""
    differentiable = (*inputs[:3], *inputs[20:21])  # q, k, v and learnable_sink
    if (torch.is_grad_enabled() and not torch.compiler.is_compiling()
            and any(t is not None and t.requires_grad for t in differentiable)):
        return _FwdAutograd.apply(*inputs, *_FWD_DEFAULTS[len(inputs):])
    return torch.ops.flashattn.fwd(*inputs)


torch.library.register_fake("flashattn::bwd", _bwd_fake)
torch.library.impl("flashattn::bwd", "cpu", cpu.bwd)
torch.library.register_fake("flashattn::fwd_kvcache", _fwd_kvcache_fake)
torch.library.register_fake("flashattn::fwd_kvcache_fp8", _fwd_kvcache_fp8_fake)
torch.library.register_fake("flashattn::combine", _combine_fake)
torch.library.impl("flashattn::combine", "cpu", _combine_cpu)
torch.library.register_fake("flashattn::fwd_fp8", _fwd_fp8_fake)
torch.library.impl("flashattn::fwd_fp8", "cpu", _fwd_fp8_cpu)
torch.library.register_fake("flashattn::dequantize_fp8", _dequantize_fp8_fake)
torch.library.impl("flashattn::dequantize_fp8", "cpu", _dequantize_fp8_cpu)
torch.library.register_autograd("flashattn::combine", _combine_backward, setup_context=_combine_setup_context)
