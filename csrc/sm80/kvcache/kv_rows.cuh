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

// The rows of one head of a paged KV cache whose block-table entries for the
// current key tile were staged in shared memory, already range-checked
// (KeyValueRows::fetch_entries / stage_entries): looking a row up reads shared
// memory, not the table in global memory, so a tile's copies wait on no load
// and check nothing.
template <typename Element>
struct StagedPagedRows {
    const Element* base;  // the cache, at this head
    const int* entries;   // the staged entries, checked: entries[i] is table[first_entry + i]
    int first_entry;
    int64_t page_stride, row_stride;
    int page_size;
    int start;

    __device__ __forceinline__ const Element* row(int r) const {
        const int cache_row = start + r;
        // Pages of a power-of-two size (the usual 16, 256) divide by a shift.
        const bool pow2 = (page_size & (page_size - 1)) == 0;
        const int entry = pow2 ? cache_row >> (__ffs(page_size) - 1) : cache_row / page_size;
        return base + entries[entry - first_entry] * page_stride + (cache_row - entry * page_size) * row_stride;
    }
};

// Shared memory for the staged block-table entries of two key tiles of kRows
// keys (the one being loaded and the next), for paged KeyValueRows.
template <int kRows>
struct PageEntryStage {
    static constexpr int kEntries = kRows + 1;  // a tile of kRows rows spans at most kRows + 1 pages
    static constexpr int kBytes = (2 * kEntries * 4 + 15) / 16 * 16;
};

// Rows [n0, n0 + kRows) of K or V into a shared-memory tile, through a copy.
// Only Is_kvcache instantiations can be paged. Their block-table entries go
// through shared memory (PageEntryStage<kRows>::kBytes, two buffers: tile t's
// in buffer t % 2): fetch_entries(n0) reads tile n0's entries into registers
// (its latency hidden behind the caller's next GEMM), stage_entries checks
// them and stores them; after a barrier load_k/load_v of that tile use them.
template <typename Element, bool Is_kvcache, int kRows>
struct KeyValueRows {
    using Stage = PageEntryStage<kRows>;
    // What is uniform over the sequence is read from the kernel's parameters
    // where it is used (constant memory), not held in registers.
    const FwdParams& params;
    const Element* k;  // key row 0 of the sequence at this head; paged: the cache at this head
    const Element* v;
    const int* table;  // this sequence's block-table row (paged)
    int* entries;      // the staged entries (shared memory)
    bool paged;
    int seqlen_k, start, batch;

    __device__ __forceinline__ KeyValueRows(const FwdParams& params_, const Sequence& seq, int batch_, int head_k,
                                            char* entry_smem)
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
        entries = reinterpret_cast<int*>(entry_smem);
    }

    // A thread's share of a tile's block-table entries: entries first + tid and
    // first + tid + kNThreads of the tile's (a tile spans up to kRows + 1 pages).
    struct Entries {
        int value[2];
    };

    // Reads tile [n0, n0 + kRows)'s entries into registers (nothing unless paged).
    template <int kNThreads>
    __device__ __forceinline__ Entries fetch_entries(int n0, int tid) const {
        static_assert(2 * kNThreads >= Stage::kEntries, "two entries per thread must cover a tile");
        Entries fetched{{0, 0}};
        if (!(Is_kvcache && paged)) return fetched;
        const int count = entry_count(n0);
        const int first = (start + n0) / params.page_size;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            if (tid + j * kNThreads < count) fetched.value[j] = table[first + tid + j * kNThreads];
        }
        return fetched;
    }

    // Checks fetched entries (a page outside [0, num_pages) is recorded and
    // clamped, index_check.cuh) into tile n0's buffer; visible after a barrier.
    template <int kNThreads>
    __device__ __forceinline__ void stage_entries(int n0, int tid, const Entries& fetched) const {
        if (!(Is_kvcache && paged)) return;
        const int count = entry_count(n0);
        const int first = (start + n0) / params.page_size;
        int* buffer = entries + buffer_of(n0) * Stage::kEntries;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int i = tid + j * kNThreads;
            if (i < count) {
                buffer[i] = checked_index(fetched.value[j], 0, params.kv_cache_batch - 1, params.faults,
                                          IndexArgument::kBlockTable, batch, first + i);
            }
        }
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

    // The entries tile n0 spans (0 for no tile: n0 < 0 or past the sequence).
    __device__ __forceinline__ int entry_count(int n0) const {
        const int last_row = min(n0 + kRows, seqlen_k) - 1;
        return n0 < 0 || last_row < n0 ? 0
                                       : (start + last_row) / params.page_size - (start + n0) / params.page_size + 1;
    }

    template <typename Copy>
    __device__ __forceinline__ void load(const Copy& copy, uint32_t smem_tile, const Element* rows,
                                         int64_t row_stride, int64_t page_stride, int n0) const {
        if (Is_kvcache && paged) {
            const StagedPagedRows<Element> pages{rows, entries + buffer_of(n0) * Stage::kEntries,
                                                 (start + n0) / params.page_size, page_stride, row_stride,
                                                 params.page_size, start};
            copy.template load_async_rows<Element>(smem_tile, pages, n0, seqlen_k - n0, params.head_dim);
        } else {
            copy.load_async(smem_tile, rows + n0 * row_stride, row_stride, seqlen_k - n0, params.head_dim);
        }
    }
};

}  // namespace flash::sm80
