// The order in which the sm90 forward's persistent blocks take their query
// tiles when they draw them (a causal mask or a window: fwd_kernel.cuh,
// WorkQueue), and the order of the deterministic backward's grid (at the end).
//
// (The backward's default grids have an order of their own: backward_grid
// below; bwd_launch.cuh says why.)
//
// A call's tiles are (tile, head) pairs: `tiles` query tiles for each of
// `heads` heads (a head here is a (batch, head) pair). Under a causal mask the
// tiles of a head differ in work by up to the sequence's length over the tile's.
// Taken head after head, longest first within each, the last heads' long tiles
// start late and end after the other SMs have run dry. Taken longest first
// over all heads, the last tiles are the shortest, but the blocks at work at
// one time then read as many heads' K and V as there are SMs, far more than L2
// holds. So heads are taken in sections of `section` heads, as many as fit in
// half of L2, and within a section tile after tile (the section's heads' tile
// 0, then their tile 1, ...), tile 0 being the longest: each section ends on
// short tiles, and its keys stay in L2 while its tiles run. A section of one
// head is the order head after head, which the forward keeps where every tile
// takes as long as the others.
#pragma once

#include <cstdint>

namespace flash::sm90 {

struct TileOfHead {
    int tile, head;
};

// The t-th tile taken: its tile index (0 first) and head.
__host__ __device__ __forceinline__ TileOfHead tile_in_order(int t, int tiles, int heads, int section) {
    const int section_tiles = section * tiles;
    const int s = t / section_tiles;
    const int r = t - s * section_tiles;
    const int heads_here = heads - s * section < section ? heads - s * section : section;  // the last may be short
    return {r / heads_here, s * section + r % heads_here};
}

// The heads of a section: as many as half of L2 holds, given what each of a
// head's tiles reads again (its K and V), at least one and at most `heads`.
inline int heads_per_section(int64_t bytes_per_head, int64_t l2_bytes, int heads) {
    const int most = heads > 0 ? heads : 1;
    if (bytes_per_head <= 0) return most;
    const int64_t fit = l2_bytes / 2 / bytes_per_head;
    return static_cast<int>(fit < 1 ? 1 : fit > most ? most : fit);
}

// The deterministic backward's grid (bwd_kernel.cuh: BwdWork, bwd_dq_writer).
// A (KV head, batch) pair's key tiles add into a query tile's dQ from the
// last key tile to the first, and a block waits only for the key tiles of its
// pair that come before it in that order; those must have smaller linear
// block indices (x fastest, then y, then z), the order in which CUDA starts a
// grid's blocks in practice, or the block waited for might never start. The
// grid takes each pair's tiles in that order, in runs of `run` tiles across
// the pairs: run 0 of every pair (pair 0's tiles, then pair 1's, ...), then
// run 1 of every pair, and so on; the last run may be shorter.
struct KeyTileOfPair {
    int tile, head, batch;
};

// The block of linear index `block` in a grid of `tiles` x `heads` x
// `batches`: its key tile, KV head and batch. 64-bit: a varlen grid spans the
// longest sequence's key tiles for every sequence, which can pass 2^32 blocks.
__host__ __device__ __forceinline__ KeyTileOfPair deterministic_tile(int64_t block, int64_t tiles, int64_t heads,
                                                                      int64_t batches, int run) {
    const int64_t run_blocks = heads * batches * run;
    const int64_t run_index = block / run_blocks;
    const int64_t in_run = block - run_index * run_blocks;
    const int64_t left = tiles - run_index * run;
    const int64_t run_tiles = run < left ? run : left;
    const int64_t pair = in_run / run_tiles;
    return {static_cast<int>(tiles - 1 - (run_index * run + in_run % run_tiles)), static_cast<int>(pair % heads),
            static_cast<int>(pair / heads)};
}

// The run: under a causal mask or a window (`masked`) a key tile reaches its
// query tiles after fewer steps the later it is, so the order of adds chains
// nothing and a pair's tiles run in a row (one run), sharing their Q and dO
// through L2. Without one, every key tile of a pair reaches a query tile at
// the same step and the last one's adds wait for all before it: a run of r
// tiles costs about r - 1 adds' waits on a block's steps, which grow with the
// sequence as the tiles do, so a run of a quarter of the tiles keeps that
// share the same at every length (rounds 23-24: at 1k to 16k a quarter was
// best or within 1-2% of it; benchmarks/NOTES.md). At least 1 for tiles >= 1.
inline int deterministic_run(int tiles, bool masked) { return masked ? tiles : (tiles + 3) / 4; }

// The tail of a grid whose items all take as long (the backward without a
// mask). Its blocks run in waves of one block an SM, and where the items do
// not fill the last wave, the SMs the wave leaves empty idle while it runs:
// up to a block's time in every call (round 38: at d128 8k, 2048 blocks on
// 132 SMs, half a wave of 16, 3%). So the items of that last wave run in
// `parts` parts each, a block a part that walks its share of the item's
// steps, and the parts of the wave fill it by parts where they fit: `rem`
// items in p parts take ceil(rem p / sms) / p of a wave. The parts of an
// item hand their fp32 sums on in order (parts.cuh): part k adds part k - 1's
// to its own and hands the total on, the last part writes the item's results.
// The order of the adds is fixed by the call's shape and the SM count, so a
// call's results are the same on every run of the same GPU.
struct TailSplit {
    int64_t first;  // the first item run in parts
    int parts;      // parts per item from `first` on (1: none)
};

// `items` of the grid, behind `before` blocks of the same length that the
// kernel before it leaves to its last waves (d256: the dK/dV kernel's, which
// this grid's blocks overlap), on `sms` SMs a block each. The parts, at most
// kMaxTailParts, that make the last wave shortest, each part counted at a
// 50th of a wave more (its own prologue and hand-on); 1 where the wave is
// full or the tail reaches into the kernel before.
constexpr int kMaxTailParts = 4;
inline TailSplit tail_split(int64_t items, int64_t before, int sms) {
    const int64_t rem = sms > 0 ? (before + items) % sms : 0;
    TailSplit split{items, 1};
    if (rem == 0 || rem > items) return split;
    double best = 1.0;
    for (int p = 2; p <= kMaxTailParts; ++p) {
        const double wave = static_cast<double>((rem * p + sms - 1) / sms) / p + 0.02 * p;
        if (wave < best) best = wave, split = {items - rem, p};
    }
    return split;
}

// The blocks of a grid of `items` with its tail split.
__host__ __device__ __forceinline__ int64_t tail_blocks(int64_t items, const TailSplit& split) {
    return split.first + (items - split.first) * split.parts;
}

// The item of block `block`, and its part (0 .. parts - 1 of `parts`; 0 of 1
// before the tail) and slot (the tail's item index: where its sums go).
struct PartOfBlock {
    int item, part, parts, slot;
};
__host__ __device__ __forceinline__ PartOfBlock part_of_block(int block, int64_t first, int parts) {
    if (block < first) return {block, 0, 1, 0};
    const int in_tail = block - static_cast<int>(first);
    const int slot = in_tail / parts;
    return {static_cast<int>(first) + slot, in_tail - slot * parts, parts, slot};
}

// A part's share of an item's `steps`: [begin, end).
struct StepsOfPart {
    int begin, end;
};
__host__ __device__ __forceinline__ StepsOfPart steps_of_part(int steps, int part, int parts) {
    return {static_cast<int>(int64_t{steps} * part / parts), static_cast<int>(int64_t{steps} * (part + 1) / parts)};
}

// The backward's default grids (not the deterministic main kernel's): one
// block per tile of each head and batch (per part, in the tail), the main
// kernel's key tiles or d256's dQ kernel's query tiles. CUDA starts a grid's
// blocks x fastest, then y, then z. Without a mask one dimension: items in the
// order (tile, head, batch), a pair's tiles together, then the tail's parts,
// an item's together. Under a mask (Is_masked) (batch, tile, head): a head's
// tiles in order, each for all batches together (bwd_launch.cuh says why),
// and no split tail (its last blocks are short ones already).
template <bool Is_masked>
inline dim3 backward_grid(int tiles, int heads, int batches, const TailSplit& split) {
    if constexpr (Is_masked) return dim3(batches, tiles, heads);
    const int64_t items = int64_t{tiles} * heads * batches;
    return dim3(static_cast<unsigned>(tail_blocks(items, split)));
}
// The most blocks the one dimension holds.
constexpr int64_t kMaxGridX = 2147483647;

// A block's place in backward_grid<Is_masked>: its tile, head and batch, and
// its part of them. kLastFirst: the grid takes the tiles from the last to the
// first. `tiles` and `heads` are the grid's (unmasked: not in its shape), and
// `line_block` the block's index in the unmasked grid (blockIdx.x).
struct TileOfGrid {
    int tile, head, batch;
    int part, parts, slot;
};
template <bool Is_masked, bool kLastFirst = false>
__device__ __forceinline__ TileOfGrid backward_grid_tile(int tiles, int heads, int64_t tail_first, int tail_parts,
                                                         int line_block) {
    TileOfGrid block;
    if constexpr (Is_masked) {
        block.tile = kLastFirst ? gridDim.y - 1 - blockIdx.y : blockIdx.y;
        block.head = blockIdx.z;
        block.batch = blockIdx.x;
        block.part = block.slot = 0;
        block.parts = 1;
    } else {
        const PartOfBlock p = part_of_block(line_block, tail_first, tail_parts);
        const int pair = p.item / tiles;
        const int tile = p.item - pair * tiles;
        block.tile = kLastFirst ? tiles - 1 - tile : tile;
        block.batch = pair / heads;
        block.head = pair - block.batch * heads;
        block.part = p.part;
        block.parts = p.parts;
        block.slot = p.slot;
    }
    return block;
}

// Under a mask the backward's default grids hold their tiles in y, which
// takes at most 65535 blocks: dispatch.cu sends longer sequences to the sm80
// family.
constexpr int kMaxGridY = 65535;

}  // namespace flash::sm90
