"""The flashattn operators: schemas, fake (meta) implementations, CPU implementations, autograd.

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

The CUDA implementation is registered by the compiled extension, which also
defines the schema; without it the schema is defined here, so the operator and
everything built on it work on CPU tensors. The fake implementations and the
autograd formula are registered here for both. Inputs are checked by
flashattn.interface before they reach an implementation.
"""

import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from ._extension import HAS_CUDA_KERNELS
from .philox import dropout_keep_mask

__all__ = ["BWD_SCHEMA", "FWD_SCHEMA"]

# The single Python copies of the schemas; csrc/flash_api.cpp holds the C++ ones
# and tests/test_ops.py checks that they agree.
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

# Tile sizes of the CPU implementation: at most one [BLOCK_M, BLOCK_N] block of
# scores per (batch, head) exists at a time.
BLOCK_M = 128
BLOCK_N = 128

if not HAS_CUDA_KERNELS:
    _lib = torch.library.Library("flashattn", "DEF")
    _lib.define(FWD_SCHEMA)
    _lib.define(BWD_SCHEMA)


@dataclass(frozen=True)
class _Options:
    """What turns q . k of one group of sequences into the scores the softmax sees, and the dropout."""

    softmax_scale: float
    left: int  # window_left; -1: unbounded
    right: int  # 0 if causal else window_right; -1: unbounded
    softcap: float  # 0: none
    alibi_slopes: Tensor | None  # fp32 [B or 1, H] of the sequences at hand
    dropout_p: float
    rng_state: Tensor | None  # int64 [2], when dropout_p > 0
    batch_start: int = 0  # the index b of the first sequence at hand (dropout's counter)

    @staticmethod
    def of(
        softmax_scale: float,
        causal: bool,
        window_left: int,
        window_right: int,
        softcap: float,
        alibi_slopes: Tensor | None,
        dropout_p: float,
        rng_state: Tensor | None,
    ) -> "_Options":
        """The options of the operator's arguments (dropout_p > 0 needs its rng_state)."""
        if dropout_p > 0 and rng_state is None:
            raise RuntimeError("flashattn: dropout_p > 0 needs rng_state (int64 seed and offset)")
        slopes = None if alibi_slopes is None else alibi_slopes.float().reshape(-1, alibi_slopes.shape[-1])
        return _Options(
            softmax_scale=softmax_scale,
            left=window_left,
            right=0 if causal else window_right,
            softcap=softcap,
            alibi_slopes=slopes,
            dropout_p=dropout_p,
            rng_state=rng_state if dropout_p > 0 else None,
        )

    def for_sequence(self, b: int) -> "_Options":
        """The options of sequence b of a variable-length batch, run as a batch of one."""
        slopes = self.alibi_slopes
        if slopes is not None and slopes.shape[0] > 1:
            slopes = slopes[b : b + 1]
        return replace(self, alibi_slopes=slopes, batch_start=b)


def _key_range(rows: range, seqlen_k: int, diagonal: int, opts: _Options) -> range:
    """The keys that some query row of `rows` sees (diagonal = Sk - Sq): the window's outer bounds."""
    first = max(0, rows.start + diagonal - opts.left) if opts.left >= 0 else 0
    stop = min(seqlen_k, rows.stop + diagonal + opts.right) if opts.right >= 0 else seqlen_k
    return range(first, max(first, stop))


def _row_range(keys: range, seqlen_q: int, diagonal: int, opts: _Options) -> range:
    """The query rows that see some key of `keys`: _key_range turned around."""
    first = max(0, keys.start - diagonal - opts.right) if opts.right >= 0 else 0
    stop = min(seqlen_q, keys.stop - diagonal + opts.left) if opts.left >= 0 else seqlen_q
    return range(first, max(first, stop))


def _block_visibility(rows: range, keys: range, diagonal: int, opts: _Options, device: torch.device) -> Tensor | None:
    """[bm, bn] True where query row i sees key j, or None when every row sees every key of
    the block: only the blocks the window's edges cross pay for a mask."""
    inside_left = opts.left < 0 or keys.start >= rows.stop - 1 + diagonal - opts.left
    inside_right = opts.right < 0 or keys.stop - 1 <= rows.start + diagonal + opts.right
    if inside_left and inside_right:
        return None
    offset = _diagonal_offset(rows, keys, diagonal, device)
    visible = torch.ones(offset.shape, dtype=torch.bool, device=device)
    if opts.left >= 0:
        visible &= offset >= -opts.left
    if opts.right >= 0:
        visible &= offset <= opts.right
    return visible


def _diagonal_offset(rows: range, keys: range, diagonal: int, device: torch.device) -> Tensor:
    """[bm, bn] j - (i + diagonal): key j's signed distance from query i's diagonal key."""
    row_ids = torch.arange(rows.start, rows.stop, device=device).unsqueeze(-1)
    key_ids = torch.arange(keys.start, keys.stop, device=device)
    return key_ids - (row_ids + diagonal)


def _block_scores(
    q_rows: Tensor,  # [B, Hk, G * bm, D], fp32
    k_blk: Tensor,  # [B, Hk, bn, D], fp32
    group: int,
    rows: range,
    keys: range,
    diagonal: int,
    opts: _Options,
) -> tuple[Tensor, Tensor | None]:
    """The scores [B, Hk, G, bm, bn] of a block (scaled, capped, biased, masked to -inf) and, with
    softcap, d(scores)/d(scale * q . k) = 1 - tanh^2 (the backward's chain rule), else None."""
    num_heads_k = q_rows.shape[1]
    scores = (q_rows @ k_blk.transpose(-1, -2)).unflatten(2, (group, len(rows))) * opts.softmax_scale
    softcap_grad = None
    if opts.softcap > 0:
        capped = torch.tanh(scores / opts.softcap)
        scores = opts.softcap * capped
        softcap_grad = 1 - capped * capped
    if opts.alibi_slopes is not None:
        slopes = opts.alibi_slopes.to(scores.device).reshape(-1, num_heads_k, group, 1, 1)  # [B or 1, Hk, G, 1, 1]
        distance = _diagonal_offset(rows, keys, diagonal, scores.device).abs()  # [bm, bn]
        scores = scores - slopes * distance
    visible = _block_visibility(rows, keys, diagonal, opts, scores.device)
    if visible is not None:
        scores = scores.masked_fill(~visible, -math.inf)  # [bm, bn] broadcast
    return scores, softcap_grad


def _block_keep(rows: range, keys: range, batch: int, num_heads_k: int, group: int, opts: _Options) -> Tensor:
    """Dropout's keep mask [B, Hk, G, bm, bn] of a block (flashattn.philox, the kernels' draws)."""
    keep = dropout_keep_mask(
        opts.rng_state,
        opts.dropout_p,
        rows,
        keys,
        num_heads=num_heads_k * group,
        batch=range(opts.batch_start, opts.batch_start + batch),
    )  # [B, H, bm, bn]
    return keep.unflatten(1, (num_heads_k, group))


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
    """Output shapes and dtypes without computing: what torch.compile traces with."""
    out = q.new_empty(q.shape)  # [B, Sq, H, D] or [total_q, H, D]
    if cu_seqlens_q is None:
        batch, seqlen_q, num_heads, _ = q.shape
        softmax_lse = q.new_empty((batch, num_heads, seqlen_q), dtype=torch.float32)
    else:
        total_q, num_heads, _ = q.shape
        softmax_lse = q.new_empty((num_heads, total_q), dtype=torch.float32)
    return out, softmax_lse


class _OnlineSoftmax:
    """Softmax over key blocks that arrive one at a time, for every query row of a block.

    Keeps the running row max of the scores seen so far and the running row
    sum of exp(score - max). When a block raises the max, what was summed and
    accumulated before is rescaled by exp(old_max - new_max).
    """

    def __init__(self, row_shape: tuple[int, ...]) -> None:
        self.row_max = torch.full(row_shape, -math.inf, dtype=torch.float32)
        self.row_sum = torch.zeros(row_shape, dtype=torch.float32)

    def update(self, scores: Tensor) -> tuple[Tensor, Tensor]:
        """Folds in a block of scores [..., rows, keys]. Returns the block's unnormalised
        probabilities and the factor [..., rows] by which to rescale the accumulated output."""
        new_max = torch.maximum(self.row_max, scores.amax(dim=-1))
        # A row that has seen only masked keys still has max -inf: subtracting 0
        # instead gives exp(-inf) = 0 rather than exp(-inf - -inf) = NaN.
        offset = torch.where(new_max == -math.inf, 0.0, new_max)
        probs = torch.exp(scores - offset.unsqueeze(-1))
        rescale = torch.exp(self.row_max - offset)
        self.row_sum = self.row_sum * rescale + probs.sum(dim=-1)
        self.row_max = new_max
        return probs, rescale

    def finalize(self, acc: Tensor) -> tuple[Tensor, Tensor]:
        """Normalises the accumulated output [..., rows, D] once; returns it and the row LSE.
        Rows that saw no key (sum 0) get output 0 and LSE -inf; a NaN score makes the
        sum NaN, hence the row's output and LSE NaN (never -inf: that would claim no key)."""
        empty = self.row_sum == 0
        out = acc / torch.where(empty, 1.0, self.row_sum).unsqueeze(-1)
        lse = torch.where(empty, -math.inf, self.row_max + torch.log(self.row_sum))
        return out, lse


def _attend_query_block(
    q_blk: Tensor,  # [B, Hk, G, bm, D]: the G query heads that share each KV head
    k_heads: Tensor,  # [B, Hk, Sk, D]
    v_heads: Tensor,  # [B, Hk, Sk, D]
    rows: range,
    diagonal: int,
    opts: _Options,
) -> tuple[Tensor, Tensor]:
    """Attention of one block of query rows over every key block they can see, in fp32.

    Returns out [B, Hk, G, bm, D] and lse [B, Hk, G, bm].
    """
    batch, num_heads_k, group, block_m, head_dim = q_blk.shape
    # The G heads of a group are stacked as rows of one matrix, so each K/V
    # block serves them all through a plain batched matmul, with no copy of K/V.
    q_rows = q_blk.float().flatten(2, 3)  # [B, Hk, G * bm, D]
    softmax = _OnlineSoftmax((batch, num_heads_k, group, block_m))
    acc = torch.zeros((batch, num_heads_k, group, block_m, head_dim), dtype=torch.float32)
    # Keys outside the window of every row of the block (e.g. in every row's
    # future when causal) are never visited; blocks stay on the BLOCK_N grid.
    visible_keys = _key_range(rows, k_heads.shape[2], diagonal, opts)
    for key_start in range(visible_keys.start // BLOCK_N * BLOCK_N, visible_keys.stop, BLOCK_N):
        keys = range(key_start, min(key_start + BLOCK_N, visible_keys.stop))
        k_blk = k_heads[:, :, keys.start : keys.stop].float()  # [B, Hk, bn, D]
        v_blk = v_heads[:, :, keys.start : keys.stop].float()  # [B, Hk, bn, D]
        scores, _ = _block_scores(q_rows, k_blk, group, rows, keys, diagonal, opts)  # [B, Hk, G, bm, bn]
        probs, rescale = softmax.update(scores)  # [B, Hk, G, bm, bn], [B, Hk, G, bm]
        if opts.dropout_p > 0:
            # Dropped probabilities still count in the softmax's sum (the LSE is
            # the undropped one) but not in the output.
            probs = probs.masked_fill(~_block_keep(rows, keys, batch, num_heads_k, group, opts), 0.0)
        acc = acc * rescale.unsqueeze(-1) + (probs.flatten(2, 3) @ v_blk).unflatten(2, (group, block_m))
    out, lse = softmax.finalize(acc)
    if opts.dropout_p > 0:
        out = out / (1 - opts.dropout_p)
    return out, lse


def _fwd_padded(q: Tensor, k: Tensor, v: Tensor, opts: _Options) -> tuple[Tensor, Tensor]:
    """The forward of q [B, Sq, H, D] over k, v [B, Sk, Hk, D]: out [B, Sq, H, D], lse [B, H, Sq]."""
    batch, seqlen_q, num_heads, head_dim = q.shape
    seqlen_k, num_heads_k = k.shape[1], k.shape[2]
    group = num_heads // num_heads_k  # query head h uses KV head h // group
    out = q.new_empty((batch, seqlen_q, num_heads, head_dim))  # [B, Sq, H, D]
    softmax_lse = q.new_empty((batch, num_heads, seqlen_q), dtype=torch.float32)  # [B, H, Sq]
    k_heads = k.transpose(1, 2)  # [B, Hk, Sk, D], a view
    v_heads = v.transpose(1, 2)  # [B, Hk, Sk, D], a view
    for first_row in range(0, seqlen_q, BLOCK_M):
        rows = range(first_row, min(first_row + BLOCK_M, seqlen_q))
        q_blk = q[:, rows.start : rows.stop].transpose(1, 2).unflatten(1, (num_heads_k, group))  # [B, Hk, G, bm, D]
        out_blk, lse_blk = _attend_query_block(q_blk, k_heads, v_heads, rows, seqlen_k - seqlen_q, opts)
        out[:, rows.start : rows.stop] = out_blk.flatten(1, 2).transpose(1, 2)  # cast to q's dtype on copy
        softmax_lse[:, :, rows.start : rows.stop] = lse_blk.flatten(1, 2)
    return out, softmax_lse


def _sequences(cu_seqlens_q: Tensor, cu_seqlens_k: Tensor) -> list[tuple[slice, slice]]:
    """(query rows, keys) of each sequence of a variable-length batch (host copies of the offsets)."""
    starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    return [
        (slice(starts_q[b], starts_q[b + 1]), slice(starts_k[b], starts_k[b + 1]))
        for b in range(len(starts_q) - 1)
    ]


def _is_varlen(cu_seqlens_q: Tensor | None, cu_seqlens_k: Tensor | None) -> bool:
    """Whether the call is a variable-length batch; one of the two offsets alone has no meaning."""
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        raise RuntimeError(
            "flashattn: cu_seqlens_q and cu_seqlens_k must be given together (variable-length batch) or not at all"
        )
    return cu_seqlens_q is not None


def _fwd_cpu(
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
    """FlashAttention's forward in plain PyTorch: the readable statement of the algorithm.

    Query blocks of BLOCK_M rows attend to key blocks of BLOCK_N keys with an
    online softmax, computing in fp32 whatever the input dtype (fp16, bf16,
    fp32), vectorised over batch and heads. The full [Sq, Sk] score matrix
    never exists; key blocks outside every row's window are skipped, and only
    blocks that a window edge crosses are masked. A variable-length batch runs
    each sequence as a batch of one, written into the packed outputs; rows past
    cu_seqlens_q[-1] belong to no sequence and get out 0, lse -inf.
    `deterministic` is for the backward; this forward always is.
    """
    opts = _Options.of(softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, dropout_p, rng_state)
    if not _is_varlen(cu_seqlens_q, cu_seqlens_k):
        return _fwd_padded(q, k, v, opts)
    total_q, num_heads, _ = q.shape
    out = q.new_empty(q.shape)  # [total_q, H, D]
    softmax_lse = q.new_empty((num_heads, total_q), dtype=torch.float32)  # [H, total_q]
    sequences = _sequences(cu_seqlens_q, cu_seqlens_k)
    for b, (rows, keys) in enumerate(sequences):
        out_b, lse_b = _fwd_padded(q[rows][None], k[keys][None], v[keys][None], opts.for_sequence(b))
        out[rows] = out_b[0]
        softmax_lse[:, rows] = lse_b[0]
    covered = sequences[-1][0].stop if sequences else 0
    out[covered:] = 0
    softmax_lse[:, covered:] = -math.inf
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
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _key_block_gradients(
    k_blk: Tensor,  # [B, Hk, bn, D], fp32
    v_blk: Tensor,  # [B, Hk, bn, D], fp32
    q_heads: Tensor,  # [B, Hk, G, Sq, D]: the G query heads that share each KV head
    do_heads: Tensor,  # [B, Hk, G, Sq, D]
    lse: Tensor,  # [B, Hk, G, Sq], fp32, +inf on rows that saw no key
    delta: Tensor,  # [B, Hk, G, Sq], fp32: rowsum(dO * O)
    dq_acc: Tensor,  # [B, Hk, G, Sq, D], fp32, accumulated in place
    keys: range,
    diagonal: int,
    opts: _Options,
) -> tuple[Tensor, Tensor]:
    """One block of keys walks every query block that can see it, in fp32.

    Recomputes the probabilities from the scores and the saved LSE, adds the
    block's share to dQ (unscaled) and returns its dK (unscaled) and dV
    [B, Hk, bn, D], summed over the query heads of each KV head.
    """
    batch, num_heads_k, group, seqlen_q, head_dim = q_heads.shape
    dk_blk = torch.zeros_like(k_blk)
    dv_blk = torch.zeros_like(v_blk)
    # Rows outside the window of every key of the block never visit it.
    visible_rows = _row_range(keys, seqlen_q, diagonal, opts)
    for first_row in range(visible_rows.start // BLOCK_M * BLOCK_M, visible_rows.stop, BLOCK_M):
        rows = range(first_row, min(first_row + BLOCK_M, visible_rows.stop))
        block_m = len(rows)
        # As in the forward, the G heads of a group are stacked as rows of one
        # matrix: each product with the K/V block serves them all without a copy
        # of K/V, and P^T dO and dS^T Q sum over the group as they multiply.
        q_rows = q_heads[:, :, :, rows.start : rows.stop].float().flatten(2, 3)  # [B, Hk, G * bm, D]
        do_rows = do_heads[:, :, :, rows.start : rows.stop].float().flatten(2, 3)  # [B, Hk, G * bm, D]
        scores, softcap_grad = _block_scores(q_rows, k_blk, group, rows, keys, diagonal, opts)  # [B, Hk, G, bm, bn]
        probs = torch.exp(scores - lse[:, :, :, rows.start : rows.stop].unsqueeze(-1))  # [B, Hk, G, bm, bn]
        dprobs = (do_rows @ v_blk.transpose(-1, -2)).unflatten(2, (group, block_m))  # [B, Hk, G, bm, bn]
        if opts.dropout_p > 0:
            # out = (P * keep / (1 - p)) V: V and P see the kept, rescaled probabilities.
            kept = _block_keep(rows, keys, batch, num_heads_k, group, opts) / (1 - opts.dropout_p)
            dv_blk += (probs * kept).flatten(2, 3).transpose(-1, -2) @ do_rows
            dprobs = dprobs * kept
        else:
            dv_blk += probs.flatten(2, 3).transpose(-1, -2) @ do_rows
        # The softmax's backward: dS = P * (dP - rowsum(P * dP)), and rowsum(P * dP) = rowsum(dO * O).
        dscores = probs * (dprobs - delta[:, :, :, rows.start : rows.stop].unsqueeze(-1))
        if softcap_grad is not None:
            dscores = dscores * softcap_grad
        dscores = dscores.flatten(2, 3)  # [B, Hk, G * bm, bn]
        dq_acc[:, :, :, rows.start : rows.stop] += (dscores @ k_blk).unflatten(2, (group, block_m))
        dk_blk += dscores.transpose(-1, -2) @ q_rows
    return dk_blk, dv_blk


def _bwd_padded(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, softmax_lse: Tensor, opts: _Options
) -> tuple[Tensor, Tensor, Tensor]:
    """The backward of _fwd_padded: dq [B, Sq, H, D], dk and dv [B, Sk, Hk, D]."""
    batch, seqlen_q, num_heads, head_dim = q.shape
    seqlen_k, num_heads_k = k.shape[1], k.shape[2]
    group = num_heads // num_heads_k  # query head h uses KV head h // group

    def grouped(t: Tensor) -> Tensor:
        """[B, H, ...] as [B, Hk, G, ...], a view."""
        return t.unflatten(1, (num_heads_k, group))

    # The preprocess: D = rowsum(dO * O) per query row.
    delta = grouped((dout.float() * out.float()).sum(dim=-1).transpose(1, 2))  # [B, Hk, G, Sq]
    # A row that saw no key has lse -inf, which would make exp(S - lse) = inf;
    # +inf makes its probabilities, hence all its gradients, 0.
    lse = grouped(softmax_lse.masked_fill(softmax_lse == -math.inf, math.inf))  # [B, Hk, G, Sq]
    q_heads = grouped(q.transpose(1, 2))  # [B, Hk, G, Sq, D], a view
    do_heads = grouped(dout.transpose(1, 2))  # [B, Hk, G, Sq, D], a view
    dq_acc = torch.zeros((batch, num_heads_k, group, seqlen_q, head_dim), dtype=torch.float32)
    dk = k.new_empty((batch, seqlen_k, num_heads_k, head_dim))  # [B, Sk, Hk, D]
    dv = v.new_empty((batch, seqlen_k, num_heads_k, head_dim))  # [B, Sk, Hk, D]
    for key_start in range(0, seqlen_k, BLOCK_N):
        keys = range(key_start, min(key_start + BLOCK_N, seqlen_k))
        k_blk = k[:, keys.start : keys.stop].transpose(1, 2).float()  # [B, Hk, bn, D]
        v_blk = v[:, keys.start : keys.stop].transpose(1, 2).float()  # [B, Hk, bn, D]
        dk_blk, dv_blk = _key_block_gradients(
            k_blk, v_blk, q_heads, do_heads, lse, delta, dq_acc, keys, seqlen_k - seqlen_q, opts
        )
        # S = scale * Q K^T: dQ and dK take the scale once, on the sums.
        dk[:, keys.start : keys.stop] = (dk_blk * opts.softmax_scale).transpose(1, 2)  # cast to k's dtype on copy
        dv[:, keys.start : keys.stop] = dv_blk.transpose(1, 2)
    dq = q.new_empty((batch, seqlen_q, num_heads, head_dim))  # [B, Sq, H, D]
    dq.copy_((dq_acc * opts.softmax_scale).flatten(1, 2).transpose(1, 2))
    return dq, dk, dv


def _bwd_cpu(
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
    """FlashAttention-2's backward in plain PyTorch: the readable statement of the algorithm.

    Of the forward it needs only out and the LSE: the probabilities (and the
    dropout mask) are recomputed block by block, so memory stays linear in the
    sequence length. Each block of BLOCK_N keys walks the blocks of BLOCK_M
    queries that can see it, accumulating its dK and dV, while dQ is
    accumulated over key blocks; all in fp32, converted to the input dtype
    once. The summation order is fixed, so the result is bitwise reproducible
    whatever `deterministic` says. A variable-length batch runs each sequence
    as a batch of one; rows and keys past the last sequence get zero gradients.
    """
    opts = _Options.of(softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, dropout_p, rng_state)
    if not _is_varlen(cu_seqlens_q, cu_seqlens_k):
        return _bwd_padded(dout, q, k, v, out, softmax_lse, opts)
    dq = q.new_empty(q.shape)  # [total_q, H, D]
    dk = k.new_empty(k.shape)  # [total_k, Hk, D]
    dv = v.new_empty(v.shape)  # [total_k, Hk, D]
    sequences = _sequences(cu_seqlens_q, cu_seqlens_k)
    for b, (rows, keys) in enumerate(sequences):
        grads = _bwd_padded(
            dout[rows][None],
            q[rows][None],
            k[keys][None],
            v[keys][None],
            out[rows][None],
            softmax_lse[:, rows][None],
            opts.for_sequence(b),
        )
        for grad, grad_b, part in zip((dq, dk, dv), grads, (rows, keys, keys)):
            grad[part] = grad_b[0]
    rows_covered, keys_covered = (sequences[-1][0].stop, sequences[-1][1].stop) if sequences else (0, 0)
    dq[rows_covered:] = 0
    dk[keys_covered:] = 0
    dv[keys_covered:] = 0
    return dq, dk, dv


def attention_probs(
    q: Tensor,
    k: Tensor,
    softmax_lse: Tensor,
    softmax_scale: float,
    causal: bool,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    alibi_slopes: Tensor | None = None,
    dropout_p: float = 0.0,
    rng_state: Tensor | None = None,
    batch_start: int = 0,
) -> Tensor:
    """The probabilities P = exp(score - lse) [B, H, Sq, Sk] in fp32 of padded q [B, Sq, H, D] and
    k [B, Sk, Hk, D], masked entries 0, with the sign bit set where dropout drops (FlashAttention's
    S_dmask). Materialises all of Sq x Sk: for return_attn_probs and tests, on any device."""
    opts = _Options.of(softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, dropout_p, rng_state)
    opts = replace(opts, batch_start=batch_start)
    batch, seqlen_q, num_heads, _ = q.shape
    seqlen_k, num_heads_k = k.shape[1], k.shape[2]
    group = num_heads // num_heads_k
    rows, keys = range(seqlen_q), range(seqlen_k)
    q_rows = q.transpose(1, 2).unflatten(1, (num_heads_k, group)).flatten(2, 3).float()  # [B, Hk, G * Sq, D]
    k_heads = k.transpose(1, 2).float()  # [B, Hk, Sk, D]
    scores, _ = _block_scores(q_rows, k_heads, group, rows, keys, seqlen_k - seqlen_q, opts)
    lse = softmax_lse.masked_fill(softmax_lse == -math.inf, math.inf).unflatten(1, (num_heads_k, group))
    probs = torch.exp(scores - lse.unsqueeze(-1))  # [B, Hk, G, Sq, Sk]
    if opts.dropout_p > 0:
        probs = torch.where(_block_keep(rows, keys, batch, num_heads_k, group, opts), probs, -probs)
    return probs.flatten(1, 2)


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
torch.library.impl("flashattn::fwd", "cpu", _fwd_cpu)
torch.library.register_autograd("flashattn::fwd", _fwd_backward, setup_context=_fwd_setup_context)
torch.library.register_fake("flashattn::bwd", _bwd_fake)
torch.library.impl("flashattn::bwd", "cpu", _bwd_cpu)
