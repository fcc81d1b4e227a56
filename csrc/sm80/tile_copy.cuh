// Moving tiles between global and swizzled shared memory.
#pragma once

#include <cstdint>

#include "sm80/kernel_traits.h"
#include "common/ptx.cuh"
#include "sm80/ptx.cuh"

namespace flash::sm80 {

// A thread's share of copying a tile between global and shared memory. Within
// each column block, consecutive threads take consecutive 16-byte chunks of a
// block row (coalesced 64/128-byte runs) and a thread keeps its chunk for every
// pass, so all addresses are two per-thread bases plus compile-time offsets.
template <typename Tile, int kNThreads>
struct TileCopy {
    static constexpr int kThreadsPerRow = Tile::kBlockChunks;
    static constexpr int kRowsPerPass = kNThreads / kThreadsPerRow;
    static constexpr int kPasses = Tile::kRows / kRowsPerPass;
    static constexpr int kBlocks = Tile::kChunksPerRow / Tile::kBlockChunks;
    static_assert(kNThreads % kThreadsPerRow == 0 && Tile::kRows % kRowsPerPass == 0, "uneven tile copy");
    static_assert(kRowsPerPass % 8 == 0, "passes must keep the swizzle pattern");

    int row0;            // first row this thread copies
    int col0;            // first column (element) of its chunk in column block 0
    uint32_t smem_off0;  // byte offset of (row0, its chunk) in column block 0

    __device__ __forceinline__ explicit TileCopy(int tid)
        : row0(tid / kThreadsPerRow),
          col0((tid % kThreadsPerRow) * Tile::kChunkElems),
          smem_off0(Tile::offset(tid / kThreadsPerRow, tid % kThreadsPerRow)) {}

    // Global -> shared with cp.async, zero-filling rows at or past `rows_valid`
    // and columns at or past `cols_valid`: padded keys then score 0 before their
    // mask, padded values add 0 to O, padded head-dim columns add 0 to every dot
    // product.
    template <typename Element>
    __device__ __forceinline__ void load_async(uint32_t smem_tile, const Element* gmem, int64_t row_stride,
                                               int rows_valid, int cols_valid) const {
        // An empty asm that "changes" the stride: without it the compiler hoists
        // every chunk's 64-bit offset out of the main loop, holding ~16 registers
        // per tile (spilled at d128); recomputing them costs a few IMADs a tile.
        asm volatile("" : "+l"(row_stride));
#pragma unroll
        for (int blk = 0; blk < kBlocks; ++blk) {
            const int col = col0 + blk * Tile::kBlockChunks * Tile::kChunkElems;
            const Element* src = gmem + row0 * row_stride + col;
#pragma unroll
            for (int pass = 0; pass < kPasses; ++pass) {
                const bool valid = col < cols_valid && row0 + pass * kRowsPerPass < rows_valid;
                cp_async_16B(smem_tile + blk * Tile::kBlockBytes + smem_off0 +
                                 pass * kRowsPerPass * Tile::kBlockRowBytes,
                             valid ? src + pass * kRowsPerPass * row_stride : gmem, valid);
            }
        }
    }

    // load_async for a tile whose rows are not evenly spaced (a paged KV
    // cache): row r of the tile starts at rows[r], a table in shared memory
    // that holds a readable address for every row of the tile, also those at
    // or past `rows_valid` (zero-filled, their address never read). So a row
    // costs one shared load and no select; a column at or past `cols_valid`
    // (a padded head dim) is zero-filled from the row's start, so that its
    // address stays within the row.
    template <typename Element>
    __device__ __forceinline__ void load_async_rows(uint32_t smem_tile, const Element* const* rows,
                                                    int rows_valid, int cols_valid) const {
        // Every row's address first: the shared loads' latencies overlap
        // instead of each holding up its row's copies.
        const Element* src_rows[kPasses];
#pragma unroll
        for (int pass = 0; pass < kPasses; ++pass) src_rows[pass] = rows[row0 + pass * kRowsPerPass];
#pragma unroll
        for (int pass = 0; pass < kPasses; ++pass) {
            const bool row_valid = row0 + pass * kRowsPerPass < rows_valid;
            const Element* src = src_rows[pass];
#pragma unroll
            for (int blk = 0; blk < kBlocks; ++blk) {
                const int col = col0 + blk * Tile::kBlockChunks * Tile::kChunkElems;
                const bool col_valid = col < cols_valid;
                cp_async_16B(smem_tile + blk * Tile::kBlockBytes + smem_off0 + pass * kRowsPerPass * Tile::kBlockRowBytes,
                             src + (col_valid ? col : 0), row_valid && col_valid);
            }
        }
    }

    // load_async for a tile of a paged cache whose rows are already looked up:
    // the thread's row of pass p is row in_page[p] of page pages[p] (found
    // ahead by the caller, so the copy waits on no load and divides nothing).
    // Rows past `rows_valid` are zero-filled.
    template <typename Element>
    __device__ __forceinline__ void load_async_pages(uint32_t smem_tile, const Element* base, int64_t page_stride,
                                                     int64_t row_stride, const int (&pages)[kPasses],
                                                     const int (&in_page)[kPasses], int rows_valid,
                                                     int cols_valid) const {
#pragma unroll
        for (int pass = 0; pass < kPasses; ++pass) {
            const bool row_valid = row0 + pass * kRowsPerPass < rows_valid;
            const Element* src = row_valid ? base + pages[pass] * page_stride + in_page[pass] * row_stride : base;
#pragma unroll
            for (int blk = 0; blk < kBlocks; ++blk) {
                const int col = col0 + blk * Tile::kBlockChunks * Tile::kChunkElems;
                const bool valid = row_valid && col < cols_valid;
                cp_async_16B(smem_tile + blk * Tile::kBlockBytes + smem_off0 + pass * kRowsPerPass * Tile::kBlockRowBytes,
                             valid ? src + col : base, valid);
            }
        }
    }

    // Shared -> global for rows below `rows_valid` and columns below `cols_valid`.
    template <typename Element>
    __device__ __forceinline__ void store(const char* smem_tile, Element* gmem, int64_t row_stride,
                                          int rows_valid, int cols_valid) const {
#pragma unroll
        for (int blk = 0; blk < kBlocks; ++blk) {
            const int col = col0 + blk * Tile::kBlockChunks * Tile::kChunkElems;
            Element* dst = gmem + row0 * row_stride + col;
#pragma unroll
            for (int pass = 0; pass < kPasses; ++pass) {
                if (col < cols_valid && row0 + pass * kRowsPerPass < rows_valid) {
                    *reinterpret_cast<uint4*>(dst + pass * kRowsPerPass * row_stride) =
                        *reinterpret_cast<const uint4*>(smem_tile + blk * Tile::kBlockBytes + smem_off0 +
                                                        pass * kRowsPerPass * Tile::kBlockRowBytes);
                }
            }
        }
    }
};

}  // namespace flash::sm80
