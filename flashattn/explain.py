"""How FlashAttention gets exact attention without the N x N score matrix, on numbers you can check.

Run ``python -m flashattn.explain``. It walks one query row through the key
tiles of a small example, printing the running max m, the running sum l and
the rescaling factor at each tile, checks the result against softmax computed
the ordinary way, and prints what the score matrix would cost at 128k tokens
next to what the tiled computation keeps. This file needs only numpy; its
output is the same on every run.
"""

from dataclasses import dataclass

import numpy as np

SEED = 10
SEQLEN = 12  # keys in the example
HEAD_DIM = 4
TILE = 4  # keys per tile

MEMORY_SEQLEN = 128 * 1024
MEMORY_HEAD_DIM = 128
# The forward kernel's tile of scores at head dim 128 (csrc/sm80/kernel_traits.h):
# 128 query rows x 64 keys, in registers.
KERNEL_BLOCK_M = 128
KERNEL_BLOCK_N = 64
FP16_BYTES = 2
FP32_BYTES = 4


@dataclass(frozen=True)
class TileStep:
    """The state of one query row after one tile of keys has been folded in."""

    first_key: int
    last_key: int
    tile_max: float  # max of the tile's scores
    running_max: float  # m: max of every score seen so far
    rescale: float  # exp(m_before - m): what the previous l and o are multiplied by
    tile_sum: float  # sum of exp(score - m) over the tile's keys
    running_sum: float  # l: sum of exp(score - m) over every key seen so far


def example(seed: int = SEED) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A query row q (HEAD_DIM,) and keys and values K, V (SEQLEN, HEAD_DIM), standard normal, float64."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(HEAD_DIM)
    return q, rng.standard_normal((SEQLEN, HEAD_DIM)), rng.standard_normal((SEQLEN, HEAD_DIM))


def softmax_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """softmax(q K^T / sqrt(d)) V the ordinary way: every score first, then the softmax."""
    scores = k @ q / np.sqrt(q.shape[-1])
    probs = np.exp(scores - scores.max())
    return probs / probs.sum() @ v


def tiled_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, tile: int = TILE) -> tuple[np.ndarray, list[TileStep]]:
    """The same row, one tile of keys at a time (FlashAttention's online softmax); returns it and each tile's state.

    Only m, l and the unnormalised output o live across tiles. When a tile
    raises the max, what l and o summed so far was weighted by exp(-m_before)
    and must now be weighted by exp(-m): one multiplication by exp(m_before - m)
    fixes both. o is divided by l once, at the end.
    """
    running_max, running_sum = -np.inf, 0.0
    acc = np.zeros(v.shape[-1])  # o, unnormalised
    steps = []
    for first in range(0, len(k), tile):
        scores = k[first : first + tile] @ q / np.sqrt(q.shape[-1])
        new_max = max(running_max, scores.max())
        rescale = np.exp(running_max - new_max)  # 0 at the first tile: nothing to rescale
        probs = np.exp(scores - new_max)
        running_sum = rescale * running_sum + probs.sum()
        acc = rescale * acc + probs @ v[first : first + tile]
        running_max = new_max
        last = first + len(scores) - 1
        steps.append(TileStep(first, last, scores.max(), running_max, rescale, probs.sum(), running_sum))
    return acc / running_sum, steps


@dataclass(frozen=True)
class MemoryItem:
    label: str
    num_bytes: int


def memory_items(
    seqlen: int = MEMORY_SEQLEN,
    head_dim: int = MEMORY_HEAD_DIM,
    block_m: int = KERNEL_BLOCK_M,
    block_n: int = KERNEL_BLOCK_N,
) -> tuple[list[MemoryItem], list[MemoryItem]]:
    """Bytes per (batch, head): the N x N score matrix in fp16 and fp32; what the tiled version keeps.

    Q, K and V are left out: every method reads them.
    """
    scores = [
        MemoryItem("fp16", seqlen * seqlen * FP16_BYTES),
        MemoryItem("fp32", seqlen * seqlen * FP32_BYTES),
    ]
    tiled = [
        MemoryItem(f"O, the output ({seqlen:,} x {head_dim}, fp16)", seqlen * head_dim * FP16_BYTES),
        MemoryItem(f"running max m and sum l (2 x {seqlen:,}, fp32)", 2 * seqlen * FP32_BYTES),
        MemoryItem(f"one tile of scores ({block_m} x {block_n}, fp32, on chip)", block_m * block_n * FP32_BYTES),
    ]
    return scores, tiled


def format_bytes(num_bytes: float) -> str:
    """1024-based: format_bytes(2**35) == '32.0 GiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if num_bytes < 1024:
            return f"{num_bytes:.1f} {unit}"
        num_bytes /= 1024
    return f"{num_bytes:.1f} TiB"


def report(seed: int = SEED) -> str:
    """Everything ``python -m flashattn.explain`` prints."""
    q, k, v = example(seed)
    out, steps = tiled_attention(q, k, v)
    expected = softmax_attention(q, k, v)
    lines = [
        f"One query row q ({HEAD_DIM} numbers) against {SEQLEN} keys, {TILE} keys per tile (seed {seed}).",
        "For each tile of keys K_t and values V_t, with m = -inf, l = 0, o = 0 to start:",
        "  s = K_t q / sqrt(d)               the tile's scores",
        "  m_new = max(m, max(s))            running max",
        "  r = exp(m - m_new)                rescaling factor for what was summed so far",
        "  l = r * l + sum(exp(s - m_new))   running sum",
        "  o = r * o + exp(s - m_new) V_t    unnormalised output",
        "",
        "tile  keys   tile max  running max m  rescale r  tile sum  running sum l",
    ]
    for index, step in enumerate(steps, start=1):
        if index == 1:
            note = "first tile: nothing to rescale"
        elif step.rescale < 1:
            note = "max rose: old l and o shrink"
        else:
            note = "max unchanged"
        keys = f"{step.first_key}-{step.last_key}"
        lines.append(
            f"{index:>4}  {keys:<5}  {step.tile_max:>8.4f}  {step.running_max:>13.4f}  {step.rescale:>9.4f}  "
            f"{step.tile_sum:>8.4f}  {step.running_sum:>13.4f}   {note}"
        )
    lines += [
        "",
        f"{'tiled: o / l':<36} = {_format_vector(out)}",
        f"{'ordinary: softmax(q K^T / sqrt(d)) V':<36} = {_format_vector(expected)}",
        f"{'max abs difference':<36} = {_format_difference(np.abs(out - expected).max())}",
        "",
    ]
    scores, tiled = memory_items()
    kept = sum(item.num_bytes for item in tiled)
    lines += [
        f"Memory per (batch, head) at N = {MEMORY_SEQLEN:,} tokens (128k), head dim {MEMORY_HEAD_DIM}:",
        "  the N x N score matrix: " + ", ".join(f"{format_bytes(i.num_bytes)} in {i.label}" for i in scores),
        "  what the tiled version keeps besides Q, K, V:",
        *(f"    {item.label:<48} {format_bytes(item.num_bytes):>9}" for item in tiled),
        f"    {'total':<48} {format_bytes(kept):>9}",
        f"  The fp16 scores alone are {scores[0].num_bytes / kept:,.0f}x that total; they grow as N^2, the rest as N.",
    ]
    return "\n".join(lines)


def _format_difference(diff: float) -> str:
    """The difference as a bound when it is float64 rounding (its last bits vary with the
    numpy build), else the number itself."""
    return "below 1e-15 (float64 rounding)" if diff < 1e-15 else f"{diff:.1e}"


def _format_vector(x: np.ndarray) -> str:
    return "[" + ", ".join(f"{value:7.4f}" for value in x) + "]"


def main() -> None:
    print(report())


if __name__ == "__main__":
    main()
