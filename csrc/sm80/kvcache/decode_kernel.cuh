// The decoding kernel: attention of a few query rows over a long KV cache,
// bound by reading the cache.
//
// A block owns up to 16 rows of one (batch, head) -- with pack_gqa the query
// heads of one KV head, so each KV byte is read once for the group -- and one
// split's range of key tiles. The tiles stream through a kStages-deep cp.async
// pipeline, so a block keeps kStages - 1 tiles of K and V in flight while it
// computes on one. Every warp takes its own 16 keys of each tile and keeps its
// own online softmax (no cross-warp reduction in the loop, one barrier per
// tile); the warps' partial results are merged by their LSE through shared
// memory at the end, and the splits' by the last split to finish.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/extras.cuh"
#include "common/flash.h"
#include "common/lse_merge.cuh"
#include "common/mask.cuh"
#include "common/ptx.cuh"
#include "common/sink.cuh"
#include "common/softmax.cuh"
#include "sm80/gemm.cuh"
#include "sm80/kvcache/fp8_cache.cuh"
#include "sm80/kvcache/kvcache_traits.h"
#include "sm80/kvcache/merge.cuh"
#include "sm80/ptx.cuh"
#include "sm80/tile_copy.cuh"

namespace flash::sm80 {

// A paged cache's pages for the tiles this thread copies, looked up one tile
// before the copy is issued, in a copy of the block table's entries in shared
// memory: two windows of kTableWindow entries, the next copied (cp.async, with
// a tile's group) when the lookups enter the current one. A lookup that read the
// table itself would wait for its load behind the K/V copies in flight -- the
// pipeline drained at every new table line (every 8 tiles of 16-row pages). A
// window spans at least kTableWindow / kBlockN >= kStages tiles, so it has
// landed when first used. Pages of a power-of-two size divide by a shift.
template <typename Traits, typename KVCopy>
struct PageLookup {
    static constexpr int kWindow = Traits::kTableWindow;
    const FwdParams& params;
    const int* table;           // the sequence's row of the block table
    uint32_t table_smem;        // the two windows
    const int* table_entries;   // the same, for reading
    int k_start, seqlen_k;
    int page_shift;  // log2(page_size) for pages of a power-of-two size, else -1
    int first_entry, last_entry;  // this split's entries: window w holds first_entry + w * kWindow + [0, kWindow)
    int next_window = 2;          // the window that entering window next_window - 1 copies
    int pages[KVCopy::kPasses], in_page[KVCopy::kPasses];
    bool faulted = false;  // a page this thread looked up was out of range

    __device__ __forceinline__ PageLookup(const FwdParams& params_, char* smem, int batch, const Sequence& seq,
                                          int first_key, int page_shift_)
        : params(params_),
          table(params_.block_table == nullptr ? nullptr : params_.block_table + batch * params_.block_table_batch_stride),
          table_smem(smem_addr(smem + Traits::kSmemTableOffset)),
          table_entries(reinterpret_cast<const int*>(smem + Traits::kSmemTableOffset)),
          k_start(seq.k_start),
          seqlen_k(seq.seqlen_k),
          page_shift(page_shift_) {
        const bool paged = params.block_table != nullptr;  // else nothing is looked up
        first_entry = paged ? entry_of(first_key) : 0;
        last_entry = paged && seqlen_k > 0 ? entry_of(seqlen_k - 1) : -1;
    }

    __device__ __forceinline__ int entry_of(int row) const {  // the table entry of the sequence's key `row`
        const int cache_row = k_start + row;
        return page_shift >= 0 ? cache_row >> page_shift : cache_row / params.page_size;
    }

    __device__ __forceinline__ void copy_window(int w, int tid) const {
#pragma unroll
        for (int i = 0; i < kWindow / Traits::kNThreads; ++i) {
            const int at = i * Traits::kNThreads + tid;
            const int entry = first_entry + w * kWindow + at;
            cp_async_4B(table_smem + ((w % 2) * kWindow + at) * 4, table + (entry <= last_entry ? entry : 0),
                        entry <= last_entry);
        }
    }

    // The pages of the rows this thread copies of tile n_block.
    __device__ __forceinline__ void look_up(int n_block, int copy_row0, int tid) {
        if (entry_of(n_block * Traits::kBlockN) >= first_entry + (next_window - 1) * kWindow) {
            copy_window(next_window++, tid);
        }
#pragma unroll
        for (int pass = 0; pass < KVCopy::kPasses; ++pass) {
            const int row = n_block * Traits::kBlockN + copy_row0 + pass * KVCopy::kRowsPerPass;
            if (row < seqlen_k) {
                const int entry = entry_of(row);
                in_page[pass] = k_start + row - entry * params.page_size;
                pages[pass] = table_entries[(entry - first_entry) % (2 * kWindow)];
            }
        }
    }

    // The pages' range check, where they are used (at the lookup it would wait
    // for the table's load): a page out of range is clamped, and only flagged
    // here; report_fault finds and records it after the loop, off the hot path.
    __device__ __forceinline__ void check(int n0, int copy_row0) {
#pragma unroll
        for (int pass = 0; pass < KVCopy::kPasses; ++pass) {
            const int row = n0 + copy_row0 + pass * KVCopy::kRowsPerPass;
            if (row < seqlen_k) {
                const int page = pages[pass];
                pages[pass] = min(max(page, 0), params.kv_cache_batch - 1);
                faulted |= page != pages[pass];
            }
        }
    }

    // Records the first of this split's block-table entries that is out of range.
    __device__ __forceinline__ void report_fault(int batch) const {
        for (int entry = first_entry; entry <= last_entry; ++entry) {
            const int page = table[entry];
            if (page < 0 || page >= params.kv_cache_batch) {
                record_index_fault(params.faults, IndexArgument::kBlockTable, batch, entry, page, 0,
                                   params.kv_cache_batch - 1);
                return;
            }
        }
    }
};

// The warps' results merged by their LSE into the block's rows: each warp
// weighs its normalised rows by exp(lse_warp - lse_block). LSEs go through the
// Q tile, the fp32 rows through the stage buffers (both free once every warp
// is past the loop); row_lse (shared) receives the block's LSEs, and the
// returned pointer the merged rows for the caller to sum over the warps.
// with_sink: the block's rows are final (one split), so the learnable sink
// of each row of `head` joins the merge (a split's part leaves it to the
// merge of the splits). out_scale multiplies every row (an FP8 cache's
// v_descale); o's columns are in fp8_cache.cuh's order where Traits::kFp8Kv.
template <typename Traits>
__device__ __forceinline__ const float* merge_warps(char* smem, const float (&o)[1][Traits::kNTilesO][4],
                                                    const float (&lse)[2], int tid, const FwdParams& params,
                                                    int head, bool with_sink, float out_scale) {
    constexpr int kRows = Traits::kRows;
    const int lane = tid % 32, warp = tid / 32;
    float* warp_lse = reinterpret_cast<float*>(smem);                              // [warp][row]
    float* row_lse = warp_lse + Traits::kNWarps * kRows;                           // [row], the block's
    float* warp_out = reinterpret_cast<float*>(smem + Traits::kSmemStagesOffset);  // [warp][row][col]
    if (lane % 4 == 0) {
        warp_lse[warp * kRows + lane / 4] = lse[0];
        warp_lse[warp * kRows + lane / 4 + 8] = lse[1];
    }
    __syncthreads();
    if (tid < kRows) {
        LseMerge merge;
        float max_lse = -INFINITY;
#pragma unroll
        for (int w = 0; w < Traits::kNWarps; ++w) max_lse = fmaxf(max_lse, warp_lse[w * kRows + tid]);
        merge.raise_max(max_lse);
#pragma unroll
        for (int w = 0; w < Traits::kNWarps; ++w) merge.add(warp_lse[w * kRows + tid]);
        if (with_sink) merge.add_sink(learnable_sink_of</*May_pack=*/true>(params, head, tid));
        row_lse[tid] = merge.lse();
    }
    __syncthreads();
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = lane / 4 + half * 8;
        const float weight = LseMerge::share(lse[half], row_lse[row]) * out_scale;
        float* row_out = warp_out + (warp * kRows + row) * Traits::kHeadDim;
        if constexpr (Traits::kFp8Kv) {
            store_o_row(row_out, o, half, weight, lane);
        } else {
#pragma unroll
            for (int j = 0; j < Traits::kNTilesO; ++j) {
                *reinterpret_cast<float2*>(row_out + j * 8 + (lane % 4) * 2) =
                    make_float2(o[0][j][2 * half] * weight, o[0][j][2 * half + 1] * weight);
            }
        }
    }
    __syncthreads();
    return warp_out;
}

// Whether this block is the last of its group's splits to finish. The barrier,
// then one thread's acquire-release add, publishes the block's partial rows
// and, in the last block, makes every other block's visible; the last block
// zeroes the counter again for the next call.
__device__ __forceinline__ bool last_split(const FwdParams& params, char* smem, int batch, int head, int tid) {
    __syncthreads();
    int* is_last = reinterpret_cast<int*>(smem);
    if (tid == 0) {
        unsigned int* counter = params.split_counters + static_cast<int64_t>(batch) * params.num_heads + head;
        const bool last = atomic_add_acq_rel(counter, 1u) == static_cast<unsigned int>(params.num_splits) - 1;
        if (last) *counter = 0;
        *is_last = last;
    }
    __syncthreads();
    return *is_last;
}

template <typename Traits>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kMinBlocksPerSm) decode_kernel(const FwdParams params) {
    using Element = typename Traits::Element;
    using KVTile = typename Traits::KVTile;
    using KVCopy = TileCopy<KVTile, Traits::kNThreads>;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kStages = Traits::kStages;
    constexpr int kRows = Traits::kRows;

    extern __shared__ __align__(128) char smem[];
    const uint32_t q_smem = smem_addr(smem);
    const uint32_t stages_smem = smem_addr(smem + Traits::kSmemStagesOffset);
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int split = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
    const int head_k = head / params.heads_per_kv_head;

    // Q first: its copy needs no index, so it is in flight while cache_seqlens is read.
    if constexpr (Traits::kFp8Kv) {
        // In the K fragments' k order; stored before the main loop's first barrier.
        load_q_deinterleaved<typename Traits::QTile, Traits::kNThreads>(
            smem, static_cast<const Element*>(params.q_ptr) + batch * params.q_batch_stride + head * params.q_head_stride,
            params.q_row_stride, params.seqlen_q, params.head_dim, tid);
    } else if (tid < Traits::kQCopyThreads) {
        const TileCopy<typename Traits::QTile, Traits::kQCopyThreads> q_copy(tid);
        q_copy.load_async(q_smem,
                          static_cast<const Element*>(params.q_ptr) + batch * params.q_batch_stride +
                              head * params.q_head_stride,
                          params.q_row_stride, params.seqlen_q, params.head_dim);
    }
    Sequence seq = sequence_of</*Is_kvcache=*/true>(params, batch);
    const Window window = kvcache_window(params, seq);
    const int seqlen_q = seq.seqlen_q, seqlen_k = seq.seqlen_k;
    const KeyTileRange tiles =
        split_key_tiles(key_tile_range<kRows, kBlockN>(0, seqlen_q, window), split, params.num_splits);
    const int n_tiles = tiles.n_end - tiles.n_begin;

    const bool paged = params.block_table != nullptr;
    // The cache's pointers: Element for a 16-bit cache (the params' offsets and
    // strides as they are, read from the constant bank where they are used),
    // byte pairs for an FP8 one (its offsets and strides in elements halved:
    // every one is even), as 16-bit units that the tile copies move. Each
    // form measured fastest for its cache (round 30, calls 6-8: the other
    // costs 2% on paged 16-bit decoding, 15% on paged FP8 decoding).
    using Stored = std::conditional_t<Traits::kFp8Kv, uint16_t, Element>;
    auto units = [](int64_t elements) { return elements * Traits::kKvBytes / 2; };
    const Stored* k = [&] {
        if constexpr (Traits::kFp8Kv) {
            return static_cast<const uint16_t*>(params.k_ptr) +
                   units(head_k * params.k_head_stride +
                         (paged ? 0 : seq.kv_batch * params.k_batch_stride + seq.k_start * params.k_row_stride));
        } else {
            return static_cast<const Element*>(params.k_ptr) + head_k * params.k_head_stride +
                   (paged ? 0 : seq.kv_batch * params.k_batch_stride + seq.k_start * params.k_row_stride);
        }
    }();
    const Stored* v = [&] {
        if constexpr (Traits::kFp8Kv) {
            return static_cast<const uint16_t*>(params.v_ptr) +
                   units(head_k * params.v_head_stride +
                         (paged ? 0 : seq.kv_batch * params.v_batch_stride + seq.k_start * params.v_row_stride));
        } else {
            return static_cast<const Element*>(params.v_ptr) + head_k * params.v_head_stride +
                   (paged ? 0 : seq.kv_batch * params.v_batch_stride + seq.k_start * params.v_row_stride);
        }
    }();
    const int64_t k_row_stride = units(params.k_row_stride), v_row_stride = units(params.v_row_stride);  // FP8's
    const int64_t k_page_stride = units(params.k_batch_stride), v_page_stride = units(params.v_batch_stride);
    const int k_cols = static_cast<int>(units(params.head_dim)), v_cols = static_cast<int>(units(params.head_dim_v));
    // Stage s holds K then V of one tile.
    auto k_stage = [&](int s) { return stages_smem + s * Traits::kStageBytes; };
    auto v_stage = [&](int s) { return stages_smem + s * Traits::kStageBytes + KVTile::kBytes; };
    const KVCopy kv_copy(tid);
    const int page_shift = paged && (params.page_size & (params.page_size - 1)) == 0 ? __ffs(params.page_size) - 1 : -1;
    PageLookup<Traits, KVCopy> pages(params, smem, batch, seq, tiles.n_begin * kBlockN, page_shift);
    auto load_tile = [&](int stage, int n_block) {
        const int n0 = n_block * kBlockN;
        if constexpr (Traits::kFp8Kv) {
            if (paged) {
                pages.check(n0, kv_copy.row0);
                kv_copy.load_async_pages(k_stage(stage), k, k_page_stride, k_row_stride, pages.pages, pages.in_page,
                                         seqlen_k - n0, k_cols);
                kv_copy.load_async_pages(v_stage(stage), v, v_page_stride, v_row_stride, pages.pages, pages.in_page,
                                         seqlen_k - n0, v_cols);
            } else {
                kv_copy.load_async(k_stage(stage), k + n0 * k_row_stride, k_row_stride, seqlen_k - n0, k_cols);
                kv_copy.load_async(v_stage(stage), v + n0 * v_row_stride, v_row_stride, seqlen_k - n0, v_cols);
            }
        } else if (paged) {
            pages.check(n0, kv_copy.row0);
            kv_copy.load_async_pages(k_stage(stage), k, params.k_batch_stride, params.k_row_stride, pages.pages,
                                     pages.in_page, seqlen_k - n0, params.head_dim);
            kv_copy.load_async_pages(v_stage(stage), v, params.v_batch_stride, params.v_row_stride, pages.pages,
                                     pages.in_page, seqlen_k - n0, params.head_dim_v);
        } else {
            kv_copy.load_async(k_stage(stage), k + n0 * params.k_row_stride, params.k_row_stride, seqlen_k - n0,
                               params.head_dim);
            kv_copy.load_async(v_stage(stage), v + n0 * params.v_row_stride, params.v_row_stride, seqlen_k - n0,
                               params.head_dim_v);
        }
    };

    // Prologue: the first table windows (Q lands with them), then the first
    // tiles up to kStages - 1 in flight (a commit group per tile, empty past the
    // last, so the wait counts hold).
    if (paged && n_tiles > 0) {
        pages.copy_window(0, tid);
        pages.copy_window(1, tid);
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
    }
#pragma unroll
    for (int t = 0; t < kStages - 1; ++t) {
        if (t < n_tiles) {
            if (paged) pages.look_up(tiles.n_begin + t, kv_copy.row0, tid);
            load_tile(t, tiles.n_begin + t);
        }
        cp_async_commit();
    }
    if (paged && kStages - 1 < n_tiles) pages.look_up(tiles.n_begin + kStages - 1, kv_copy.row0, tid);

    float o[1][Traits::kNTilesO][4];
    clear(o);
    OnlineSoftmax<1> softmax;
    const ScoreExtras extras(params, batch, head, window.diagonal);
    const bool has_extras = extras.softcap || extras.alibi_slope != 0.f;
    // An FP8 cache's descales: k's scales the scores (before softcap, ALiBi and
    // the mask, which see q . k of the real values), v's the output.
    float k_scale = 1.f, v_scale = 1.f;
    if constexpr (Traits::kFp8Kv) {
        const int64_t descale = static_cast<int64_t>(batch) * params.num_heads_k + head_k;
        if (params.k_descale != nullptr) k_scale = params.k_descale[descale];
        if (params.v_descale != nullptr) v_scale = params.v_descale[descale];
    }

    for (int t = 0; t < n_tiles; ++t) {
        // Tile t has landed for every thread, and every warp is done with tile
        // t - 1, whose stage the next load overwrites.
        cp_async_wait<kStages - 2>();
        __syncthreads();
        if (t + kStages - 1 < n_tiles) {
            load_tile((t + kStages - 1) % kStages, tiles.n_begin + t + kStages - 1);
            if (paged && t + kStages < n_tiles) pages.look_up(tiles.n_begin + t + kStages, kv_copy.row0, tid);
        }
        cp_async_commit();

        const int stage = t % kStages;
        const int n_block = tiles.n_begin + t;
        const int warp_n0 = n_block * kBlockN + warp * 16;  // this warp's first key
        float s[1][2][4];
        clear(s);
        if constexpr (Traits::kFp8Kv) {
            gemm_q_k8<Element, Traits::kKSteps, typename Traits::QTile, KVTile>(s, q_smem, k_stage(stage), warp * 16,
                                                                               lane);
            scale(s, k_scale);
        } else {
            gemm_smem_smem<Element, 1, 2, Traits::kKSteps, typename Traits::QTile, KVTile>(s, q_smem, 0, k_stage(stage),
                                                                                          warp * 16, lane);
        }
        if (has_extras) apply_score_extras<false>(s, extras, 0, warp_n0, lane);
        if (n_block < tiles.full_begin || n_block >= tiles.full_end) apply_mask<true>(s, 0, warp_n0, window, lane);
        softmax.update(s, o, params.softmax_scale_log2);
        // O += P V over the warp's 16 keys: V rows warp * 16 .. + 16 (a whole
        // number of swizzle periods, so only the base moves).
        if constexpr (Traits::kFp8Kv) {
            gemm_p_v8<Element, Traits::kNTilesO, KVTile>(o, s, v_stage(stage), warp * 16, lane);
        } else {
            gemm_regs_smem<Element, 1, Traits::kNTilesO, 1, KVTile>(
                o, s, v_stage(stage) + warp * 16 * KVTile::kBlockRowBytes, lane);
        }
    }

    if (paged && pages.faulted) pages.report_fault(batch);
    float lse[2];
    softmax.finalize(o, lse);
    cp_async_wait<0>();
    __syncthreads();
    // Sum the warps' rows and store: out and lse with one split, otherwise the
    // split's fp32 partial rows, then the last split merges them all.
    const bool partial = params.num_splits > 1;
    const float* warp_out = merge_warps<Traits>(smem, o, lse, tid, params, head, /*with_sink=*/!partial, v_scale);
    const float* row_lse = reinterpret_cast<const float*>(smem) + Traits::kNWarps * kRows;

    const int64_t group_row0 = (static_cast<int64_t>(batch) * params.num_heads + head) * seqlen_q;
    const int64_t split_rows = static_cast<int64_t>(params.batch) * params.num_heads * seqlen_q;
    const int64_t accum_row0 = split * split_rows + group_row0;
    Element* out = static_cast<Element*>(params.o_ptr) + batch * params.o_batch_stride + head * params.o_head_stride;
    float* out_lse = params.lse_ptr + batch * params.lse_batch_stride + head * params.lse_head_stride;
    constexpr int kQuads = Traits::kHeadDim / 4;  // 4 columns per thread and step
    for (int idx = tid; idx < kRows * kQuads; idx += Traits::kNThreads) {
        const int row = idx / kQuads, col = (idx % kQuads) * 4;
        if (row >= seqlen_q || col >= params.head_dim_v) continue;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int w = 0; w < Traits::kNWarps; ++w) {
            const float4 part = *reinterpret_cast<const float4*>(warp_out + (w * kRows + row) * Traits::kHeadDim + col);
            acc.x += part.x, acc.y += part.y, acc.z += part.z, acc.w += part.w;
        }
        if (partial) {
            *reinterpret_cast<float4*>(params.o_accum_ptr + (accum_row0 + row) * params.head_dim_v + col) = acc;
        } else {
            *reinterpret_cast<uint2*>(out + row * params.o_row_stride + col) =
                make_uint2(pack2<Element>(acc.x, acc.y), pack2<Element>(acc.z, acc.w));
        }
    }
    if (tid < seqlen_q) (partial ? params.lse_accum_ptr[accum_row0 + tid] : out_lse[tid]) = row_lse[tid];
    if (!partial || !last_split(params, smem, batch, head, tid)) return;

    // Splits per round of the merge, as registers allow: 16 up to d128, except
    // at d32, where a thread's one (row, columns) pair lets ptxas unroll the
    // whole merge and 16 splits' loads no longer fit without spilling.
    constexpr int kBatch = Traits::kHeadDim <= 32 ? 8 : Traits::kHeadDim <= 128 ? 16 : Traits::kHeadDim <= 192 ? 4 : 2;
    for (int idx = tid; idx < kRows * kQuads; idx += Traits::kNThreads) {
        const int row = idx / kQuads, col = (idx % kQuads) * 4;
        if (row >= seqlen_q) break;  // rows ascend with idx
        merge_split_columns<kBatch>(params, group_row0 + row, head, row, split_rows, col,
                                    out + row * params.o_row_stride, out_lse + row);
    }
}

}  // namespace flash::sm80
