// Where the key and value rows of one (batch, KV head) live, for the tiled
// forward: contiguous rows of k and v (every forward without a cache, and a
// contiguous KV cache), or the pages of a paged KV cache, each row's address
// looked up once per tile and staged in shared memory a tile ahead. The decoding
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

// Shared memory for the staged row addresses of two key tiles of kRows keys
// (the one being loaded and the next), for paged KeyValueRows: per tile, each
// row's address in K, then in V.
template <int kRows>
struct PageEntryStage {
    static constexpr int kBytes = 2 * 2 * kRows * static_cast<int>(sizeof(void*));
};

// A row's block-table lookup, fetched ahead of its use: the page as read from
// the table (not yet checked) and the row within it.
struct PagedRow {
    int page, row_in_page;
};

// Rows [n0, n0 + kRows) of K or V into a shared-memory tile, through a copy.
// Only Is_kvcache instantiations can be paged: at run time (a KV cache), or
// always (Is_paged: a paged variable-length batch, whose copies then compile
// without the contiguous path). Paged rows are looked up once per tile, and
// each row's address staged in shared memory (PageEntryStage<kRows>::kBytes,
// two buffers: tile t's in buffer t % 2), so that a copy takes a row's address
// with one shared load (no division, no check, no multiply). Thread i < 2 * kRows takes row n0 + i % kRows, of K
// below kRows and of V above (every warp one lookup, none idle): fetch_row(n0)
// reads its block-table entry into a register (its latency hidden behind the
// caller's next GEMM), stage_row clamps it and stores the row's address; after
// a barrier load_k/load_v of that tile use them. The entries are checked once,
// before the main loop (check_pages), so that the loop holds no fault path.
template <typename Element, bool Is_kvcache, bool Is_paged, int kRows>
struct KeyValueRows {
    static_assert(Is_kvcache || !Is_paged, "only the KV-cache kernels read pages");
    using Stage = PageEntryStage<kRows>;
    // What is uniform over the sequence is read from the kernel's parameters
    // where it is used (constant memory), not held in registers.
    const FwdParams& params;
    const Element* k;  // key row 0 of the sequence at this head; paged: the cache at this head
    const Element* v;
    const int* table;        // this sequence's block-table row (paged)
    const Element** staged;  // [2 tiles][K, V][kRows] row addresses (shared memory)
    bool paged;
    int seqlen_k, start, batch;
    int v_cols;  // V's columns from v_col0 on, the ones a V tile holds (past them: zeros)

    // v_col0: the first of V's columns the V tiles hold (a block of a forward
    // that computes O in column chunks: kernel_traits.h, FwdKernelTraits).
    __device__ __forceinline__ KeyValueRows(const FwdParams& params_, const Sequence& seq, int batch_, int head_k,
                                            char* stage_smem, int v_col0 = 0)
        : params(params_),
          paged(Is_paged || (Is_kvcache && params_.block_table != nullptr)),
          seqlen_k(seq.seqlen_k),
          start(seq.k_start),
          batch(batch_),
          v_cols(params_.head_dim_v - v_col0) {
        k = static_cast<const Element*>(params.k_ptr) + head_k * params.k_head_stride +
            (paged ? 0 : seq.kv_batch * params.k_batch_stride + seq.k_start * params.k_row_stride);
        v = static_cast<const Element*>(params.v_ptr) + head_k * params.v_head_stride + v_col0 +
            (paged ? 0 : seq.kv_batch * params.v_batch_stride + seq.k_start * params.v_row_stride);
        table = paged ? params.block_table + batch_ * params.block_table_batch_stride : nullptr;
        staged = reinterpret_cast<const Element**>(stage_smem);
    }

    // This thread's lookup for tile n0 (n0 < 0: no tile): the block-table
    // entry and row in page of its row, read into registers; {0, 0} where
    // there is none (a row past the sequence: page 0 row 0 stages the head's
    // base, a readable address that the copy zero-fills without reading).
    // Without a branch, so that the compiler can interleave the division and
    // the load with the caller's next GEMM instead of stalling on them.
    template <int kNThreads>
    __device__ __forceinline__ PagedRow fetch_row(int n0, int tid) const {
        static_assert(kNThreads >= 2 * kRows, "a thread per row of a tile, for K and for V");
        if constexpr (!Is_kvcache) return {0, 0};
        const int r = tid % kRows;
        const bool has_row = paged && n0 >= 0 && tid < 2 * kRows && n0 + r < seqlen_k;
        const int cache_row = has_row ? start + n0 + r : 0;
        const int page_size = paged ? params.page_size : 1;  // 0 in a contiguous cache
        const int entry = cache_row / page_size;
        return {has_row ? table[entry] : 0, cache_row - entry * page_size};
    }

    // Checks every block-table entry that key tiles [n_begin, n_end) read: one
    // outside [0, num_pages) is recorded (index_check.cuh), and clamped where
    // it is staged. Once per block, its loads in flight under the first tile's.
    template <int kNThreads>
    __device__ __forceinline__ void check_pages(int n_begin, int n_end, int tid) const {
        if (!(Is_kvcache && paged) || n_end <= n_begin) return;
        const int first = (start + n_begin * kRows) / params.page_size;
        const int last = (start + min(n_end * kRows, seqlen_k) - 1) / params.page_size;
        for (int entry = first + tid; entry <= last; entry += kNThreads) {
            checked_page(params, table, batch, entry);
        }
    }

    // Stages this thread's row address in tile n0's buffer, its page clamped
    // into [0, num_pages) (check_pages recorded any outside); visible after a
    // barrier.
    template <int kNThreads>
    __device__ __forceinline__ void stage_row(int n0, int tid, PagedRow row) const {
        if (!(Is_kvcache && paged) || n0 < 0 || tid >= 2 * kRows) return;
        const bool is_v = tid >= kRows;
        const int page = min(max(row.page, 0), params.kv_cache_batch - 1);
        staged[buffer_of(n0) * 2 * kRows + tid] =
            (is_v ? v : k) + page * (is_v ? params.v_batch_stride : params.k_batch_stride) +
            row.row_in_page * (is_v ? params.v_row_stride : params.k_row_stride);
    }

    template <typename Copy>
    __device__ __forceinline__ void load_k(const Copy& copy, uint32_t smem_tile, int n0) const {
        load(copy, smem_tile, k, params.k_row_stride, /*rows_of_v=*/false, n0);
    }
    template <typename Copy>
    __device__ __forceinline__ void load_v(const Copy& copy, uint32_t smem_tile, int n0) const {
        load(copy, smem_tile, v, params.v_row_stride, /*rows_of_v=*/true, n0);
    }

  private:
    __device__ __forceinline__ static int buffer_of(int n0) { return (n0 / kRows) % 2; }

    template <typename Copy>
    __device__ __forceinline__ void load(const Copy& copy, uint32_t smem_tile, const Element* rows,
                                         int64_t row_stride, bool rows_of_v, int n0) const {
        const int cols = rows_of_v ? v_cols : params.head_dim;  // past them: zeros
        if (Is_kvcache && paged) {
            const Element* const* addresses = staged + (buffer_of(n0) * 2 + rows_of_v) * kRows;
            copy.template load_async_rows<Element>(smem_tile, addresses, seqlen_k - n0, cols);
        } else {
            copy.load_async(smem_tile, rows + n0 * row_stride, row_stride, seqlen_k - n0, cols);
        }
    }
};

}  // namespace flash::sm80
