"""Context-parallel attention: one sequence split across the ranks of a torch.distributed process group.

Every rank holds a shard of q, k and v along the sequence, (batch, seqlen_local, nheads, headdim) as
flash_attn_func takes them, and gets the attention of its own queries over the whole sequence, forward
and backward. Two schemes, both built on flashattn's own functions, so the same code runs the CUDA
kernels over NCCL and the CPU implementation over gloo:

- ring_attention: K/V blocks travel around the ring of ranks (point-to-point sends); each rank attends
  its queries to the block in hand while the next block is in flight, and merges the blocks' results by
  their log-sum-exp. Any head counts; per rank it sends (world_size - 1) K/V blocks forward and, in the
  backward, K/V blocks and fp32 dK/dV accumulators; memory stays that of the local shard.
- ulysses_attention: all-to-all exchanges turn sequence shards into head shards (every rank gets the
  whole sequence for nheads / world_size heads), flash_attn_func runs locally, and an all-to-all turns
  the output back. Its per-rank traffic (four all-to-alls of the local shard's size, forward) does not
  grow with world_size, but the heads must divide by it, and nothing overlaps the exchanges.

Which is faster where: in the forward Ulysses sends about (nheads + nheads_k) / (world_size * nheads_k)
of the ring's bytes per rank (MHA: 2 / world_size) and suits a fast all-to-all (NVLink in one node);
the ring hides its traffic behind the attention of long blocks, takes any head count (MQA with 1 KV
head), and stays usable across nodes. Figures:
benchmarks/parallel.py (README, "Context parallelism").

Sharding (shard, unshard, positions): causal attention needs load balance, since the last tokens see
the whole sequence and the first see nothing. The "zigzag" layout (ring-flash-attention's and PyTorch
context_parallel's head-tail balancer) cuts the sequence into 2 * world_size chunks and gives rank r
chunks r and 2 * world_size - 1 - r, so every rank does the same causal work. "contiguous" gives rank r
the r-th of world_size equal slices (balanced without causal; correct but unbalanced with it), or,
given local_seqlens, the r-th of slices of those lengths (uneven shards: ring_attention only; with
causal the later ranks do more of the work). Both functions take either layout; every tensor of one
call must use the same.
"""

import contextlib
from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from .flash_attn_interface import _flash_attn_backward, _flash_attn_forward
from .interface import (_check_bool, _check_dropout_p, _check_softcap, _check_tensors, _resolve_softmax_scale,
                        _window_sides, flash_attn_func)

__all__ = ["LAYOUTS", "positions", "ring_attention", "sdpa_context_parallel", "shard", "ulysses_attention",
           "unshard"]

LAYOUTS = ("zigzag", "contiguous")
_EVERYTHING = slice(None)


def positions(seqlen: int, rank: int, world_size: int, layout: str = "zigzag",
              device: torch.device | str | None = None, *, local_seqlens: Sequence[int] | None = None) -> Tensor:
    """The indices, in the whole sequence of length seqlen, of the tokens rank holds (int64, ascending):
    for position-dependent inputs (rotary embeddings, labels) of the local shard. local_seqlens: as in
    shard()."""
    return torch.cat([torch.arange(start, start + length, device=device)
                      for start, length in _spans(seqlen, rank, world_size, layout, local_seqlens, "seqlen")])


def shard(x: Tensor, rank: int, world_size: int, layout: str = "zigzag", dim: int = 1, *,
          local_seqlens: Sequence[int] | None = None) -> Tensor:
    """rank's shard of x, the whole sequence along dim (q, k, v: (batch, seqlen, nheads, headdim), dim 1).

    local_seqlens (layout "contiguous" only): the length of every rank's shard, in rank order, adding up
    to x.shape[dim]; rank r gets the r-th slice of those lengths (ring_attention takes the same list)."""
    spans = _spans(x.shape[dim], rank, world_size, layout, local_seqlens, f"x.shape[{dim}]")
    return torch.cat([x.narrow(dim, start, length) for start, length in spans], dim)


def unshard(shards: Sequence[Tensor], layout: str = "zigzag", dim: int = 1) -> Tensor:
    """The whole sequence from every rank's shard, in rank order (e.g. from dist.all_gather); with layout
    "contiguous" the shards may differ in length."""
    _check_layout(layout)
    if layout == "zigzag" and len({s.shape[dim] for s in shards}) > 1:
        raise ValueError(f"flashattn.parallel: layout 'zigzag' needs shards of one length, got "
                         f"{[s.shape[dim] for s in shards]} along dim {dim}")
    return _to_sequence_order(torch.cat(list(shards), dim), len(shards), layout, dim)


def ring_attention(
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
    return_lse: bool = False,
    *,
    group: dist.ProcessGroup | None = None,
    layout: str = "zigzag",
    local_seqlens: Sequence[int] | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Ring attention over `group` (default: the default group), forward and backward.

    Args:
        q: (batch, seqlen_local, nheads, headdim), this rank's shard in `layout` (see shard()).
        k, v: (batch, seqlen_local, nheads_k, headdim), sharded alike; nheads a multiple of nheads_k
            (GQA/MQA). The total length is world_size * seqlen_local; with layout "zigzag" seqlen_local
            must be even (the total a multiple of 2 * world_size). Uneven shards: see local_seqlens.
        softmax_scale, softcap, deterministic: as in flash_attn_func (deterministic: each block's backward
            is, and blocks are summed in ring order, so the whole backward is bitwise reproducible).
        causal: over the whole sequence (top-left and bottom-right alignment agree: Sq == Sk).
        dropout_p, window_size, alibi_slopes: not supported (they need the blocks' absolute positions, or
            a dropout mask drawn per block): dropout_p > 0, a bounded window or slopes raise ValueError.
        return_lse: also return softmax_lse (batch, nheads, seqlen_local), fp32, over the whole sequence.
            It is not differentiable here: a loss that uses it raises NotImplementedError in the backward.
        group: the process group of the ranks that share the sequence; layout: "zigzag" or "contiguous".
        local_seqlens: with layout "contiguous", the local seqlen of every rank of the group in rank order
            (q.shape[1] here), when they differ (shard(..., local_seqlens=...) cuts them); a rank may hold
            0 tokens. The caller knows them from sharding: nothing is exchanged to learn them. None: every
            rank holds q.shape[1] tokens. With causal the work is unbalanced, as with even contiguous shards.

    Returns:
        out (batch, seqlen_local, nheads, headdim_v) in q's dtype, differentiable in q, k and v;
        (out, softmax_lse) with return_lse=True.

    Each of the world_size steps attends to the block in hand with the private forward
    flash_attn_interface._flash_attn_forward (out and LSE), having issued the sends and receives of the
    next block first; the results merge in fp32 by their LSE. The backward makes the same trip, calling
    _flash_attn_backward per block with the final out and LSE (so each block's kernel recomputes the
    final probabilities), summing dq locally in fp32 and passing each block's fp32 dK/dV accumulator
    along with it. With zigzag causal every step is one of three half-size problems (see _block), the
    same amount of work on every rank.
    """
    _check_options("ring_attention", q, k, v, dropout_p, causal, deterministic, return_lse, softcap, layout)
    if _window_sides(window_size) != (-1, -1):
        raise ValueError(f"flashattn.parallel: ring_attention does not support window_size (got {window_size!r}): "
                         "pass (-1, -1), or use ulysses_attention, which does")
    if alibi_slopes is not None:
        raise ValueError("flashattn.parallel: ring_attention does not support alibi_slopes (the blocks' biases need "
                         "their absolute positions): pass None, or use ulysses_attention, which does")
    if local_seqlens is not None:
        rank = dist.get_rank(group)
        local_seqlens = _check_local_seqlens(local_seqlens, dist.get_world_size(group), layout)
        if local_seqlens[rank] != q.shape[1]:
            raise ValueError(f"flashattn.parallel: local_seqlens[{rank}] ({local_seqlens[rank]}) must be this rank's "
                             f"local seqlen, q.shape[1] = {q.shape[1]}")
    scale = _resolve_softmax_scale(softmax_scale, q.shape[-1])
    out, lse = _RingAttention.apply(q, k, v, _Ring(group, local_seqlens), scale, bool(causal), float(softcap),
                                    bool(deterministic), layout)
    return (out, lse) if return_lse else out


def ulysses_attention(
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
    return_lse: bool = False,
    *,
    group: dist.ProcessGroup | None = None,
    layout: str = "zigzag",
) -> Tensor | tuple[Tensor, Tensor]:
    """All-to-all (DeepSpeed-Ulysses) attention over `group`, forward and backward.

    Arguments and results as in ring_attention, with these differences: nheads must be a multiple of
    world_size, and nheads_k a multiple of it or a divisor of it (K/V heads are then repeated so that each
    rank gets one, the GQA grouping kept: MQA works); window_size and alibi_slopes ((nheads,) or
    (batch, nheads) fp32) are supported, since every rank sees the whole sequence; softmax_lse is
    differentiable. dropout_p > 0 raises ValueError.

    The exchanges run on the caller's stream (they wait for nothing else): on NCCL they do not overlap
    the attention. Between the all-to-alls every rank holds the whole sequence for its heads: 2x q's
    shard per tensor in transit at most.
    """
    _check_options("ulysses_attention", q, k, v, dropout_p, causal, deterministic, return_lse, softcap, layout)
    world_size = dist.get_world_size(group)
    rank = dist.get_rank(group)
    num_heads, num_heads_k = q.shape[2], k.shape[2]
    if num_heads % world_size:
        raise ValueError(f"flashattn.parallel: ulysses_attention needs nheads (q.shape[2] = {num_heads}) to be a "
                         f"multiple of world_size ({world_size}); ring_attention takes any head count")
    if num_heads_k % world_size and world_size % num_heads_k:
        raise ValueError(f"flashattn.parallel: ulysses_attention needs nheads_k (k.shape[2] = {num_heads_k}) to be "
                         f"a multiple or a divisor of world_size ({world_size}); ring_attention takes any")
    if num_heads_k < world_size:  # one K/V head per rank: head h of rank r's heads maps to K/V head r // repeats
        k, v = (t.repeat_interleave(world_size // num_heads_k, dim=2) for t in (k, v))
    if alibi_slopes is not None:
        heads = num_heads // world_size
        alibi_slopes = alibi_slopes[..., rank * heads : (rank + 1) * heads]
    q, k, v = (_sequence_to_heads(t, group, layout) for t in (q, k, v))
    out, lse, _ = flash_attn_func(q, k, v, 0.0, softmax_scale, causal, window_size, softcap, alibi_slopes,
                                  deterministic, return_attn_probs=True)
    out = _heads_to_sequence(out, group, layout)
    if not return_lse:
        return out
    return out, _heads_to_sequence(lse.transpose(1, 2), group, layout).transpose(1, 2).contiguous()


@contextlib.contextmanager
def sdpa_context_parallel(group: dist.ProcessGroup | None = None, layout: str = "zigzag",
                          method: str = "ring") -> Iterator[None]:
    """Inside, torch.nn.functional.scaled_dot_product_attention runs context-parallel on flashattn: a
    model that calls F.scaled_dot_product_attention(q, k, v, is_causal=..., scale=..., enable_gqa=...)
    on (batch, nheads, seqlen_local, headdim) shards, unchanged, gets ring_attention (method="ring") or
    ulysses_attention (method="ulysses") over the group. attn_mask and dropout_p > 0 raise ValueError.
    Like PyTorch's context_parallel it replaces the attribute of torch.nn.functional, so code that
    imported the function by name before is not affected. Not thread-safe; restored on exit."""
    _check_layout(layout)
    attention = {"ring": ring_attention, "ulysses": ulysses_attention}.get(method)
    if attention is None:
        raise ValueError(f"flashattn.parallel: method must be 'ring' or 'ulysses', got {method!r}")
    original = F.scaled_dot_product_attention

    def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                     scale=None, enable_gqa=False):
        if attn_mask is not None:
            raise ValueError("flashattn.parallel: sdpa_context_parallel does not take attn_mask (pass "
                             "is_causal=True for a causal mask)")
        if query.shape[1] != key.shape[1] and not enable_gqa:
            raise ValueError(f"flashattn.parallel: query has {query.shape[1]} heads and key {key.shape[1]}: pass "
                             "enable_gqa=True for grouped-query attention, as scaled_dot_product_attention needs")
        out = attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), dropout_p, scale,
                        is_causal, group=group, layout=layout)
        return out.transpose(1, 2)

    F.scaled_dot_product_attention = scaled_dot_product_attention
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


def _check_options(name: str, q: object, k: object, v: object, dropout_p: object, causal: object,
                   deterministic: object, return_lse: object, softcap: object, layout: object) -> None:
    """What both schemes check before any communication (so that every rank raises alike, none hangs)."""
    _check_tensors(q=q, k=k, v=v)
    _check_bool(causal=causal, deterministic=deterministic, return_lse=return_lse)
    _check_dropout_p(dropout_p)
    if dropout_p > 0:
        raise ValueError(f"flashattn.parallel: {name} does not support dropout: dropout_p must be 0.0, got "
                         f"{dropout_p}")
    _check_softcap(softcap)
    _check_layout(layout)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"flashattn.parallel: q, k, v must be (batch, seqlen_local, nheads, headdim) shards, got "
                         f"shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape[1] != q.shape[1] or v.shape[1] != q.shape[1]:
        raise ValueError(f"flashattn.parallel: k and v must be shards of q's sequence, with q's local seqlen "
                         f"({q.shape[1]}), got k {tuple(k.shape)}, v {tuple(v.shape)}")
    if layout == "zigzag" and q.shape[1] % 2:
        raise ValueError(f"flashattn.parallel: layout 'zigzag' needs an even local seqlen (q.shape[1] = "
                         f"{q.shape[1]}: two chunks per rank; the total a multiple of 2 * world_size); pad the "
                         "sequence, or use layout='contiguous'")


def _check_layout(layout: object) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"flashattn.parallel: layout must be one of {', '.join(map(repr, LAYOUTS))}, got {layout!r}")


def _owned_chunks(rank: int, world_size: int, layout: str) -> tuple[int, ...]:
    """The chunks of the sequence that rank holds, in the order it holds them."""
    _check_layout(layout)
    if not 0 <= rank < world_size:
        raise ValueError(f"flashattn.parallel: rank must be in [0, world_size = {world_size}), got {rank}")
    return (rank, 2 * world_size - 1 - rank) if layout == "zigzag" else (rank,)


def _check_local_seqlens(local_seqlens: object, world_size: int, layout: str) -> tuple[int, ...]:
    if layout != "contiguous":
        raise ValueError(f"flashattn.parallel: local_seqlens (uneven shards) needs layout='contiguous', got "
                         f"{layout!r}, which cuts the sequence into 2 * world_size equal chunks: pad the sequence "
                         "to a multiple of 2 * world_size, or use layout='contiguous'")
    seqlens = tuple(local_seqlens) if isinstance(local_seqlens, Sequence) else ()
    if len(seqlens) != world_size or not all(type(n) is int and n >= 0 for n in seqlens):
        raise ValueError(f"flashattn.parallel: local_seqlens must hold the local seqlen of each of the {world_size} "
                         f"ranks, in rank order, as non-negative ints; got {local_seqlens!r}")
    return seqlens


def _spans(seqlen: int, rank: int, world_size: int, layout: str, local_seqlens: Sequence[int] | None,
           name: str) -> list[tuple[int, int]]:
    """(start, length) in the whole sequence of each piece of it that rank holds, in the order it holds them."""
    chunks = _owned_chunks(rank, world_size, layout)
    if local_seqlens is None:
        chunk = _chunk_length(seqlen, world_size, layout, name)
        return [(c * chunk, chunk) for c in chunks]
    seqlens = _check_local_seqlens(local_seqlens, world_size, layout)
    if sum(seqlens) != seqlen:
        raise ValueError(f"flashattn.parallel: local_seqlens {list(seqlens)} must add up to {name} ({seqlen}), got "
                         f"{sum(seqlens)}")
    return [(sum(seqlens[:rank]), seqlens[rank])]


def _chunk_length(seqlen: int, world_size: int, layout: str, name: str) -> int:
    _check_layout(layout)
    chunks = 2 * world_size if layout == "zigzag" else world_size
    if seqlen % chunks:
        raise ValueError(f"flashattn.parallel: {name} ({seqlen}) must be a multiple of {chunks} for layout "
                         f"{layout!r} over {world_size} ranks ({'2 * ' if layout == 'zigzag' else ''}world_size); "
                         "pad the sequence to one")
    return seqlen // chunks


def _rank_order(world_size: int, layout: str) -> list[int]:
    """The chunks of the sequence as the ranks' shards, concatenated in rank order, hold them."""
    return [c for rank in range(world_size) for c in _owned_chunks(rank, world_size, layout)]


def _to_sequence_order(x: Tensor, world_size: int, layout: str, dim: int = 1) -> Tensor:
    """x, the ranks' shards concatenated in rank order along dim, in sequence order (slices and a cat:
    differentiable without scatters)."""
    if layout == "contiguous":  # rank order is sequence order, whatever the shards' lengths
        return x
    order = _rank_order(world_size, layout)
    pieces = x.chunk(len(order), dim)
    return torch.cat([pieces[order.index(c)] for c in range(len(order))], dim)


def _to_rank_order(x: Tensor, world_size: int, layout: str, dim: int = 1) -> Tensor:
    """The inverse of _to_sequence_order."""
    if layout == "contiguous":
        return x
    pieces = x.chunk(len(_rank_order(world_size, layout)), dim)
    return torch.cat([pieces[c] for c in _rank_order(world_size, layout)], dim)


def _block(layout: str, causal: bool, rank: int, source: int, seqlen: int,
           source_seqlen: int) -> tuple[slice, slice, bool] | None:
    """Which of rank's query rows (seqlen of them) attend to which rows of the K/V block that rank `source`
    holds (source_seqlen), and whether causally; None where none does, or where either is empty (no
    kernel call for an empty shard). On the diagonal (source == rank) the local rows are in sequence
    order in both layouts, so the local causal mask is the global one. Contiguous: every token of a
    lower rank comes before all of ours and every token of a higher rank after, whatever the shards'
    lengths. Zigzag: rank r holds chunks (r, 2w-1-r), source s chunks (s, 2w-1-s). s < r: both our
    chunks come after chunk s and before chunk 2w-1-s: all our rows, s's first half. s > r: only our
    late chunk 2w-1-r comes after s's two, which both come after our early chunk r: our second half,
    all of s's rows. Either is half a diagonal block's rows times half its keys."""
    if not seqlen or not source_seqlen:
        return None
    if not causal:
        return _EVERYTHING, _EVERYTHING, False
    if source == rank:
        return _EVERYTHING, _EVERYTHING, True
    if layout == "contiguous":
        return (_EVERYTHING, _EVERYTHING, False) if source < rank else None
    if source < rank:
        return _EVERYTHING, slice(0, source_seqlen // 2), False
    return slice(seqlen // 2, None), _EVERYTHING, False


class _Ring:
    """This rank's neighbours in the ring of a process group: start() sends tensors to the next rank and
    receives as many from the previous one; wait() returns what arrived.

    Uneven shards (local_seqlens): at step t of either pass this rank holds the K/V block of rank
    source(t) = (rank - t) % world_size, and the previous rank holds block source(t + 1). So all that
    arrives during step t (the next K/V block, and in the backward the dK/dV accumulators of the block
    that the previous rank just used) is block source(t + 1)'s, of local_seqlens[source(t + 1)] tokens
    along dim 1, the sender's length; after the last step, t = world_size - 1, it is source(world_size) =
    rank's: the accumulators come home. Without local_seqlens every block has the shape sent.

    On CUDA with NCCL the sends and receives run on the process group's own stream, which waits for the
    caller's stream when they are issued (so they read finished data) and which the caller's stream waits
    for at wait(): issuing them before a block's attention kernel is what overlaps the two, and no other
    synchronisation is needed; the group also keeps the buffers alive for the allocator until then."""

    def __init__(self, group: dist.ProcessGroup | None, local_seqlens: tuple[int, ...] | None = None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.local_seqlens = local_seqlens
        # P2POp takes global ranks.
        self._next, self._previous = (dist.get_global_rank(group or dist.group.WORLD, r % self.world_size)
                                      for r in (self.rank + 1, self.rank - 1))

    def start(self, tensors: tuple[Tensor, ...], step: int | None = None) -> tuple[tuple[Tensor, ...], list]:
        """Sends step's tensors ((batch, seqlen, ...): block source(step)'s or its gradients) and receives
        the previous rank's, block source(step + 1)'s."""
        tensors = tuple(t.contiguous() for t in tensors)
        if self.local_seqlens is None:
            received = tuple(torch.empty_like(t) for t in tensors)
        else:
            # Zero-length blocks travel too (gloo and NCCL >= 2.12 take empty messages): every rank takes part.
            seqlen = self.local_seqlens[(self.rank - step - 1) % self.world_size]
            received = tuple(t.new_empty((t.shape[0], seqlen, *t.shape[2:])) for t in tensors)
        ops = [dist.P2POp(dist.isend, t, self._next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, t, self._previous, self.group) for t in received]
        return received, dist.batch_isend_irecv(ops)

    @staticmethod
    def wait(pending: tuple[tuple[Tensor, ...], list]) -> tuple[Tensor, ...]:
        received, works = pending
        for work in works:
            work.wait()
        return received


def _merge(out: Tensor, lse: Tensor, block_out: Tensor, block_lse: Tensor) -> None:
    """out (fp32 [B, S, H, Dv]) and lse ([B, H, S]) become those over their keys and a block's, in place."""
    merged = torch.logaddexp(lse, block_lse)
    offset = merged.masked_fill(merged == float("-inf"), 0.0)  # rows no key reached yet: weights 0, not NaN
    weight, block_weight = ((x - offset).exp().transpose(1, 2).unsqueeze(-1) for x in (lse, block_lse))
    out.mul_(weight).add_(block_out.float() * block_weight)
    lse.copy_(merged)


def _ring_forward(q, k, v, ring, scale, causal, softcap, layout) -> tuple[Tensor, Tensor]:
    out = lse = None
    kv = (k, v)
    for step in range(ring.world_size):
        incoming = ring.start(kv, step) if step + 1 < ring.world_size else None
        block = _block(layout, causal, ring.rank, (ring.rank - step) % ring.world_size, q.shape[1], kv[0].shape[1])
        if block is not None:
            rows, keys, block_causal = block
            block_out, block_lse, _, _ = _flash_attn_forward(q[:, rows], kv[0][:, keys], kv[1][:, keys], 0.0, scale,
                                                             block_causal, -1, -1, softcap, None, False)
            if out is None:  # step 0, the diagonal block: every row
                out, lse = block_out.float(), block_lse.clone()
            else:
                _merge(out[:, rows], lse[:, :, rows], block_out, block_lse)
        if incoming is not None:
            kv = ring.wait(incoming)
    if out is None:  # this rank holds no tokens
        out = q.new_zeros((*q.shape[:3], v.shape[-1]), dtype=torch.float32)
        lse = q.new_zeros((q.shape[0], q.shape[2], 0), dtype=torch.float32)
    return out.to(q.dtype), lse


def _ring_backward(dout, q, k, v, out, lse, ring, scale, causal, softcap, deterministic, layout):
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    kv, kv_grads = (k, v), None
    for step in range(ring.world_size):
        incoming = ring.start(kv, step) if step + 1 < ring.world_size else None
        block = _block(layout, causal, ring.rank, (ring.rank - step) % ring.world_size, q.shape[1], kv[0].shape[1])
        if block is not None:
            rows, keys, block_causal = block
            block_k, block_v = kv[0][:, keys], kv[1][:, keys]
            block_dq, block_dk, block_dv = (torch.empty_like(t) for t in (q[:, rows], block_k, block_v))
            _flash_attn_backward(dout[:, rows], q[:, rows], block_k, block_v, out[:, rows],
                                 lse[:, :, rows].contiguous(), block_dq, block_dk, block_dv, 0.0, scale, block_causal,
                                 -1, -1, softcap, None, deterministic)
        # The block's accumulators arrive from the previous rank while the kernel above runs.
        if kv_grads is None:
            dk, dv = (torch.zeros(t.shape, dtype=torch.float32, device=t.device) for t in kv)
        else:
            dk, dv = ring.wait(kv_grads)
        if block is not None:
            dq[:, rows] += block_dq
            dk[:, keys] += block_dk
            dv[:, keys] += block_dv
        if ring.world_size > 1:  # after the last step this sends each block's gradients home
            kv_grads = ring.start((dk, dv), step)
        if incoming is not None:
            kv = ring.wait(incoming)
    if kv_grads is not None:
        dk, dv = ring.wait(kv_grads)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring, scale, causal, softcap, deterministic, layout):
        out, lse = _ring_forward(q, k, v, ring, scale, causal, softcap, layout)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = (ring, scale, causal, softcap, deterministic, layout)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        if dlse is not None:
            raise NotImplementedError("flashattn.parallel: ring_attention's softmax_lse is not differentiable; "
                                      "use ulysses_attention, whose is, or detach it")
        q, k, v, out, lse = ctx.saved_tensors
        if dout is None:
            return (None,) * 9
        grads = _ring_backward(dout.contiguous(), q, k, v, out, lse, *ctx.options)
        return (*grads, *(None,) * 6)


def _all_to_all(x: Tensor, group: dist.ProcessGroup | None) -> Tensor:
    """Chunk i of x's first dimension goes to rank i; chunk i of the result came from rank i."""
    x = x.contiguous()
    received = torch.empty_like(x)
    dist.all_to_all_single(received, x, group=group)
    return received


def _gather_sequence(x: Tensor, group: dist.ProcessGroup | None) -> Tensor:
    """(B, S_local, H, ...) -> (B, world * S_local, H / world, ...): rank r keeps head group r of every
    rank's shard, the shards in rank order."""
    world_size = dist.get_world_size(group)
    batch, seqlen, heads, *rest = x.shape
    parts = x.reshape(batch, seqlen, world_size, heads // world_size, *rest).movedim(2, 0)
    return _all_to_all(parts, group).movedim(0, 1).flatten(1, 2)


def _scatter_sequence(x: Tensor, group: dist.ProcessGroup | None) -> Tensor:
    """The inverse of _gather_sequence."""
    world_size = dist.get_world_size(group)
    batch, seqlen, heads, *rest = x.shape
    parts = x.reshape(batch, world_size, seqlen // world_size, heads, *rest).movedim(1, 0)
    return _all_to_all(parts, group).movedim(0, 2).flatten(2, 3)


class _SequenceExchange(torch.autograd.Function):
    """_gather_sequence (to_heads) or _scatter_sequence, whose gradients are each other's."""

    @staticmethod
    def forward(ctx, x, group, to_heads):
        ctx.group, ctx.to_heads = group, to_heads
        return (_gather_sequence if to_heads else _scatter_sequence)(x, group)

    @staticmethod
    def backward(ctx, grad):
        return (_scatter_sequence if ctx.to_heads else _gather_sequence)(grad, ctx.group), None, None


def _sequence_to_heads(x: Tensor, group: dist.ProcessGroup | None, layout: str) -> Tensor:
    """This rank's heads over the whole sequence, in sequence order."""
    return _to_sequence_order(_SequenceExchange.apply(x, group, True), dist.get_world_size(group), layout)


def _heads_to_sequence(x: Tensor, group: dist.ProcessGroup | None, layout: str) -> Tensor:
    """The inverse of _sequence_to_heads: every head of this rank's shard."""
    return _SequenceExchange.apply(_to_rank_order(x, dist.get_world_size(group), layout), group, False)
