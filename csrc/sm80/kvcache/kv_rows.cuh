// Where the key and value rows of one (batch, KV head) live, for the tiled
// forward: contiguous rows of k and v (every forward without a cache, and a
// contiguous KV cache), or the pages of a paged KV cache, looked up in the block
// table row by row. The decoding kernel looks its pages up ahead instead
// (decode_kernel.cuh).
#pragma once

#include <cstdint>

#include "common/flash.h"
#include "common/index_check.cuh"
#include "common/mask.cuh"
#include "sm80/tile_copy.cuh"

namespace flash::sm80 {

// The rows of one head of a paged KV cache, for TileCopy::load_async_rows: row
// r of the sequence (counted from its first cache row `start`) lives in page
// table[(start + r) / page_size] at row (start + r) % page_size. A page index
// outside [0, num_pages) is recorded as a fault and clamped (index_check.cuh).
template <typename Element>
struct PagedRows {
    const Element* base;  // the cache, at this head
    const int* table;     // this sequence's row of the block table
    int64_t page_stride, row_stride;
    int page_size;
    int start;
    int num_pages;
    int batch;  // the sequence, for the error message
    FaultSink faults;

    __device__ __forceinline__ const Element* row(int r) const {
        const int cache_row = start + r;
        const int entry = cache_row / page_size;
        const int page = checked_index(table[entry], 0, num_pages - 1, faults, IndexArgument::kBlockTable, batch, entry);
        return base + page * page_stride + (cache_row % page_size) * row_stride;
    }
};

// Rows [n0, n0 + tile) of K or V into a shared-memory tile, through `copy`.
// Only Is_kvcache instantiations can be paged.
template <typename Element, bool Is_kvcache>
struct KeyValueRows {
    const Element* k;  // key row 0 of the sequence at this head (contiguous)
    const Element* v;
    PagedRows<Element> k_pages, v_pages;  // Is_kvcache only
    int64_t k_row_stride, v_row_stride;
    bool paged;
    int seqlen_k, head_dim;

    __device__ __forceinline__ KeyValueRows(const FwdParams& params, const Sequence& seq, int batch, int head_k)
        : k_row_stride(params.k_row_stride),
          v_row_stride(params.v_row_stride),
          paged(Is_kvcache && params.block_table != nullptr),
          seqlen_k(seq.seqlen_k),
          head_dim(params.head_dim) {
        const Element* k_head = static_cast<const Element*>(params.k_ptr) + head_k * params.k_head_stride;
        const Element* v_head = static_cast<const Element*>(params.v_ptr) + head_k * params.v_head_stride;
        k = k_head + (paged ? 0 : seq.kv_batch * params.k_batch_stride + seq.k_start * params.k_row_stride);
        v = v_head + (paged ? 0 : seq.kv_batch * params.v_batch_stride + seq.k_start * params.v_row_stride);
        if constexpr (Is_kvcache) {
            const int* table = paged ? params.block_table + batch * params.block_table_batch_stride : nullptr;
            k_pages = PagedRows<Element>{k_head, table, params.k_batch_stride, params.k_row_stride,
                                         params.page_size, seq.k_start, params.kv_cache_batch, batch, params.faults};
            v_pages = PagedRows<Element>{v_head, table, params.v_batch_stride, params.v_row_stride,
                                         params.page_size, seq.k_start, params.kv_cache_batch, batch, params.faults};
        }
    }

    template <typename Copy>
    __device__ __forceinline__ void load_k(const Copy& copy, uint32_t smem_tile, int n0) const {
        load(copy, smem_tile, k, k_pages, k_row_stride, n0);
    }
    template <typename Copy>
    __device__ __forceinline__ void load_v(const Copy& copy, uint32_t smem_tile, int n0) const {
        load(copy, smem_tile, v, v_pages, v_row_stride, n0);
    }

  private:
    template <typename Copy>
    __device__ __forceinline__ void load(const Copy& copy, uint32_t smem_tile, const Element* rows,
                                         const PagedRows<Element>& pages, int64_t row_stride, int n0) const {
        if (Is_kvcache && paged) {
            copy.template load_async_rows<Element>(smem_tile, pages, n0, seqlen_k - n0, head_dim);
        } else {
            copy.load_async(smem_tile, rows + n0 * row_stride, row_stride, seqlen_k - n0, head_dim);
        }
    }
};

}  // namespace flash::sm80
