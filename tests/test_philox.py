"""Dropout's random numbers: flashattn.philox against Random123's known answers and a scalar
restatement of the contract, its block structure, its statistics, and the CUDA kernels' draws.

The contract (shared with csrc/common/philox.cuh): seed and offset from rng_state as uint64; key
(low32(seed), high32(seed)); counter (j >> 1, i >> 1, b * H + h, low32(offset)); the value of
(i, j) is the low 16 bits of word (i & 1) * 2 + (j & 1); kept iff value >= floor(p * 65536).
"""

import itertools
import math

import pytest
import torch
from helpers import DEVICES, case_seed, random_qkv, run_forward

from flashattn.interface import _new_rng_state
from flashattn.philox import dropout_keep_mask, dropout_threshold, philox4x32_10

MASK_32 = 0xFFFFFFFF

# Random123's known-answer tests of philox4x32_10: (counter, key) -> output words.
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((MASK_32,) * 4, (MASK_32,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
]


@pytest.mark.parametrize("counter, key, expected", KNOWN_ANSWERS, ids=["zeros", "ones"])
def test_known_answers(counter, key, expected):
    words = philox4x32_10(tuple(map(torch.tensor, counter)), tuple(map(torch.tensor, key)))
    assert tuple(int(w) for w in words) == expected


def _scalar_philox(counter: list[int], key: list[int]) -> list[int]:
    """Philox4x32-10 on Python ints, straight from the definition."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & MASK_32, (p0 >> 32) ^ c3 ^ k1, p0 & MASK_32
        k0, k1 = (k0 + 0x9E3779B9) & MASK_32, (k1 + 0xBB67AE85) & MASK_32
    return [c0, c1, c2, c3]


def _scalar_keep(seed: int, offset: int, b: int, h: int, i: int, j: int, num_heads: int, p: float) -> bool:
    seed, offset = seed % 2**64, offset % 2**64  # rng_state's int64 read as uint64
    words = _scalar_philox([j >> 1, i >> 1, b * num_heads + h, offset & MASK_32], [seed & MASK_32, seed >> 32])
    return (words[(i & 1) * 2 + (j & 1)] & 0xFFFF) >= math.floor(p * 65536)


@pytest.mark.parametrize(
    "seed, offset",
    [(0, 0), (12345, 678), (2**62 - 1, 2**40 + 3), (-1, -2), (-(2**63), 2**63 - 1)],
    ids=["zero", "small", "high-words", "negative", "extremes"],
)
def test_mask_matches_the_scalar_contract(seed, offset):
    """Every element of a mask over odd ranges (rows and keys starting at odd positions, several
    sequences and heads) against the contract computed one element at a time; int64 seeds whose
    high bit is set are read as uint64."""
    rng_state = torch.tensor([seed, offset], dtype=torch.int64)
    batch, heads, rows, cols, num_heads, p = range(1, 3), range(1, 4), range(3, 10), range(5, 12), 5, 0.3
    mask = dropout_keep_mask(rng_state, p, rows, cols, num_heads, batch, heads)
    assert mask.shape == (2, 3, 7, 7) and mask.dtype == torch.bool
    for (bi, b), (hi, h), (ii, i), (ji, j) in itertools.product(*(enumerate(r) for r in (batch, heads, rows, cols))):
        assert bool(mask[bi, hi, ii, ji]) == _scalar_keep(seed, offset, b, h, i, j, num_heads, p), (b, h, i, j)


def test_blocks_are_slices_of_the_whole():
    """A block of any origin (odd or even) is the slice of the whole mask: the CPU path draws
    per block, the return_attn_probs path all at once, and they must agree."""
    rng_state = torch.tensor([987654321987, 5], dtype=torch.int64)
    whole = dropout_keep_mask(rng_state, 0.17, range(0, 203), range(0, 113), 4, range(3))
    for rows, cols, batch, heads in [
        (range(0, 64), range(0, 32), range(0, 3), range(0, 4)),
        (range(1, 130), range(7, 113), range(1, 3), range(2, 3)),
        (range(202, 203), range(112, 113), range(2, 3), range(3, 4)),
        (range(64, 128), range(1, 2), range(0, 1), range(0, 4)),
    ]:
        block = dropout_keep_mask(rng_state, 0.17, rows, cols, 4, batch, heads)
        assert torch.equal(block, whole[batch.start : batch.stop, heads.start : heads.stop, rows.start : rows.stop,
                                        cols.start : cols.stop])  # fmt: skip


def test_empty_ranges():
    rng_state = torch.tensor([1, 2])
    assert dropout_keep_mask(rng_state, 0.5, range(0), range(5), 2).shape == (1, 2, 0, 5)
    assert dropout_keep_mask(rng_state, 0.5, range(4), range(3, 3), 2, range(2)).shape == (2, 2, 4, 0)


@pytest.mark.parametrize("p", [0.0, 1e-6, 0.1, 0.5, 0.9])
def test_dropped_fraction_and_threshold(p):
    """floor(p * 65536) of the 65536 16-bit values are dropped: the fraction is p to within
    sampling noise (2**20 draws: standard deviation below 5e-4); p below 1/65536 drops nothing."""
    rng_state = torch.tensor([case_seed("fraction", p), 0])
    mask = dropout_keep_mask(rng_state, p, range(512), range(512), 4)
    dropped = 1 - mask.double().mean().item()
    assert dropout_threshold(p) == math.floor(p * 65536)
    if dropout_threshold(p) == 0:
        assert dropped == 0.0
    else:
        assert abs(dropped - p) < 0.003, dropped


def test_streams_differ():
    """Other seeds, offsets, sequences and heads give other masks (independent streams)."""
    base = dropout_keep_mask(torch.tensor([7, 9]), 0.5, range(64), range(64), 2, range(2))
    other_seed = dropout_keep_mask(torch.tensor([8, 9]), 0.5, range(64), range(64), 2, range(2))
    other_offset = dropout_keep_mask(torch.tensor([7, 10]), 0.5, range(64), range(64), 2, range(2))
    for other in (other_seed, other_offset):
        assert (base != other).double().mean() > 0.4
    assert (base[0, 0] != base[0, 1]).double().mean() > 0.4
    assert (base[0, 0] != base[1, 0]).double().mean() > 0.4


def test_rng_state_follows_torch_seed():
    """The functions' rng_state: torch.randint(0, 2**62, (2,)) from the default generator."""
    torch.manual_seed(1234)
    first = _new_rng_state(torch.device("cpu"))
    torch.manual_seed(1234)
    expected = torch.randint(0, 2**62, (2,), dtype=torch.int64)
    assert torch.equal(first, expected) and first.dtype == torch.int64 and first.shape == (2,)
    assert not torch.equal(_new_rng_state(torch.device("cpu")), first)


@pytest.mark.gpu
def test_cuda_mask_is_the_cpu_mask():
    """The torch implementation gives the same bits on CUDA as on CPU."""
    rng_state = torch.tensor([2**61 + 12345, 2**33 + 7])
    cpu = dropout_keep_mask(rng_state, 0.3, range(5, 300), range(3, 260), 6, range(1, 3))
    cuda = dropout_keep_mask(rng_state.cuda(), 0.3, range(5, 300), range(3, 260), 6, range(1, 3))
    assert cuda.is_cuda and torch.equal(cuda.cpu(), cpu)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seqlens", [(1, 1), (3, 113), (130, 67), (203, 203)], ids=lambda s: f"q{s[0]}k{s[1]}")
def test_kernels_drop_what_philox_py_drops(device, seqlens):
    """The kernels' dropout mask is flashattn.philox's, bit for bit: with v the identity (one
    value column per key, Sk <= D) each output column j is P_ij * keep_ij / (1 - p), so the
    zeros of out are exactly the dropped (query, key) pairs. Odd lengths and a query count
    other than the key count put pairs across tile edges."""
    seqlen_q, seqlen_k = seqlens
    head_dim = 256 if seqlen_k > 128 else 128
    seed = case_seed("kernel mask", device, seqlens)
    q, k, _ = random_qkv(2, seqlen_q, seqlen_k, 4, 2, head_dim, torch.float16, device, seed)
    q, k = q * 0.1, k * 0.1  # flat probabilities: no kept one underflows to 0 in fp16
    eye = torch.eye(seqlen_k, head_dim, dtype=torch.float16, device=device)
    v = eye[None, :, None].expand(2, seqlen_k, 2, head_dim).contiguous()
    rng_state = torch.tensor([seed * 7919, seed], dtype=torch.int64, device=device)
    out, _ = run_forward(q, k, v, 0.5, False, dropout_p=0.4, rng_state=rng_state)
    kept = out[..., :seqlen_k].transpose(1, 2) != 0  # [B, H, Sq, Sk]
    expected = dropout_keep_mask(rng_state, 0.4, range(seqlen_q), range(seqlen_k), 4, range(2))
    assert torch.equal(kept, expected)
