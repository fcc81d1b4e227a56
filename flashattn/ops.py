"""The flashattn operators: schemas, fake (meta) implementations, CPU implementations, autograd.

``torch.ops.flashattn.fwd(q, k, v, softmax_scale, causal, deterministic=False) -> (out, softmax_lse)``
  q [B, Sq, H, D], k and v [B, Sk, Hk, D] with H % Hk == 0, any strides;
  out [B, Sq, H, D] in q's dtype and softmax_lse [B, H, Sq] in fp32, both
  contiguous. softmax_lse is the natural-log log-sum-exp of the scaled scores.
  Causal masking is aligned to the bottom-right corner: query i sees key j iff
  j <= i + Sk - Sq. A query row that sees no key gets out = 0, lse = -inf; a
  row whose scores hold a NaN gets out = NaN, lse = NaN. The op is
  differentiable in q, k and v (softmax_lse is not): its backward runs bwd
  below with the same scale, mask and `deterministic`, which the forward
  itself does not use.

``torch.ops.flashattn.bwd(dout, q, k, v, out, softmax_lse, softmax_scale, causal, deterministic) -> (dq, dk, dv)``
  The gradients of fwd's out, given dout [B, Sq, H, D] and fwd's out and
  softmax_lse on the same q, k, v, scale and mask; any strides. dq, dk and dv
  have the shapes of q, k and v, their dtype, and are contiguous. dk and dv of
  KV head j sum over the query heads that share it (h // (H // Hk) == j). A
  query row that saw no key (lse = -inf) gets dq = 0 and adds nothing to dk,
  dv. deterministic=True promises bitwise-identical results run after run.

The CUDA implementation is registered by the compiled extension, which also
defines the schema; without it the schema is defined here, so the operator and
everything built on it work on CPU tensors. The fake implementations and the
autograd formula are registered here for both. Inputs are checked by
flashattn.interface before they reach an implementation.
"""

import math

import torch
from torch import Tensor

from ._extension import HAS_CUDA_KERNELS

__all__ = ["BWD_SCHEMA", "FWD_SCHEMA"]

# The single Python copies of the schemas; csrc/flash_api.cpp holds the C++ ones
# and tests/test_ops.py checks that they agree.
FWD_SCHEMA = (
    "fwd(Tensor q, Tensor k, Tensor v, float softmax_scale, bool causal, bool deterministic=False) "
    "-> (Tensor out, Tensor softmax_lse)"
)
BWD_SCHEMA = (
    "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, float softmax_scale, "
    "bool causal, bool deterministic) -> (Tensor dq, Tensor dk, Tensor dv)"
)

# Tile sizes of the CPU implementation: at most one [BLOCK_M, BLOCK_N] block of
# scores per (batch, head) exists at a time.
BLOCK_M = 128
BLOCK_N = 128

if not HAS_CUDA_KERNELS:
    _lib = torch.library.Library("flashattn", "DEF")
    _lib.define(FWD_SCHEMA)
    _lib.define(BWD_SCHEMA)


def _fwd_fake(
    q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, causal: bool, deterministic: bool = False
) -> tuple[Tensor, Tensor]:
    """Output shapes and dtypes without computing: what torch.compile traces with."""
    batch, seqlen_q, num_heads, head_dim = q.shape
    out = q.new_empty((batch, seqlen_q, num_heads, head_dim))
    softmax_lse = q.new_empty((batch, num_heads, seqlen_q), dtype=torch.float32)
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
    first_row: int,
    diagonal: int,
    softmax_scale: float,
    causal: bool,
) -> tuple[Tensor, Tensor]:
    """Attention of one block of query rows over every key block they can see, in fp32.

    Query row i sees key j iff j <= i + diagonal when causal. Returns out
    [B, Hk, G, bm, D] and lse [B, Hk, G, bm].
    """
    batch, num_heads_k, group, block_m, head_dim = q_blk.shape
    # The G heads of a group are stacked as rows of one matrix, so each K/V
    # block serves them all through a plain batched matmul, with no copy of K/V.
    q_rows = q_blk.float().flatten(2, 3)  # [B, Hk, G * bm, D]
    softmax = _OnlineSoftmax((batch, num_heads_k, group, block_m))
    acc = torch.zeros((batch, num_heads_k, group, block_m, head_dim), dtype=torch.float32)
    seqlen_k = k_heads.shape[2]
    # Keys past the last row's diagonal are in every row's future: never visited.
    key_end = min(seqlen_k, max(0, first_row + block_m + diagonal)) if causal else seqlen_k
    for key_start in range(0, key_end, BLOCK_N):
        key_stop = min(key_start + BLOCK_N, key_end)
        k_blk = k_heads[:, :, key_start:key_stop].float()  # [B, Hk, bn, D]
        v_blk = v_heads[:, :, key_start:key_stop].float()  # [B, Hk, bn, D]
        scores = (q_rows @ k_blk.transpose(-1, -2)).unflatten(2, (group, block_m)) * softmax_scale
        # Only blocks that cross the diagonal pay for the mask: a block whose last
        # key is visible to the block's first row is visible to every row.
        if causal and key_stop - 1 > first_row + diagonal:
            rows = torch.arange(first_row, first_row + block_m).unsqueeze(-1)
            keys = torch.arange(key_start, key_stop)
            scores = scores.masked_fill(keys > rows + diagonal, -math.inf)  # [bm, bn] broadcast
        probs, rescale = softmax.update(scores)  # [B, Hk, G, bm, bn], [B, Hk, G, bm]
        acc = acc * rescale.unsqueeze(-1) + (probs.flatten(2, 3) @ v_blk).unflatten(2, (group, block_m))
    return softmax.finalize(acc)


def _fwd_cpu(
    q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, causal: bool, deterministic: bool = False
) -> tuple[Tensor, Tensor]:
    """FlashAttention's forward in plain PyTorch: the readable statement of the algorithm.

    Query blocks of BLOCK_M rows attend to key blocks of BLOCK_N keys with an
    online softmax, computing in fp32 whatever the input dtype (fp16, bf16,
    fp32), vectorised over batch and heads. The full [Sq, Sk] score matrix
    never exists. `deterministic` is for the backward; this forward always is.
    """
    batch, seqlen_q, num_heads, head_dim = q.shape
    seqlen_k, num_heads_k = k.shape[1], k.shape[2]
    group = num_heads // num_heads_k  # query head h uses KV head h // group
    out = q.new_empty((batch, seqlen_q, num_heads, head_dim))  # [B, Sq, H, D]
    softmax_lse = q.new_empty((batch, num_heads, seqlen_q), dtype=torch.float32)  # [B, H, Sq]
    k_heads = k.transpose(1, 2)  # [B, Hk, Sk, D], a view
    v_heads = v.transpose(1, 2)  # [B, Hk, Sk, D], a view
    for first_row in range(0, seqlen_q, BLOCK_M):
        rows = slice(first_row, min(first_row + BLOCK_M, seqlen_q))
        q_blk = q[:, rows].transpose(1, 2).unflatten(1, (num_heads_k, group))  # [B, Hk, G, bm, D]
        out_blk, lse_blk = _attend_query_block(
            q_blk, k_heads, v_heads, first_row, seqlen_k - seqlen_q, softmax_scale, causal
        )
        out[:, rows] = out_blk.flatten(1, 2).transpose(1, 2)  # cast to q's dtype on copy
        softmax_lse[:, :, rows] = lse_blk.flatten(1, 2)
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
    key_start: int,
    diagonal: int,
    softmax_scale: float,
    causal: bool,
) -> tuple[Tensor, Tensor]:
    """One block of keys walks every query block that can see it, in fp32.

    Recomputes the probabilities from the scores and the saved LSE, adds the
    block's share to dQ (unscaled) and returns its dK (unscaled) and dV
    [B, Hk, bn, D], summed over the query heads of each KV head. Query row i
    sees key j iff j <= i + diagonal when causal.
    """
    batch, num_heads_k, group, seqlen_q, head_dim = q_heads.shape
    key_stop = key_start + k_blk.shape[2]
    dk_blk = torch.zeros_like(k_blk)
    dv_blk = torch.zeros_like(v_blk)
    # Rows before the first one that sees key_start see nothing of this block: never visited.
    first_visible = max(0, key_start - diagonal) if causal else 0
    for first_row in range(first_visible // BLOCK_M * BLOCK_M, seqlen_q, BLOCK_M):
        rows = slice(first_row, min(first_row + BLOCK_M, seqlen_q))
        block_m = rows.stop - first_row
        # As in the forward, the G heads of a group are stacked as rows of one
        # matrix: each product with the K/V block serves them all without a copy
        # of K/V, and P^T dO and dS^T Q sum over the group as they multiply.
        q_rows = q_heads[:, :, :, rows].float().flatten(2, 3)  # [B, Hk, G * bm, D]
        do_rows = do_heads[:, :, :, rows].float().flatten(2, 3)  # [B, Hk, G * bm, D]
        scores = (q_rows @ k_blk.transpose(-1, -2)).unflatten(2, (group, block_m)) * softmax_scale
        # Only blocks that cross the diagonal pay for the mask (see _attend_query_block).
        if causal and key_stop - 1 > first_row + diagonal:
            row_ids = torch.arange(first_row, rows.stop).unsqueeze(-1)
            key_ids = torch.arange(key_start, key_stop)
            scores = scores.masked_fill(key_ids > row_ids + diagonal, -math.inf)  # [bm, bn] broadcast
        probs = torch.exp(scores - lse[:, :, :, rows].unsqueeze(-1)).flatten(2, 3)  # [B, Hk, G * bm, bn]
        dv_blk += probs.transpose(-1, -2) @ do_rows
        dprobs = do_rows @ v_blk.transpose(-1, -2)  # [B, Hk, G * bm, bn]
        # The softmax's backward: dS = P * (dP - rowsum(P * dP)), and rowsum(P * dP) = rowsum(dO * O).
        dscores = probs * (dprobs - delta[:, :, :, rows].flatten(2, 3).unsqueeze(-1))
        dq_acc[:, :, :, rows] += (dscores @ k_blk).unflatten(2, (group, block_m))
        dk_blk += dscores.transpose(-1, -2) @ q_rows
    return dk_blk, dv_blk


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
) -> tuple[Tensor, Tensor, Tensor]:
    """FlashAttention-2's backward in plain PyTorch: the readable statement of the algorithm.

    Of the forward it needs only out and the LSE: the probabilities are
    recomputed block by block, so memory stays linear in the sequence length.
    Each block of BLOCK_N keys walks the blocks of BLOCK_M queries that can see
    it, accumulating its dK and dV, while dQ is accumulated over key blocks;
    all in fp32, converted to the input dtype once. The summation order is
    fixed, so the result is bitwise reproducible whatever `deterministic` says.
    """
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
        keys = slice(key_start, min(key_start + BLOCK_N, seqlen_k))
        k_blk = k[:, keys].transpose(1, 2).float()  # [B, Hk, bn, D]
        v_blk = v[:, keys].transpose(1, 2).float()  # [B, Hk, bn, D]
        dk_blk, dv_blk = _key_block_gradients(
            k_blk, v_blk, q_heads, do_heads, lse, delta, dq_acc, key_start, seqlen_k - seqlen_q, softmax_scale, causal
        )
        # S = scale * Q K^T: dQ and dK take the scale once, on the sums.
        dk[:, keys] = (dk_blk * softmax_scale).transpose(1, 2)  # cast to k's dtype on copy
        dv[:, keys] = dv_blk.transpose(1, 2)
    dq = q.new_empty((batch, seqlen_q, num_heads, head_dim))  # [B, Sq, H, D]
    dq.copy_((dq_acc * softmax_scale).flatten(1, 2).transpose(1, 2))
    return dq, dk, dv


def _fwd_setup_context(ctx, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    """Saves what the backward recomputes the probabilities from: q, k, v, out and the LSE,
    nothing of size Sq x Sk, so training memory stays linear in the sequence length."""
    q, k, v, softmax_scale, causal, deterministic = inputs
    out, softmax_lse = output
    ctx.save_for_backward(q, k, v, out, softmax_lse)
    ctx.softmax_scale = softmax_scale
    ctx.causal = causal
    ctx.deterministic = deterministic
    ctx.mark_non_differentiable(softmax_lse)


def _fwd_backward(ctx, dout: Tensor, _dlse: Tensor) -> tuple[Tensor, Tensor, Tensor, None, None, None]:
    """fwd's gradients in q, k and v: flashattn::bwd on the saved tensors (none for the LSE,
    which is not differentiable, nor for the non-tensor arguments). dout comes in whatever
    layout the consumer of out produced; bwd accepts any."""
    q, k, v, out, softmax_lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.flashattn.bwd(
        dout, q, k, v, out, softmax_lse, ctx.softmax_scale, ctx.causal, ctx.deterministic
    )
    return dq, dk, dv, None, None, None


torch.library.register_fake("flashattn::fwd", _fwd_fake)
torch.library.impl("flashattn::fwd", "cpu", _fwd_cpu)
torch.library.register_autograd("flashattn::fwd", _fwd_backward, setup_context=_fwd_setup_context)
torch.library.register_fake("flashattn::bwd", _bwd_fake)
torch.library.impl("flashattn::bwd", "cpu", _bwd_cpu)
