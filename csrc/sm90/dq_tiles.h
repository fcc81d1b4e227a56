// The d256 backward's dq_accum (kernel_traits.h: BwdSliceTraits): dQ added in
// query tiles of 64 rows x 256 columns, each tile in the order of the main
// kernel's accumulator fragments, so that a warp's add of 16 bytes a lane
// covers 512 contiguous bytes (bwd_kernel.cuh: bwd_slice_consumer) where q's
// layout would scatter it over 16 rows; the conversion to dQ
// (bwd_kernel.cuh: bwd_convert_dq_tiles_kernel) reads the tiles back in that order.
//   Tile (tile row T, head h) starts at float (T * H + h) * kDqTileFloats. A
//   padded batch's sequence b takes tile rows b * m_blocks .. (m_blocks: its
//   query tiles); a packed one's sequence b, q_start / 64 + b .. (its first
//   row's tile, moved on by one tile per sequence before it: the sequences'
//   tiles never overlap, and their rows past the sequence belong to no one).
//   Inside a tile, float4 number ((c * 4 + w) * 8 + j) * 32 + l holds lane
//   l's n8 block j of warp w's rows for column block c: rows 16 w + l / 4 and
//   16 w + l / 4 + 8, columns 64 c + 8 j + 2 (l % 4) + {0, 1}, in the order
//   (row, col), (row, col + 1), (row + 8, col), (row + 8, col + 1).
#pragma once

#include <cstdint>

#include "common/flash.h"

namespace flash::sm90 {

constexpr int kDqTileRows = 64;
constexpr int kDqTileCols = 256;
constexpr int kDqTileFloats = kDqTileRows * kDqTileCols;

__host__ __device__ __forceinline__ int64_t dq_query_tiles(int64_t rows) {
    return (rows + kDqTileRows - 1) / kDqTileRows;
}

// The tile row of query tile m_block of sequence `batch` (whose first packed row is q_start).
__host__ __device__ __forceinline__ int64_t dq_tile_row(const BwdParams& params, int batch, int q_start, int m_block) {
    const int64_t first = params.cu_seqlens_q == nullptr ? batch * dq_query_tiles(params.seqlen_q)
                                                         : q_start / kDqTileRows + batch;
    return first + m_block;
}

// The float4 of a tile that lane `lane` of warp `warp` (of the four whose 16
// rows each make the tile's 64) adds for its n8 block j of column block
// `col_block` (8 n8 blocks of 64 columns each, four blocks).
__host__ __device__ constexpr int dq_tile_slot(int col_block, int warp, int j, int lane) {
    return ((col_block * 4 + warp) * 8 + j) * 32 + lane;
}

// What a float4 holds (dq_tile_slot's inverse): rows `row` and row + 8 of the
// tile, columns `col` and col + 1, as the accumulator fragment of m64nNk16
// places lane l of warp w: rows 16 w + l / 4 (+ 8), columns 8 j + 2 (l % 4) (+ 1).
struct DqSlotPlace {
    int row, col;
};
__host__ __device__ constexpr DqSlotPlace dq_slot_place(int slot) {
    const int lane = slot % 32, j = slot / 32 % 8, warp = slot / 256 % 4, col_block = slot / 1024;
    return {warp * 16 + lane / 4, col_block * 64 + j * 8 + (lane % 4) * 2};
}

// dq_accum's length in floats: every tile row any sequence's tiles reach.
__host__ __device__ __forceinline__ int64_t dq_tile_floats(const BwdParams& params) {
    const int64_t tile_rows = params.cu_seqlens_q == nullptr
                                  ? params.batch * dq_query_tiles(params.seqlen_q)
                                  : params.total_q / kDqTileRows + params.batch + 1;
    return tile_rows * params.num_heads * kDqTileFloats;
}

}  // namespace flash::sm90
