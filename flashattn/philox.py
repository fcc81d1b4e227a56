"""Dropout's keep mask: Philox4x32-10 in vectorised PyTorch, bit for bit what csrc/common/philox.cuh draws.

Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
SC'11) maps a 128-bit counter and a 64-bit key to four 32-bit words. It is
counter-based: the draw of any (batch, head, query, key) is a pure function of
its coordinates, so the CPU implementation, the kernels and the tests all
compute the same mask without sharing state, and the backward redraws the
forward's mask instead of storing it.

The contract (shared with the kernels):
    key = (low32(seed), high32(seed)), seed = rng_state[0] and offset = rng_state[1] as uint64;
    counter = (j >> 1, i >> 1, b * H + h, low32(offset)) for query i, key j of query head h of
    sequence b (H query heads); one draw covers the 2 x 2 block of (query pair, key pair);
    (i, j) takes the low 16 bits of word (i & 1) * 2 + (j & 1);
    keep_ij = value >= floor(dropout_p * 65536).

torch has no uint32 arithmetic that wraps, so 32-bit words are held in int64
tensors (always in [0, 2^32)); a 32 x 32-bit product, which could overflow
int64, is split into 16-bit halves (see _mulhilo32). Everything stays on the
device of rng_state, with no host round trip.
"""

import math

import torch
from torch import Tensor

__all__ = ["dropout_keep_mask", "dropout_threshold", "philox4x32_10"]

ROUNDS = 10
# Round multipliers and the Weyl increments of the key schedule (Random123's constants).
_MUL_0 = 0xD2511F53
_MUL_1 = 0xCD9E8D57
_WEYL_0 = 0x9E3779B9
_WEYL_1 = 0xBB67AE85
_MASK_32 = 0xFFFFFFFF
_MASK_16 = 0xFFFF
# A draw's 16-bit value is compared with floor(dropout_p * 2^16).
_DRAW_RANGE = 1 << 16


def _mulhilo32(multiplier: int, x: Tensor) -> tuple[Tensor, Tensor]:
    """(high, low) 32-bit words of multiplier * x, multiplier < 2^32 and x in [0, 2^32) in int64.

    The 64-bit product may not fit int64, so x is split into 16-bit halves:
    multiplier * x = (multiplier * x_hi) << 16 + multiplier * x_lo, each part below 2^48.
    """
    part_hi = multiplier * (x >> 16)
    low_sum = multiplier * (x & _MASK_16) + ((part_hi & _MASK_16) << 16)  # < 2^49
    return (part_hi >> 16) + (low_sum >> 32), low_sum & _MASK_32


def philox4x32_10(
    counter: tuple[Tensor, Tensor, Tensor, Tensor], key: tuple[Tensor, Tensor]
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The four output words of Philox4x32-10 for counter words (c0, c1, c2, c3) and key (k0, k1).

    Every word is an int64 tensor holding a value in [0, 2^32); the words broadcast
    against each other, and so does the output.
    """
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(ROUNDS):
        hi0, lo0 = _mulhilo32(_MUL_0, c0)
        hi1, lo1 = _mulhilo32(_MUL_1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + _WEYL_0) & _MASK_32
        k1 = (k1 + _WEYL_1) & _MASK_32
    return c0, c1, c2, c3


def dropout_threshold(dropout_p: float) -> int:
    """The 16-bit draws below this are dropped: floor(dropout_p * 65536), as the binding computes it."""
    return math.floor(dropout_p * _DRAW_RANGE)


def dropout_keep_mask(
    rng_state: Tensor,
    dropout_p: float,
    rows: range,
    cols: range,
    num_heads: int,
    batch: range = range(1),
    heads: range | None = None,
) -> Tensor:
    """keep_ij for queries `rows` and keys `cols` of the sequences `batch` and query heads `heads`.

    Args:
        rng_state: int64 (2,): seed and offset, on the device the mask is made on.
        dropout_p: the probability of dropping; 0 keeps everything.
        rows, cols: query and key positions counted from the sequence's start (step 1);
            any sub-range, so a blockwise caller asks for one block at a time.
        num_heads: H, the number of query heads of the call (the counter's b * H + h).
        batch: the sequence (batch) indices b.
        heads: the query heads h; default all of them.

    Returns:
        bool [len(batch), len(heads), len(rows), len(cols)] on rng_state's device, True where kept.
    """
    heads = range(num_heads) if heads is None else heads
    device = rng_state.device
    shape = (len(batch), len(heads), len(rows), len(cols))
    if min(shape) == 0:
        return torch.ones(shape, dtype=torch.bool, device=device)
    threshold = dropout_threshold(dropout_p)
    seed, offset = rng_state.to(torch.int64).unbind()
    # int64 & and >> see the two's complement bits, which are the uint64's.
    key = (seed & _MASK_32, (seed >> 32) & _MASK_32)
    # One draw per (query pair, key pair): the pairs that hold the first and last row and column.
    row_pairs = torch.arange(rows.start >> 1, ((rows.stop - 1) >> 1) + 1, device=device)
    col_pairs = torch.arange(cols.start >> 1, ((cols.stop - 1) >> 1) + 1, device=device)
    batch_ids = torch.arange(batch.start, batch.stop, device=device)
    head_ids = torch.arange(heads.start, heads.stop, device=device)
    stream = (batch_ids[:, None] * num_heads + head_ids[None, :]) & _MASK_32  # [b, h]
    counter = (
        col_pairs[None, None, None, :],  # [1, 1, 1, C/2]
        row_pairs[None, None, :, None],  # [1, 1, R/2, 1]
        stream[:, :, None, None],  # [b, h, 1, 1]
        offset & _MASK_32,
    )
    words = philox4x32_10(counter, key)
    # Word (i & 1) * 2 + (j & 1) of pair (i >> 1, j >> 1): stacked [b, h, R/2, C/2, 2 (i & 1), 2 (j & 1)],
    # then interleaved into [b, h, R, C] and cut to the rows and columns asked for.
    full_shape = torch.broadcast_shapes(*(w.shape for w in words))
    grid = torch.stack([w.expand(full_shape) for w in words], dim=-1).unflatten(-1, (2, 2))
    grid = grid.permute(0, 1, 2, 4, 3, 5).flatten(4, 5).flatten(2, 3)
    row_skip, col_skip = rows.start & 1, cols.start & 1
    values = grid[:, :, row_skip : row_skip + len(rows), col_skip : col_skip + len(cols)] & _MASK_16
    return values >= threshold
