// Where the key and value rows of one (batch, KV head) live, for the tiled
// forward: contiguous rows of k and v (every forward without a cache, and a
// contiguous KV cache), or the pages of a paged KV cache, looked up row by row
// in block-table entries staged in shared memory a tile ahead. The decoding
// kernel stages its whole table window instead (decode_kernel.cuh).
#pragma once

#include <cstdint>

#include "common/flash.h"
#include "common/index_check.cuh"
#include "common/mask.cuh"
#include "common/ptx.cuh"
#include "sm80/ptx.cuh"
#include "sm80/tile_copy.cuh"

namespace flash::sm80 {

// The rows of one head of a paged KV cache, for TileCopy::load_async_rows: row
// r of the current key tile (counted from the sequence's first row) is at
// (page, row in page) = rows[r - first_row], staged in shared memory already
// looked up and range-checked (KeyValueRows::fetch_row / stage_row), so a
// tile's copies wait on no load, divide nothing and check nothing. Rows of the
// tile past the sequence read a stale slot (never dereferenced).
template <typename Element>
struct StagedPagedRows {
    const Element* base;  // the cache, at this head
    const int2* rows;     // the tile's rows: {page, row in page}
    int first_row;
    int64_t page_stride, row_stride;

    __device__ __forceinline__ const Element* row(int r) const {
        const int2 where = rows[r - first_row];
        return base + where.x * page_stride + where.y * row_stride;
    }
};

// Shared memory for the staged rows of two key tiles of kRows keys (the one
// being loaded and the next), for paged KeyValueRows.
template <int kRows>
struct PageEntryStage {
    static constexpr int kBytes = 2 * kRows * static_cast<int>(sizeof(int2));
};

// Rows [n0, n0 + kRows) of K or V into a shared-memory tile, through a copy.
// Only Is_kvcache instantiations can be paged. Their rows are looked up once
// per tile into shared memory (PageEntryStage<kRows>::kBytes, two buffers:
// tile t's in buffer t % 2), thread i taking row n0 + i: fetch_row(n0) reads
// the block-table entry into a register (its latency hidden behind the
// caller's next GEMM), stage_row checks it and stores {page, row in page};
// after a barrier load_k/load_v of that tile use them.
template <typename Element, bool Is_kvcache, int kRows>
struct KeyValueRows {
    using Stage = PageEntryStage<kRows>;
    // What is uniform over the sequence is read from the kernel's parameters
    // where it is used (constant memory), not held in registers.
    const FwdParams& params;
    const Element* k;  // key row 0 of the sequence at this head; paged: the cache at this head
    const Element* v;
    const int* table;  // this sequence's block-table row (paged)
    int2* staged;      // the staged rows (shared memory)
    bool paged;
    int seqlen_k, start, batch;

    __device__ __forceinline__ KeyValueRows(const FwdParams& params_, const Sequence& seq, int batch_, int head_k,
                                            char* stage_smem)
        : params(params_),
          paged(Is_kvcache && params_.block_table != nullptr),
          seqlen_k(seq.seqlen_k),
          start(seq.k_start),
          batch(batch_) {
        k = static_cast<const Element*>(params.k_ptr) + head_k * params.k_head_stride +
            (paged ? 0 : seq.kv_batch * params.k_batch_stride + seq.k_start * params.k_row_stride);
        v = static_cast<const Element*>(params.v_ptr) + head_k * params.v_head_stride +
            (paged ? 0 : seq.kv_batch * params.v_batch_stride + seq.k_start * params.v_row_stride);
        table = paged ? params.block_table + batch_ * params.block_table_batch_stride : nullptr;
        staged = reinterpret_cast<int2*>(stage_smem);
    }

    // The block-table entry of this thread's row n0 + tid of tile n0 (n0 < 0:
    // no tile), read into a register; 0 where there is none or not paged.
    template <int kNThreads>
    __device__ __forceinline__ int fetch_row(int n0, int tid) const {
        static_assert(kNThreads >= kRows, "a thread per row of a tile");
        if (!(Is_kvcache && paged) || n0 < 0 || tid >= kRows || n0 + tid >= seqlen_k) return 0;
        return table[(start + n0 + tid) / params.page_size];
    }

    // Checks the fetched entry (a page outside [0, num_pages) is recorded and
    // clamped, index_check.cuh) and stages {page, row in page} of row n0 + tid
    // in tile n0's buffer; visible after a barrier.
    template <int kNThreads>
    __device__ __forceinline__ void stage_row(int n0, int tid, int entry_value) const {
        if (!(Is_kvcache && paged) || n0 < 0 || tid >= kRows || n0 + tid >= seqlen_k) return;
        const int cache_row = start + n0 + tid;
        const int entry = cache_row / params.page_size;
        const int page = checked_index(entry_value, 0, params.kv_cache_batch - 1, params.faults,
                                       IndexArgument::kBlockTable, batch, entry);
        staged[buffer_of(n0) * kRows + tid] = make_int2(page, cache_row - entry * params.page_size);
    }

    template <typename Copy>
    __device__ __forceinline__ void load_k(const Copy& copy, uint32_t smem_tile, int n0) const {
        load(copy, smem_tile, k, params.k_row_stride, params.k_batch_stride, n0);
    }
    template <typename Copy>
    __device__ __forceinline__ void load_v(const Copy& copy, uint32_t smem_tile, int n0) const {
        load(copy, smem_tile, v, params.v_row_stride, params.v_batch_stride, n0);
    }

  private:
    __device__ __forceinline__ static int buffer_of(int n0) { return (n0 / kRows) % 2; }

    template <typename Copy>
    __device__ __forceinline__ void load(const Copy& copy, uint32_t smem_tile, const Element* rows,
                                         int64_t row_stride, int64_t page_stride, int n0) const {
        if (Is_kvcache && paged) {
            const StagedPagedRows<Element> pages{rows, staged + buffer_of(n0) * kRows, n0, page_stride, row_stride};
            copy.template load_async_rows<Element>(smem_tile, pages, n0, seqlen_k - n0, params.head_dim);
        } else {
            copy.load_async(smem_tile, rows + n0 * row_stride, row_stride, seqlen_k - n0, params.head_dim);
        }
    }
};

}  // namespace flash::sm80
