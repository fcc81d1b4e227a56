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

// The backward's default grids (not the deterministic main kernel's): one
// block per tile of each head and batch, the main kernel's key tiles or d256's
// dQ kernel's query tiles. CUDA starts a grid's blocks x fastest, then y, then
// z. Without a mask (tile, head, batch): a pair's tiles together. Under a mask
// (Is_masked) (batch, tile, head): a head's tiles in order, each for all
// batches together (bwd_launch.cuh says why).
template <bool Is_masked>
inline dim3 backward_grid(int tiles, int heads, int batches) {
    return Is_masked ? dim3(batches, tiles, heads) : dim3(tiles, heads, batches);
}

// A block's place in backward_grid<Is_masked>: its tile, head and batch.
// kLastFirst: the grid takes the tiles from the last to the first.
struct TileOfGrid {
    int tile, head, batch;
};
template <bool Is_masked, bool kLastFirst = false>
__device__ __forceinline__ TileOfGrid backward_grid_tile() {
    TileOfGrid block;
    if constexpr (Is_masked) {
        block.tile = kLastFirst ? gridDim.y - 1 - blockIdx.y : blockIdx.y;
        block.head = blockIdx.z;
        block.batch = blockIdx.x;
    } else {
        block.tile = kLastFirst ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
        block.head = blockIdx.y;
        block.batch = blockIdx.z;
    }
    return block;
}

// Under a mask the backward's default grids hold their tiles in y, which
// takes at most 65535 blocks: dispatch.cu sends longer sequences to the sm80
// family.
constexpr int kMaxGridY = 65535;

}  // namespace flash::sm90
