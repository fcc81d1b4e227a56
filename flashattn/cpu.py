"""The CPU implementation of the flashattn operators: FlashAttention's blockwise algorithm in plain PyTorch.

``fwd`` and ``bwd`` are the readable statement of the algorithm the CUDA
kernels implement (flashattn.ops registers them for CPU tensors and states
what the operators compute). Like the C++ binding (csrc/api/checks.h) for CUDA
tensors, they first check the tensors they receive, with the binding's
messages and exception types; ``check_fwd`` and ``check_bwd`` are those
checks, which the fake implementations run too, so that meta tensors and
torch.compile's tracing stop where eager would. README.md ("Where each
argument is checked") says which layer checks what.
"""

import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from .philox import dropout_keep_mask

__all__ = ["CPU_DTYPES", "CUDA_DTYPES", "MAX_HEAD_DIM", "MAX_KVCACHE_HEAD_DIM", "attention_probs", "bwd",
           "check_bwd", "check_combine", "check_dlse", "check_fwd", "check_learnable_sink", "check_v_head_dim",
           "combine", "fwd", "out_shape", "s_dmask_block_n"]

# q's and k's head dim: up to 512 (the sm80 family's largest compiled head dim, for Gemma 4's global layers),
# but for flash_attn_with_kvcache, whose kernels end at 256 (the same limits as csrc/common/flash.h's).
MAX_HEAD_DIM = 512
MAX_KVCACHE_HEAD_DIM = 256
CUDA_DTYPES = (torch.float16, torch.bfloat16)  # the kernels' tensor-core types
CPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# ---------------------------------------------------------------------------------------------- the checks


def _shape(t: Tensor) -> str:
    return str(tuple(t.shape))


def check_same_device(name: str, t: Tensor, q: Tensor) -> None:
    if t.device != q.device:
        raise RuntimeError(f"flashattn: {name} is on {t.device} but q is on {q.device}; they must be on one device")


def check_index_tensor(name: str, t: Tensor | None, q: Tensor, shape: tuple[int, ...], matrix: bool = False) -> None:
    """An optional int32 index tensor of `shape` ((batch,)), or with `matrix` (batch, any), on q's device."""
    if t is None:
        return
    if t.dtype != torch.int32:
        raise TypeError(f"flashattn: {name} must be int32, got {t.dtype}")
    if (t.dim() != 2 or t.shape[0] != shape[0]) if matrix else tuple(t.shape) != shape:
        want = f"({shape[0]}, max_blocks_per_seq)" if matrix else str(shape)
        raise ValueError(f"flashattn: {name} must have shape {want}, got {_shape(t)}")
    check_same_device(name, t, q)


def check_dtype(name: str, t: Tensor, q: Tensor) -> None:
    """q's dtype one of its device's; any other tensor's q's."""
    if t is q:
        accepted = CUDA_DTYPES if q.device.type == "cuda" else CPU_DTYPES
        if q.dtype not in accepted:
            raise TypeError(
                f"flashattn: q has dtype {q.dtype}; accepted on {q.device.type}: " + ", ".join(map(str, accepted))
            )
    elif t.dtype != q.dtype:
        raise TypeError(f"flashattn: {name} has dtype {t.dtype} but q has {q.dtype}; {name} must be a {q.dtype} tensor")


def check_tensor(name: str, t: Tensor, q: Tensor, rank: int, layout: str) -> None:
    """Rank, device and dtype: what every data tensor must have."""
    if t.dim() != rank:
        raise ValueError(f"flashattn: {name} must be {rank}-D {layout}, got shape {_shape(t)}")
    check_same_device(name, t, q)
    check_dtype(name, t, q)


def check_last_dim_contiguous(name: str, t: Tensor) -> None:
    if t.stride(-1) != 1:
        raise ValueError(
            f"flashattn: the last dimension of {name} must be contiguous (stride 1), got strides {t.stride()}; "
            "call .contiguous() on it first"
        )


def _check_cu_seqlens(q: Tensor, cu_seqlens_q: Tensor | None, cu_seqlens_k: Tensor | None) -> bool:
    """Whether the call is a variable-length batch; its offsets int32 (batch + 1,) on q's device."""
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        raise RuntimeError(
            "flashattn: cu_seqlens_q and cu_seqlens_k must be given together (variable-length batch) or not at all"
        )
    if cu_seqlens_q is None:
        return False
    accepted = "an int32 tensor of shape (batch + 1,): the offsets of the sequences"
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if cu.dtype != torch.int32:
            raise TypeError(f"flashattn: {name} must be {accepted}, got dtype {cu.dtype}")
        if cu.dim() != 1 or cu.shape[0] == 0:
            raise ValueError(f"flashattn: {name} must be {accepted}, got shape {_shape(cu)}")
        check_same_device(name, cu, q)
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(
            f"flashattn: cu_seqlens_q {_shape(cu_seqlens_q)} and cu_seqlens_k {_shape(cu_seqlens_k)} "
            "must have the same length (batch + 1)"
        )
    return True


def _sdpa_layout_hint(q: Tensor, k: Tensor, varlen: bool) -> str:
    """When the heads disagree but would agree read as SDPA's (batch, nheads, seqlen, headdim),
    the likely mistake, said (the same words as csrc/api/checks.h)."""
    if varlen or k.shape[1] == 0 or q.shape[1] % k.shape[1] != 0:
        return ""
    return (
        f"; q looks like SDPA's (batch, nheads, seqlen, headdim) layout (q.shape[1] = {q.shape[1]} heads, "
        f"k.shape[1] = {k.shape[1]}): flashattn takes (batch, seqlen, nheads, headdim), e.g. q.transpose(1, 2)"
    )


def check_v_head_dim(q: Tensor, k: Tensor, v: Tensor, names: tuple[str, str, str] = ("q", "k", "v")) -> None:
    """v's head dim dv from 1 to q's and k's d: v may be narrower than q and k (DeepSeek MLA's 192 / 128),
    never wider. names: how the three tensors are called in the message (the KV cache's too)."""
    head_dim, v_head_dim = q.shape[-1], v.shape[-1]
    if not 1 <= v_head_dim <= head_dim:
        shapes = ", ".join(f"{name} {_shape(t)}" for name, t in zip(names, (q, k, v)))
        raise ValueError(
            f"flashattn: {names[2]} has headdim {v_head_dim} ({shapes}); accepted: 1 to {head_dim}, the headdim "
            f"of {names[0]} and {names[1]} ({names[2]}'s may be smaller, not larger)"
        )


def out_shape(q: Tensor, v: Tensor) -> tuple[int, ...]:
    """The shape of out (and dout): q's, with v's head dim."""
    return (*q.shape[:-1], v.shape[-1])


def _check_qkv(q: Tensor, k: Tensor, v: Tensor, varlen: bool, paged: bool = False) -> None:
    rank = 3 if varlen else 4
    kv_rank = 4 if paged else rank
    q_layout = "(total_q, nheads, headdim)" if varlen else "(batch, seqlen_q, nheads, headdim)"
    kv_layout = "(total_k, nheads_k, headdim)" if varlen else "(batch, seqlen_k, nheads_k, headdim)"
    if paged:
        kv_layout = "(num_blocks, page_block_size, nheads_k, headdim)"
    for name, t, layout, t_rank in (("q", q, q_layout, rank), ("k", k, kv_layout, kv_rank), ("v", v, kv_layout, kv_rank)):
        check_tensor(name, t, q, t_rank, layout)
    shapes = f"q {_shape(q)}, k {_shape(k)}, v {_shape(v)}"
    num_heads, head_dim = q.shape[-2:]
    num_heads_k = k.shape[-2]
    if not varlen and (k.shape[0] != q.shape[0] or v.shape[0] != q.shape[0]):
        raise ValueError(f"flashattn: batch sizes differ ({shapes}); they must be equal")
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"flashattn: k and v must have the same shape {kv_layout}, got {shapes}")
    if k.shape[-1] != head_dim:
        raise ValueError(f"flashattn: head dims differ ({shapes}); q and k must share one headdim")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"flashattn: headdim {head_dim} ({shapes}) is not supported; accepted: 1 to {MAX_HEAD_DIM}")
    check_v_head_dim(q, k, v)
    if num_heads_k == 0 or num_heads % num_heads_k != 0:
        raise ValueError(
            f"flashattn: the number of query heads (q.shape[{rank - 2}] = {num_heads}) must be a multiple "
            f"of the number of key/value heads (k.shape[{kv_rank - 2}] = {num_heads_k})" + _sdpa_layout_hint(q, k, varlen)
        )
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_last_dim_contiguous(name, t)


def _check_float32_param(name: str, t: Tensor, q: Tensor, shapes: tuple, accepted: str) -> None:
    """A float32 tensor argument of one of `shapes`, on q's device; the errors say `accepted`."""
    if t.dtype != torch.float32:
        raise TypeError(f"flashattn: {name} must be {accepted}, got dtype {t.dtype}")
    if tuple(t.shape) not in shapes:
        raise ValueError(f"flashattn: {name} must be {accepted}, got shape {_shape(t)}")
    check_same_device(name, t, q)


def check_alibi_slopes(alibi_slopes: Tensor | None, q: Tensor, batch: int) -> None:
    """None, or fp32 slopes (nheads,) or (batch, nheads) on q's device."""
    if alibi_slopes is None:
        return
    num_heads = q.shape[-2]
    accepted = f"a float32 tensor of shape (nheads,) = ({num_heads},) or (batch, nheads) = ({batch}, {num_heads})"
    _check_float32_param("alibi_slopes", alibi_slopes, q, ((num_heads,), (batch, num_heads)), accepted)


def check_learnable_sink(learnable_sink: Tensor | None, q: Tensor) -> None:
    """None, or the per-head sink logits: float32 (nheads,) on q's device."""
    if learnable_sink is None:
        return
    num_heads = q.shape[-2]
    accepted = f"a float32 tensor of shape (nheads,) = ({num_heads},)"
    _check_float32_param("learnable_sink", learnable_sink, q, ((num_heads,),), accepted)


def check_dlse(dlse: Tensor | None, softmax_lse: Tensor) -> None:
    """None, or the gradient of softmax_lse: float32 of its shape, on its device."""
    if dlse is None:
        return
    if dlse.dtype != torch.float32 or dlse.shape != softmax_lse.shape or dlse.device != softmax_lse.device:
        raise RuntimeError(
            f"flashattn: dlse must be a float32 tensor of softmax_lse's shape {_shape(softmax_lse)} on "
            f"{softmax_lse.device}, got {_shape(dlse)} {dlse.dtype} on {dlse.device}"
        )


def _check_rng_state(q: Tensor, dropout_p: float, rng_state: Tensor | None) -> None:
    if dropout_p <= 0:
        return
    if rng_state is None:
        raise RuntimeError("flashattn: dropout_p > 0 needs rng_state (int64 seed and offset)")
    if rng_state.device != q.device or rng_state.dtype != torch.int64 or rng_state.numel() != 2:
        raise RuntimeError(
            f"flashattn: rng_state must be a contiguous int64 tensor of 2 elements on q's device, got "
            f"{rng_state.dtype} of shape {_shape(rng_state)} on {rng_state.device}"
        )


def _check_needs_varlen(varlen: bool, **sequence_tensors: Tensor | None) -> None:
    """seqused_q, seqused_k, leftpad_k and block_table are for variable-length batches only (checks.h:
    check_needs_varlen; before the q, k, v checks: block_table changes k's rank)."""
    for name, t in sequence_tensors.items():
        if t is not None and not varlen:
            raise ValueError(f"flashattn: {name} needs a variable-length batch (cu_seqlens_q and cu_seqlens_k)")


def _check_sequence_tensors(q: Tensor, k: Tensor, batch: int, seqused_q: Tensor | None, seqused_k: Tensor | None,
                            leftpad_k: Tensor | None, block_table: Tensor | None) -> None:
    """Their shapes and dtypes (checks.h: check_sequences); their values are _sequences' to check."""
    check_index_tensor("seqused_q", seqused_q, q, (batch,))
    check_index_tensor("seqused_k", seqused_k, q, (batch,))
    check_index_tensor("leftpad_k", leftpad_k, q, (batch,))
    check_index_tensor("block_table", block_table, q, (batch,), matrix=True)
    if block_table is not None and leftpad_k is not None:
        raise ValueError("flashattn: leftpad_k cannot be combined with block_table (a paged KV cache)")
    if block_table is not None:
        if batch > 0 and block_table.shape[1] > 0 and k.shape[0] == 0:
            raise ValueError(f"flashattn: k holds no page but block_table lists {block_table.shape[1]} per sequence")
        if block_table.shape[1] * k.shape[1] > 2**31 - 1:
            raise ValueError("flashattn: block_table's pages x page_block_size must fit in int32")


def check_fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    alibi_slopes: Tensor | None,
    dropout_p: float,
    rng_state: Tensor | None,
    cu_seqlens_q: Tensor | None,
    cu_seqlens_k: Tensor | None,
    seqused_q: Tensor | None = None,
    seqused_k: Tensor | None = None,
    leftpad_k: Tensor | None = None,
    block_table: Tensor | None = None,
) -> None:
    """The tensors of flashattn::fwd, checked as csrc/api/checks.h checks them (same messages and types,
    less what only the kernels need: head dims a multiple of 8, aligned rows, contiguous options)."""
    varlen = _check_cu_seqlens(q, cu_seqlens_q, cu_seqlens_k)
    _check_needs_varlen(varlen, seqused_q=seqused_q, seqused_k=seqused_k, leftpad_k=leftpad_k,
                        block_table=block_table)
    _check_qkv(q, k, v, varlen, paged=block_table is not None)
    batch = cu_seqlens_q.shape[0] - 1 if varlen else q.shape[0]
    check_alibi_slopes(alibi_slopes, q, batch)
    _check_rng_state(q, dropout_p, rng_state)
    _check_sequence_tensors(q, k, batch, seqused_q, seqused_k, leftpad_k, block_table)


def check_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, softmax_lse: Tensor,
              alibi_slopes: Tensor | None, dropout_p: float, rng_state: Tensor | None, cu_seqlens_q: Tensor | None,
              cu_seqlens_k: Tensor | None, seqused_q: Tensor | None = None, seqused_k: Tensor | None = None,
              leftpad_k: Tensor | None = None) -> None:
    """The tensors of flashattn::bwd: fwd's (without block_table), then dout, out and the forward's
    softmax_lse."""
    check_fwd(q, k, v, alibi_slopes, dropout_p, rng_state, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k,
              leftpad_k)
    varlen = cu_seqlens_k is not None
    layout = "(total_q, nheads, headdim)" if varlen else "(batch, seqlen_q, nheads, headdim)"
    check_tensor("dout", dout, q, q.dim(), layout)
    check_tensor("out", out, q, q.dim(), layout)
    check_last_dim_contiguous("out", out)
    if dout.shape != out_shape(q, v) or out.shape != out_shape(q, v):
        raise RuntimeError(
            f"flashattn: dout {_shape(dout)} and out {_shape(out)} must have the shape of q {_shape(q)} with v's "
            f"headdim, {out_shape(q, v)}"
        )
    num_heads = q.shape[-2]
    lse_shape = (num_heads, q.shape[0]) if varlen else (q.shape[0], num_heads, q.shape[1])
    if softmax_lse.device != q.device or softmax_lse.dtype != torch.float32 or softmax_lse.shape != lse_shape:
        raise RuntimeError(
            f"flashattn: softmax_lse must be the forward's contiguous float32 tensor of shape {lse_shape} on q's "
            f"device, got {_shape(softmax_lse)} {softmax_lse.dtype} on {softmax_lse.device}"
        )


def check_offsets(q: Tensor, k: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
                  max_seqlen_k: int, paged: bool = False) -> None:
    """The values of a variable-length batch's offsets, read on the host (free for CPU tensors; the CUDA
    binding takes them as the caller's promise): 0 first, nondecreasing, within the rows of q (k; with
    pages, the lengths are _sequences' to check), no sequence longer than max_seqlen_q (max_seqlen_k)."""
    for name, cu, t, tensor_name, max_name, max_seqlen in (
        ("cu_seqlens_q", cu_seqlens_q, q, "q", "max_seqlen_q", max_seqlen_q),
        ("cu_seqlens_k", cu_seqlens_k, k, "k", "max_seqlen_k", max_seqlen_k),
    ):
        offsets = cu.tolist()
        rows = math.inf if paged and t is k else t.shape[0]
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
        if longest > max_seqlen:
            raise ValueError(
                f"flashattn: {max_name} = {max_seqlen} is less than the longest sequence of {name} ({longest}); "
                "it must be at least every sequence's length"
            )


# ------------------------------------------------------------------------------------------ the algorithm

BLOCK_M = 128
BLOCK_N = 128


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
    learnable_sink: Tensor | None = None  # fp32 [H]: one more softmax column per head, without a value

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
        learnable_sink: Tensor | None = None,
    ) -> "_Options":
        """The options of the operator's arguments (dropout_p > 0 needs its rng_state)."""
        slopes = None if alibi_slopes is None else alibi_slopes.float().reshape(-1, alibi_slopes.shape[-1])
        return _Options(
            softmax_scale=softmax_scale,
            left=window_left,
            right=0 if causal else window_right,
            softcap=softcap,
            alibi_slopes=slopes,
            dropout_p=dropout_p,
            rng_state=rng_state if dropout_p > 0 else None,
            learnable_sink=learnable_sink,
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

class _OnlineSoftmax:
    """Softmax over key blocks that arrive one at a time, for every query row of a block.

    Keeps the running row max of the scores seen so far and the running row
    sum of exp(score - max). When a block raises the max, what was summed and
    accumulated before is rescaled by exp(old_max - new_max).

    A learnable sink (`sink`, broadcastable to the rows) is a column seen before
    any key: the max starts at it and the sum at exp(sink - sink) = 1, with
    nothing added to the output. A row that then sees no key keeps sum 1,
    hence output 0 and LSE sink.
    """

    def __init__(self, row_shape: tuple[int, ...], sink: Tensor | None = None) -> None:
        if sink is None:
            self.row_max = torch.full(row_shape, -math.inf, dtype=torch.float32)
            self.row_sum = torch.zeros(row_shape, dtype=torch.float32)
        else:
            self.row_max = sink.float().expand(row_shape).clone()
            # A sink of -inf is no sink: its column weighs exp(-inf) = 0.
            self.row_sum = torch.where(self.row_max == -math.inf, 0.0, 1.0)

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
    v_heads: Tensor,  # [B, Hk, Sk, Dv], Dv <= D
    rows: range,
    diagonal: int,
    opts: _Options,
) -> tuple[Tensor, Tensor]:
    """Attention of one block of query rows over every key block they can see, in fp32.

    Returns out [B, Hk, G, bm, Dv] and lse [B, Hk, G, bm].
    """
    batch, num_heads_k, group, block_m, _ = q_blk.shape
    v_head_dim = v_heads.shape[-1]
    # The G heads of a group are stacked as rows of one matrix, so each K/V
    # block serves them all through a plain batched matmul, with no copy of K/V.
    q_rows = q_blk.float().flatten(2, 3)  # [B, Hk, G * bm, D]
    sink = None
    if opts.learnable_sink is not None:
        sink = opts.learnable_sink.reshape(1, num_heads_k, group, 1)  # [1, Hk, G, 1]
    softmax = _OnlineSoftmax((batch, num_heads_k, group, block_m), sink)
    acc = torch.zeros((batch, num_heads_k, group, block_m, v_head_dim), dtype=torch.float32)
    # Keys outside the window of every row of the block (e.g. in every row's
    # future when causal) are never visited; blocks stay on the BLOCK_N grid.
    visible_keys = _key_range(rows, k_heads.shape[2], diagonal, opts)
    for key_start in range(visible_keys.start // BLOCK_N * BLOCK_N, visible_keys.stop, BLOCK_N):
        keys = range(key_start, min(key_start + BLOCK_N, visible_keys.stop))
        k_blk = k_heads[:, :, keys.start : keys.stop].float()  # [B, Hk, bn, D]
        v_blk = v_heads[:, :, keys.start : keys.stop].float()  # [B, Hk, bn, Dv]
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
    """The forward of q [B, Sq, H, D] over k [B, Sk, Hk, D] and v [B, Sk, Hk, Dv] (Dv <= D): out
    [B, Sq, H, Dv], lse [B, H, Sq]."""
    batch, seqlen_q, num_heads, _ = q.shape
    seqlen_k, num_heads_k = k.shape[1], k.shape[2]
    group = num_heads // num_heads_k  # query head h uses KV head h // group
    out = q.new_empty(out_shape(q, v))  # [B, Sq, H, Dv]
    softmax_lse = q.new_empty((batch, num_heads, seqlen_q), dtype=torch.float32)  # [B, H, Sq]
    k_heads = k.transpose(1, 2)  # [B, Hk, Sk, D], a view
    v_heads = v.transpose(1, 2)  # [B, Hk, Sk, Dv], a view
    for first_row in range(0, seqlen_q, BLOCK_M):
        rows = range(first_row, min(first_row + BLOCK_M, seqlen_q))
        q_blk = q[:, rows.start : rows.stop].transpose(1, 2).unflatten(1, (num_heads_k, group))  # [B, Hk, G, bm, D]
        out_blk, lse_blk = _attend_query_block(q_blk, k_heads, v_heads, rows, seqlen_k - seqlen_q, opts)
        out[:, rows.start : rows.stop] = out_blk.flatten(1, 2).transpose(1, 2)  # cast to q's dtype on copy
        softmax_lse[:, :, rows.start : rows.stop] = lse_blk.flatten(1, 2)
    return out, softmax_lse


def _in_range(name: str, values: list[int], b: int, lo: int, hi: int) -> int:
    if not lo <= values[b] <= hi:
        raise ValueError(f"flashattn: {name}[{b}] = {values[b]} is outside [{lo}, {hi}]")
    return values[b]


def _sequences(cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, seqused_q: Tensor | None = None,
               seqused_k: Tensor | None = None, leftpad_k: Tensor | None = None, block_table: Tensor | None = None,
               num_pages: int = 0, page_size: int = 1) -> list[tuple[slice, slice]]:
    """(query rows, key rows) of each sequence of a variable-length batch, from host copies of the offsets,
    cut by seqused_q, seqused_k and leftpad_k; with a block table the key rows count from 0 in the
    sequence's pages (_key_rows). Values out of range raise ValueError naming the argument (the CUDA
    kernels clamp and record them: csrc/common/mask.cuh)."""
    starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    used_q = seqused_q.tolist() if seqused_q is not None else None
    used_k = seqused_k.tolist() if seqused_k is not None else None
    pads = leftpad_k.tolist() if leftpad_k is not None else None
    capacity = block_table.shape[1] * page_size if block_table is not None else 0
    sequences = []
    for b in range(len(starts_q) - 1):
        q_start, q_len = starts_q[b], starts_q[b + 1] - starts_q[b]
        if used_q is not None:
            q_len = _in_range("seqused_q", used_q, b, 0, q_len)
        k_start, k_len = (0 if block_table is not None else starts_k[b]), starts_k[b + 1] - starts_k[b]
        if block_table is not None and used_k is None and k_len > capacity:
            raise ValueError(f"flashattn: the length (cu_seqlens_k[b + 1] - cu_seqlens_k[b]) of sequence {b} is "
                             f"{k_len}, past the {capacity} rows its block_table row holds")
        if used_k is not None:
            k_len = _in_range("seqused_k", used_k, b, 0, capacity if block_table is not None else k_len)
        pad = _in_range("leftpad_k", pads, b, 0, k_len) if pads is not None else 0
        if block_table is not None:
            entries = block_table[b, : -(-k_len // page_size)].tolist()
            for entry, page in enumerate(entries):
                if not 0 <= page < num_pages:
                    raise ValueError(f"flashattn: block_table[{b}][{entry}] = {page} is outside [0, {num_pages - 1}]")
        sequences.append((slice(q_start, q_start + q_len), slice(k_start + pad, k_start + k_len)))
    return sequences


def _key_rows(t: Tensor, keys: slice, block_table: Tensor | None, b: int) -> Tensor:
    """Sequence b's key rows `keys` of k or v: a slice of the packed rows, or gathered from its pages."""
    if block_table is None:
        return t[keys]
    page_size = t.shape[1]
    pages = block_table[b, : -(-keys.stop // page_size)].long()
    return t[pages].flatten(0, 1)[keys]


def fwd(
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
    """FlashAttention's forward in plain PyTorch: the readable statement of the algorithm.

    Query blocks of BLOCK_M rows attend to key blocks of BLOCK_N keys with an
    online softmax, computing in fp32 whatever the input dtype (fp16, bf16,
    fp32), vectorised over batch and heads. The full [Sq, Sk] score matrix
    never exists; key blocks outside every row's window are skipped, and only
    blocks that a window edge crosses are masked. A variable-length batch runs
    each sequence as a batch of one (its keys gathered from its pages with a
    block table), written into the packed outputs; rows that no sequence uses
    (past cu_seqlens_q[-1] or a sequence's seqused_q) get out 0, lse -inf.
    `deterministic` is for the backward; this forward always is. A learnable_sink
    (fp32 [H]) joins each row's softmax as a column without a
    value (_OnlineSoftmax); the LSE includes it. v may have a smaller head dim
    than q and k (DeepSeek MLA's 192 / 128): the scores use q's and k's, out
    has v's; nothing is padded.
    """
    check_fwd(q, k, v, alibi_slopes, dropout_p, rng_state, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k,
              leftpad_k, block_table)
    check_learnable_sink(learnable_sink, q)
    opts = _Options.of(softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, dropout_p, rng_state,
                       learnable_sink)
    if cu_seqlens_q is None:
        return _fwd_padded(q, k, v, opts)
    paged = block_table is not None
    check_offsets(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, paged=paged)
    total_q, num_heads, _ = q.shape
    out = q.new_zeros(out_shape(q, v))  # [total_q, H, Dv]
    softmax_lse = torch.full((num_heads, total_q), -math.inf, dtype=torch.float32, device=q.device)  # [H, total_q]
    sequences = _sequences(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, leftpad_k, block_table,
                           k.shape[0], k.shape[1] if paged else 1)
    for b, (rows, keys) in enumerate(sequences):
        k_b, v_b = _key_rows(k, keys, block_table, b), _key_rows(v, keys, block_table, b)
        out_b, lse_b = _fwd_padded(q[rows][None], k_b[None], v_b[None], opts.for_sequence(b))
        out[rows] = out_b[0]
        softmax_lse[:, rows] = lse_b[0]
    return out, softmax_lse



def _key_block_gradients(
    k_blk: Tensor,  # [B, Hk, bn, D], fp32
    v_blk: Tensor,  # [B, Hk, bn, Dv], fp32
    q_heads: Tensor,  # [B, Hk, G, Sq, D]: the G query heads that share each KV head
    do_heads: Tensor,  # [B, Hk, G, Sq, Dv]
    lse: Tensor,  # [B, Hk, G, Sq], fp32, +inf on rows that saw no key
    delta: Tensor,  # [B, Hk, G, Sq], fp32: rowsum(dO * O)
    dq_acc: Tensor,  # [B, Hk, G, Sq, D], fp32, accumulated in place
    keys: range,
    diagonal: int,
    opts: _Options,
) -> tuple[Tensor, Tensor]:
    """One block of keys walks every query block that can see it, in fp32.

    Recomputes the probabilities from the scores and the saved LSE, adds the
    block's share to dQ (unscaled) and returns its dK [B, Hk, bn, D] (unscaled)
    and dV [B, Hk, bn, Dv], summed over the query heads of each KV head.
    """
    batch, num_heads_k, group, seqlen_q, _ = q_heads.shape
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
        do_rows = do_heads[:, :, :, rows.start : rows.stop].float().flatten(2, 3)  # [B, Hk, G * bm, Dv]
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
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, softmax_lse: Tensor, opts: _Options,
    dlse: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """The backward of _fwd_padded: dq [B, Sq, H, D], dk [B, Sk, Hk, D] and dv [B, Sk, Hk, Dv], and with
    a learnable sink its gradient [H] in fp32 (else None). dlse [B, H, Sq], if given, is the gradient of
    softmax_lse."""
    batch, seqlen_q, num_heads, head_dim = q.shape
    seqlen_k, num_heads_k = k.shape[1], k.shape[2]
    group = num_heads // num_heads_k  # query head h uses KV head h // group

    def grouped(t: Tensor) -> Tensor:
        """[B, H, ...] as [B, Hk, G, ...], a view."""
        return t.unflatten(1, (num_heads_k, group))

    # The preprocess: D = rowsum(dO * O) per query row.
    delta = (dout.float() * out.float()).sum(dim=-1).transpose(1, 2)  # [B, H, Sq]
    if dlse is not None:
        # lse_i = log(sum_j exp(S_ij) [+ exp(sink)]), so d lse_i / d S_ij = P_ij and dS_ij gains
        # dlse_i * P_ij: P_ij * (dP_ij - D_i + dlse_i), the softmax's backward with D_i - dlse_i for
        # D_i. Rows that saw no key (lse -inf) have P = 0: their dlse is dropped, NaN or not.
        delta = delta - dlse.float().masked_fill(softmax_lse == -math.inf, 0.0)
    delta = grouped(delta)  # [B, Hk, G, Sq]
    # A row that saw no key has lse -inf, which would make exp(S - lse) = inf;
    # +inf makes its probabilities, hence all its gradients, 0.
    lse = grouped(softmax_lse.masked_fill(softmax_lse == -math.inf, math.inf))  # [B, Hk, G, Sq]
    q_heads = grouped(q.transpose(1, 2))  # [B, Hk, G, Sq, D], a view
    do_heads = grouped(dout.transpose(1, 2))  # [B, Hk, G, Sq, Dv], a view
    dq_acc = torch.zeros((batch, num_heads_k, group, seqlen_q, head_dim), dtype=torch.float32)
    dk = k.new_empty((batch, seqlen_k, num_heads_k, head_dim))  # [B, Sk, Hk, D]
    dv = v.new_empty(v.shape)  # [B, Sk, Hk, Dv]
    for key_start in range(0, seqlen_k, BLOCK_N):
        keys = range(key_start, min(key_start + BLOCK_N, seqlen_k))
        k_blk = k[:, keys.start : keys.stop].transpose(1, 2).float()  # [B, Hk, bn, D]
        v_blk = v[:, keys.start : keys.stop].transpose(1, 2).float()  # [B, Hk, bn, Dv]
        dk_blk, dv_blk = _key_block_gradients(
            k_blk, v_blk, q_heads, do_heads, lse, delta, dq_acc, keys, seqlen_k - seqlen_q, opts
        )
        # S = scale * Q K^T: dQ and dK take the scale once, on the sums.
        dk[:, keys.start : keys.stop] = (dk_blk * opts.softmax_scale).transpose(1, 2)  # cast to k's dtype on copy
        dv[:, keys.start : keys.stop] = dv_blk.transpose(1, 2)
    dq = q.new_empty((batch, seqlen_q, num_heads, head_dim))  # [B, Sq, H, D]
    dq.copy_((dq_acc * opts.softmax_scale).flatten(1, 2).transpose(1, 2))
    dsink = None
    if opts.learnable_sink is not None:
        # The sink is a column of probability P_sink = exp(sink - lse) whose dP is 0 (it has no value):
        # its dS is P_sink * (0 - delta), summed over every row that shares the head.
        sink = opts.learnable_sink.reshape(1, num_heads_k, group, 1)  # [1, Hk, G, 1]
        dsink = -(torch.exp(sink - lse) * delta).sum(dim=(0, 3)).flatten()  # [H]
    return dq, dk, dv, dsink


def bwd(
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
    """FlashAttention-2's backward in plain PyTorch: the readable statement of the algorithm.

    Of the forward it needs only out and the LSE: the probabilities (and the
    dropout mask) are recomputed block by block, so memory stays linear in the
    sequence length. Each block of BLOCK_N keys walks the blocks of BLOCK_M
    queries that can see it, accumulating its dK and dV, while dQ is
    accumulated over key blocks; all in fp32, converted to the input dtype
    once. The summation order is fixed, so the result is bitwise reproducible
    whatever `deterministic` says. A variable-length batch runs each sequence
    as a batch of one; rows and keys that no sequence uses get zero gradients.

    learnable_sink (fp32 [H], the forward's) has its gradient come back as the
    fourth result (fp32 [H]; an empty (0,) tensor without a sink); dlse, the
    gradient of softmax_lse (its shape, fp32), flows into dq and dk (no Sq x Sk
    tensor).
    """
    check_bwd(dout, q, k, v, out, softmax_lse, alibi_slopes, dropout_p, rng_state, cu_seqlens_q, cu_seqlens_k,
              seqused_q, seqused_k, leftpad_k)
    check_learnable_sink(learnable_sink, q)
    check_dlse(dlse, softmax_lse)
    opts = _Options.of(softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, dropout_p, rng_state,
                       learnable_sink)
    no_sink = torch.zeros((0,), dtype=torch.float32, device=q.device)
    if cu_seqlens_q is None:
        dq, dk, dv, dsink = _bwd_padded(dout, q, k, v, out, softmax_lse, opts, dlse)
        return dq, dk, dv, no_sink if dsink is None else dsink
    check_offsets(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    dq = q.new_zeros(q.shape)  # [total_q, H, D]
    dk = k.new_zeros(k.shape)  # [total_k, Hk, D]
    dv = v.new_zeros(v.shape)  # [total_k, Hk, Dv]
    dsink = no_sink if learnable_sink is None else torch.zeros_like(learnable_sink)  # [H]
    sequences = _sequences(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, leftpad_k)
    for b, (rows, keys) in enumerate(sequences):
        *grads, dsink_b = _bwd_padded(
            dout[rows][None],
            q[rows][None],
            k[keys][None],
            v[keys][None],
            out[rows][None],
            softmax_lse[:, rows][None],
            opts.for_sequence(b),
            None if dlse is None else dlse[:, rows][None],
        )
        for grad, grad_b, part in zip((dq, dk, dv), grads, (rows, keys, keys)):
            grad[part] = grad_b[0]
        if dsink_b is not None:
            dsink += dsink_b
    return dq, dk, dv, dsink


def s_dmask_block_n(head_dim: int) -> int:
    """The key-block width of FlashAttention-2's forward kernel when it runs with dropout (its
    flash_attn_interface._get_block_size_n with is_dropout; the same on every GPU): S_dmask holds each
    block's probabilities relative to the running row max at that block, so undoing it needs the width.
    FlashAttention-2 stops at head dim 256; flashattn's 257 to 512 keep 256's width."""
    if head_dim <= 32:
        return 128
    return 32 if 96 < head_dim <= 128 else 64


def attention_probs(
    q: Tensor,
    k: Tensor,
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
    """FlashAttention-2's S_dmask [B, H, Sq, Sk] of padded q [B, Sq, H, D] and k [B, Sk, Hk, D], in q's
    dtype: the probabilities unnormalised as its forward kernel leaves them. The kernel walks key
    blocks of s_dmask_block_n(D) keys from the last to the first and stores exp(score - m), m the row
    max of the scores of this block and of every block right of it (0 while that is -inf); masked
    entries are 0; the sign bit is set where dropout drops. (exp(m - lse) times an entry is the
    probability: FlashAttention-2's tests normalise it so.) Materialises all of Sq x Sk."""
    opts = _Options.of(softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, dropout_p, rng_state)
    opts = replace(opts, batch_start=batch_start)
    batch, seqlen_q, num_heads, head_dim = q.shape
    seqlen_k, num_heads_k = k.shape[1], k.shape[2]
    if seqlen_q == 0 or seqlen_k == 0:
        return q.new_zeros((batch, num_heads, seqlen_q, seqlen_k))
    group = num_heads // num_heads_k
    rows, keys = range(seqlen_q), range(seqlen_k)
    q_rows = q.transpose(1, 2).unflatten(1, (num_heads_k, group)).flatten(2, 3).float()  # [B, Hk, G * Sq, D]
    k_heads = k.transpose(1, 2).float()  # [B, Hk, Sk, D]
    scores, _ = _block_scores(q_rows, k_heads, group, rows, keys, seqlen_k - seqlen_q, opts)  # [B, Hk, G, Sq, Sk]
    block_n = s_dmask_block_n(head_dim)
    block_max = torch.stack([block.amax(dim=-1) for block in scores.split(block_n, dim=-1)], dim=-1)
    running_max = block_max.flip(-1).cummax(dim=-1).values.flip(-1)  # over this block and those right of it
    running_max = running_max.masked_fill(running_max == -math.inf, 0.0)
    probs = torch.exp(scores - running_max.repeat_interleave(block_n, dim=-1)[..., :seqlen_k])
    if opts.dropout_p > 0:
        probs = torch.where(_block_keep(rows, keys, batch, num_heads_k, group, opts), probs, -probs)
    return probs.flatten(1, 2).to(q.dtype)


def check_combine(out_partial: Tensor, lse_partial: Tensor, out_dtype: torch.dtype | None) -> None:
    """flashattn::combine's tensors (csrc/api/checks.h makes the same checks of CUDA tensors, and
    requires out_partial's last dimension contiguous): out_partial fp32 (num_splits >= 1, batch,
    seqlen, nheads, headdim), lse_partial fp32 (num_splits, batch, seqlen, nheads) on its device;
    out_dtype None (float32), float32, float16 or bfloat16."""
    if out_partial.dim() != 5:
        raise ValueError("flashattn: out_partial must be 5-D (num_splits, batch, seqlen, nheads, headdim), "
                         f"got shape {_shape(out_partial)}")
    if out_partial.shape[0] == 0:
        raise ValueError("flashattn: out_partial must hold at least one split, got num_splits = 0")
    lse_shape = tuple(out_partial.shape[:-1])
    if tuple(lse_partial.shape) != lse_shape:
        raise ValueError(f"flashattn: lse_partial must have shape (num_splits, batch, seqlen, nheads) = {lse_shape}, "
                         f"got {_shape(lse_partial)}")
    for name, t in (("out_partial", out_partial), ("lse_partial", lse_partial)):
        if t.dtype != torch.float32:
            raise TypeError(f"flashattn: {name} must be float32, got {t.dtype}")
    if lse_partial.device != out_partial.device:
        raise RuntimeError(f"flashattn: lse_partial is on {lse_partial.device} but out_partial is on "
                           f"{out_partial.device}; they must be on one device")
    accepted = (torch.float32, torch.float16, torch.bfloat16)
    if out_dtype is not None and out_dtype not in accepted:
        raise TypeError(f"flashattn: out_dtype must be one of {', '.join(map(str, accepted))}, got {out_dtype}")


def combine(out_partial: Tensor, lse_partial: Tensor) -> tuple[Tensor, Tensor]:
    """flash_attn_combine's arithmetic, in plain PyTorch (so autograd differentiates it).

    out_partial [splits, B, S, H, D] and lse_partial [splits, B, S, H], fp32: attention over
    disjoint sets of keys. Returns out [B, S, H, D] = sum_s exp(lse_s - lse) * out_s and
    lse [B, S, H] = log(sum_s exp(lse_s)), in fp32; a row whose every split saw no key
    (lse -inf) gets out 0 and lse -inf.
    """
    # Subtracting the row max keeps exp in range; lse does not depend on it, so it is detached.
    lse_max = lse_partial.detach().amax(dim=0)  # [B, S, H]
    offset = torch.where(lse_max == -math.inf, 0.0, lse_max)
    weights = torch.exp(lse_partial - offset)  # [splits, B, S, H]
    total = weights.sum(dim=0)  # [B, S, H]
    empty = total == 0
    # Where every split is empty, log and division see 1: no inf * 0 = NaN in the gradients.
    safe_total = torch.where(empty, 1.0, total)
    lse = torch.where(empty, -math.inf, offset + torch.log(safe_total))
    out = ((weights / safe_total).unsqueeze(-1) * out_partial).sum(dim=0)  # [B, S, H, D]
    return out, lse
