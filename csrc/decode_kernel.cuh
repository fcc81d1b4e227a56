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
// memory at the end, as split-KV merges splits.
#pragma once

#include <cmath>
#include <cstdint>

#include "extras.cuh"
#include "flash.h"
#include "gemm.cuh"
#include "kernel_traits.h"
#include "mask.cuh"
#include "ptx.cuh"
#include "softmax.cuh"
#include "tile_copy.cuh"

namespace flash {

// The merge of a group's splits (decode_kernel's last block): each thread
// takes a (row, 4 columns) pair and reads every split's LSE for the row and its
// fp32 partial columns, kBatch splits at a time, all loads of a batch in flight
// at once (the merge is latency-bound: one round trip to L2 per batch), with a
// running maximum: out = sum_s exp(lse_s - m) out_s / sum_s exp(lse_s - m),
// lse = m + log(sum). Splits that saw no key (lse_s = -inf) weigh 0; a row no
// split saw gets out 0 and lse -inf. Partial rows are read through L2 (written
// by other SMs).
template <typename Traits, typename Element>
__device__ __forceinline__ void merge_splits(const FwdParams& params, int64_t group_row0, int64_t split_rows,
                                             int seqlen_q, Element* out, float* out_lse, int tid) {
    constexpr int kQuads = Traits::kHeadDim / 4;
    // Splits per round, as registers allow: 16 up to d128, except at d32, where a
    // thread's one (row, columns) pair lets ptxas unroll the whole merge and 16
    // splits' loads no longer fit without spilling.
    constexpr int kBatch = Traits::kHeadDim <= 32 ? 8 : Traits::kHeadDim <= 128 ? 16 : Traits::kHeadDim <= 192 ? 4 : 2;
    const int num_splits = params.num_splits;
    for (int idx = tid; idx < Traits::kRows * kQuads; idx += Traits::kNThreads) {
        const int row = idx / kQuads, col = (idx % kQuads) * 4;
        if (row >= seqlen_q) break;  // rows ascend with idx
        const bool has_col = col < params.head_dim;
        float max_lse = -INFINITY, sum = 0.f;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int s0 = 0; s0 < num_splits; s0 += kBatch) {
            float l[kBatch];
            float4 o[kBatch];
#pragma unroll
            for (int j = 0; j < kBatch; ++j) {
                const int64_t at = (s0 + j) * split_rows + group_row0 + row;
                const bool valid = s0 + j < num_splits;
                l[j] = valid ? __ldcg(params.lse_accum_ptr + at) : -INFINITY;
                o[j] = valid && has_col ? __ldcg(reinterpret_cast<const float4*>(params.o_accum_ptr + at * params.head_dim + col))
                                        : make_float4(0.f, 0.f, 0.f, 0.f);
            }
            float new_max = max_lse;
#pragma unroll
            for (int j = 0; j < kBatch; ++j) new_max = fmaxf(new_max, l[j]);
            if (new_max == -INFINITY) continue;  // no key seen yet: sum and acc stay 0
            const float rescale = max_lse == -INFINITY ? 0.f : expf(max_lse - new_max);
            sum *= rescale;
            acc.x *= rescale, acc.y *= rescale, acc.z *= rescale, acc.w *= rescale;
#pragma unroll
            for (int j = 0; j < kBatch; ++j) {
                const float w = l[j] == -INFINITY ? 0.f : expf(l[j] - new_max);
                sum += w;
                acc.x += w * o[j].x, acc.y += w * o[j].y, acc.z += w * o[j].z, acc.w += w * o[j].w;
            }
            max_lse = new_max;
        }
        const float inv = sum == 0.f ? 0.f : 1.f / sum;
        if (has_col) {
            *reinterpret_cast<uint2*>(out + row * params.o_row_stride + col) =
                make_uint2(pack2<Element>(acc.x * inv, acc.y * inv), pack2<Element>(acc.z * inv, acc.w * inv));
        }
        if (col == 0) out_lse[row] = sum == 0.f ? -INFINITY : max_lse + logf(sum);
    }
}

template <typename Traits>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kMinBlocksPerSm) decode_kernel(const FwdParams params) {
    using Element = typename Traits::Element;
    using QTile = typename Traits::QTile;
    using KVTile = typename Traits::KVTile;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kStages = Traits::kStages;
    constexpr int kRows = Traits::kRows;
    constexpr int kHeadDim = Traits::kHeadDim;

    extern __shared__ __align__(128) char smem[];
    const uint32_t q_smem = smem_addr(smem);
    const uint32_t stages_smem = smem_addr(smem + Traits::kSmemStagesOffset);

    const int tid = threadIdx.x;
    const int lane = tid % 32;
    const int warp = tid / 32;
    const int split = blockIdx.x;
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    const int head_k = head / params.heads_per_kv_head;

    // Q first: its copy needs no index, so it is in flight while cache_seqlens is read.
    const Element* q =
        static_cast<const Element*>(params.q_ptr) + batch * params.q_batch_stride + head * params.q_head_stride;
    if (tid < Traits::kQCopyThreads) {
        const TileCopy<QTile, Traits::kQCopyThreads> q_copy(tid);
        q_copy.load_async(q_smem, q, params.q_row_stride, params.seqlen_q, params.head_dim);
    }

    Sequence seq = sequence_of<true>(params, batch);
    const Window window = kvcache_window(params, seq);
    const int seqlen_q = seq.seqlen_q, seqlen_k = seq.seqlen_k;
    const KeyTileRange tiles =
        split_key_tiles(key_tile_range<kRows, kBlockN>(0, seqlen_q, window), split, params.num_splits);

    const bool paged = params.block_table != nullptr;
    const Element* k = static_cast<const Element*>(params.k_ptr) + head_k * params.k_head_stride +
                       (paged ? 0 : seq.kv_batch * params.k_batch_stride + seq.k_start * params.k_row_stride);
    const Element* v = static_cast<const Element*>(params.v_ptr) + head_k * params.v_head_stride +
                       (paged ? 0 : seq.kv_batch * params.v_batch_stride + seq.k_start * params.v_row_stride);
    const int* table = paged ? params.block_table + batch * params.block_table_batch_stride : nullptr;

    // Stage s holds K then V of one tile.
    auto k_stage = [&](int s) { return stages_smem + s * Traits::kStageBytes; };
    auto v_stage = [&](int s) { return stages_smem + s * Traits::kStageBytes + KVTile::kBytes; };
    using KVCopy = TileCopy<KVTile, Traits::kNThreads>;
    const KVCopy kv_copy(tid);
    // Paged caches: where each row this thread copies lives (K and V share it),
    // looked up one tile before the copy is issued, in a copy of the block
    // table's entries in shared memory: two windows of kTableWindow entries,
    // the next copied (cp.async, with a tile's group) when the lookups enter
    // the current one. A lookup that read the table itself would wait for its
    // load behind the K/V copies in flight -- the pipeline drained at every
    // new table line (every 8 tiles of 16-row pages). A window spans at least
    // kTableWindow / kBlockN >= kStages tiles, so it has landed when first used.
    // Pages of a power-of-two size divide by a shift.
    constexpr int kWindow = Traits::kTableWindow;
    const uint32_t table_smem = smem_addr(smem + Traits::kSmemTableOffset);
    const int* table_entries = reinterpret_cast<const int*>(smem + Traits::kSmemTableOffset);
    int pages[KVCopy::kPasses], in_page[KVCopy::kPasses];
    const int page_shift = paged && (params.page_size & (params.page_size - 1)) == 0 ? __ffs(params.page_size) - 1 : -1;
    auto entry_of = [&](int row) {  // the table entry of the sequence's key `row`
        const int cache_row = seq.k_start + row;
        return page_shift >= 0 ? cache_row >> page_shift : cache_row / params.page_size;
    };
    // Entries [first_entry, last_entry] are this split's; window w holds
    // first_entry + w * kWindow + [0, kWindow) in half w % 2 of the copy.
    const int first_entry = paged ? entry_of(tiles.n_begin * kBlockN) : 0;
    const int last_entry = paged && seqlen_k > 0 ? entry_of(seqlen_k - 1) : -1;
    int next_window = 2;  // the window the lookups' entry into window next_window - 1 copies
    auto copy_window = [&](int w) {
#pragma unroll
        for (int i = 0; i < kWindow / Traits::kNThreads; ++i) {
            const int at = i * Traits::kNThreads + tid;
            const int entry = first_entry + w * kWindow + at;
            cp_async_4B(table_smem + ((w % 2) * kWindow + at) * 4, table + (entry <= last_entry ? entry : 0),
                        entry <= last_entry);
        }
    };
    auto look_up_pages = [&](int n_block) {
        if (entry_of(n_block * kBlockN) >= first_entry + (next_window - 1) * kWindow) copy_window(next_window++);
#pragma unroll
        for (int pass = 0; pass < KVCopy::kPasses; ++pass) {
            const int row = n_block * kBlockN + kv_copy.row0 + pass * KVCopy::kRowsPerPass;
            if (row < seqlen_k) {
                const int entry = entry_of(row);
                in_page[pass] = seq.k_start + row - entry * params.page_size;
                pages[pass] = table_entries[(entry - first_entry) % (2 * kWindow)];
            }
        }
    };
    auto load_tile = [&](int stage, int n_block) {
        const int n0 = n_block * kBlockN;
        if (paged) {
            // The pages' range check here, where they are used (at the lookup it
            // would wait for the table's load there).
#pragma unroll
            for (int pass = 0; pass < KVCopy::kPasses; ++pass) {
                const int row = n0 + kv_copy.row0 + pass * KVCopy::kRowsPerPass;
                if (row < seqlen_k && (pages[pass] < 0 || pages[pass] >= params.kv_cache_batch)) {
                    index_out_of_range("block_table", batch, (seq.k_start + row) / params.page_size, pages[pass], 0,
                                       params.kv_cache_batch - 1);
                }
            }
            kv_copy.load_async_pages(k_stage(stage), k, params.k_batch_stride, params.k_row_stride, pages, in_page,
                                     seqlen_k - n0, params.head_dim);
            kv_copy.load_async_pages(v_stage(stage), v, params.v_batch_stride, params.v_row_stride, pages, in_page,
                                     seqlen_k - n0, params.head_dim);
        } else {
            kv_copy.load_async(k_stage(stage), k + n0 * params.k_row_stride, params.k_row_stride, seqlen_k - n0,
                               params.head_dim);
            kv_copy.load_async(v_stage(stage), v + n0 * params.v_row_stride, params.v_row_stride, seqlen_k - n0,
                               params.head_dim);
        }
    };

    // Prologue: the first tiles up to kStages - 1 in flight (a commit group per
    // tile, empty past the last, so the wait counts hold); Q, already issued,
    // lands with the first.
    const int n_tiles = tiles.n_end - tiles.n_begin;
    if (paged && n_tiles > 0) {  // the first windows before the first lookups (Q lands with them)
        copy_window(0);
        copy_window(1);
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
    }
#pragma unroll
    for (int t = 0; t < kStages - 1; ++t) {
        if (t < n_tiles) {
            if (paged) look_up_pages(tiles.n_begin + t);
            load_tile(t, tiles.n_begin + t);
        }
        cp_async_commit();
    }
    if (paged && kStages - 1 < n_tiles) look_up_pages(tiles.n_begin + kStages - 1);

    float o[1][Traits::kNTilesO][4];
    clear(o);
    OnlineSoftmax<1> softmax;
    const ScoreExtras extras(params, batch, head, window.diagonal);
    const bool has_extras = extras.softcap || extras.alibi_slope != 0.f;

    for (int t = 0; t < n_tiles; ++t) {
        // Tile t has landed for every thread, and every warp is done with tile
        // t - 1, whose stage the next load overwrites.
        cp_async_wait<kStages - 2>();
        __syncthreads();
        if (t + kStages - 1 < n_tiles) {
            load_tile((t + kStages - 1) % kStages, tiles.n_begin + t + kStages - 1);
            if (paged && t + kStages < n_tiles) look_up_pages(tiles.n_begin + t + kStages);
        }
        cp_async_commit();

        const int stage = t % kStages;
        const int n_block = tiles.n_begin + t;
        const int warp_n0 = n_block * kBlockN + warp * 16;  // this warp's first key
        float s[1][2][4];
        clear(s);
        gemm_smem_smem<Element, 1, 2, Traits::kKSteps, QTile, KVTile>(s, q_smem, 0, k_stage(stage), warp * 16,
                                                                       lane);
        if (has_extras) apply_score_extras<false>(s, extras, 0, warp_n0, lane);
        if (n_block < tiles.full_begin || n_block >= tiles.full_end) apply_mask<true>(s, 0, warp_n0, window, lane);
        softmax.update(s, o, params.softmax_scale_log2);
        // O += P V over the warp's 16 keys: V rows warp * 16 .. + 16 (a whole
        // number of swizzle periods, so only the base moves).
        gemm_regs_smem<Element, 1, Traits::kNTilesO, 1, KVTile>(
            o, s, v_stage(stage) + warp * 16 * KVTile::kBlockRowBytes, lane);
    }

    // Merge the warps: each normalises by its own sum, then weighs its rows by
    // exp(lse_warp - lse_block). LSEs go through the Q tile, the fp32 outputs
    // through the stage buffers (both free once every warp is past the loop).
    float lse[2];
    softmax.finalize(o, lse);
    cp_async_wait<0>();
    __syncthreads();
    float* warp_lse = reinterpret_cast<float*>(smem);                                   // [warp][row]
    float* row_lse = warp_lse + Traits::kNWarps * kRows;                                // [row], the block's
    float* warp_out = reinterpret_cast<float*>(smem + Traits::kSmemStagesOffset);       // [warp][row][col]
    if (lane % 4 == 0) {
        warp_lse[warp * kRows + lane / 4] = lse[0];
        warp_lse[warp * kRows + lane / 4 + 8] = lse[1];
    }
    __syncthreads();
    if (tid < kRows) {
        float max_lse = -INFINITY;
#pragma unroll
        for (int w = 0; w < Traits::kNWarps; ++w) max_lse = fmaxf(max_lse, warp_lse[w * kRows + tid]);
        float sum = 0.f;
#pragma unroll
        for (int w = 0; w < Traits::kNWarps; ++w) {
            const float l = warp_lse[w * kRows + tid];
            sum += l == -INFINITY ? 0.f : expf(l - max_lse);
        }
        row_lse[tid] = sum == 0.f ? -INFINITY : max_lse + logf(sum);
    }
    __syncthreads();
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = lane / 4 + half * 8;
        const float weight = lse[half] == -INFINITY ? 0.f : expf(lse[half] - row_lse[row]);
        float* dst = warp_out + (warp * kRows + row) * kHeadDim + (lane % 4) * 2;
#pragma unroll
        for (int j = 0; j < Traits::kNTilesO; ++j) {
            *reinterpret_cast<float2*>(dst + j * 8) = make_float2(o[0][j][2 * half] * weight,
                                                                  o[0][j][2 * half + 1] * weight);
        }
    }
    __syncthreads();

    // Sum the warps' rows and store: out and lse with one split, otherwise the
    // split's fp32 partial rows.
    const bool partial = params.num_splits > 1;
    const int64_t group_row0 = (static_cast<int64_t>(batch) * params.num_heads + head) * seqlen_q;
    const int64_t split_rows = static_cast<int64_t>(params.batch) * params.num_heads * seqlen_q;
    const int64_t accum_row0 = split * split_rows + group_row0;
    Element* out = static_cast<Element*>(params.o_ptr) + batch * params.o_batch_stride + head * params.o_head_stride;
    float* out_lse = params.lse_ptr + batch * params.lse_batch_stride + head * params.lse_head_stride;
    constexpr int kQuads = kHeadDim / 4;  // 4 columns per thread and step
    for (int idx = tid; idx < kRows * kQuads; idx += Traits::kNThreads) {
        const int row = idx / kQuads, col = (idx % kQuads) * 4;
        if (row >= seqlen_q || col >= params.head_dim) continue;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int w = 0; w < Traits::kNWarps; ++w) {
            const float4 part = *reinterpret_cast<const float4*>(warp_out + (w * kRows + row) * kHeadDim + col);
            acc.x += part.x, acc.y += part.y, acc.z += part.z, acc.w += part.w;
        }
        if (partial) {
            *reinterpret_cast<float4*>(params.o_accum_ptr + (accum_row0 + row) * params.head_dim + col) = acc;
        } else {
            *reinterpret_cast<uint2*>(out + row * params.o_row_stride + col) =
                make_uint2(pack2<Element>(acc.x, acc.y), pack2<Element>(acc.z, acc.w));
        }
    }
    if (tid < seqlen_q) (partial ? params.lse_accum_ptr[accum_row0 + tid] : out_lse[tid]) = row_lse[tid];
    if (!partial) return;

    // The last of the group's splits to finish merges them all (the partial
    // rows of every split are then written and visible): lse = log sum_s
    // exp(lse_s), out = sum_s exp(lse_s - lse) * out_s; splits that saw no key
    // (lse_s = -inf) weigh 0, a row no split saw gets out 0 and lse -inf.
    // The barrier, then one thread's acquire-release add, publishes the block's
    // partial rows and, in the last block, makes every other block's visible.
    __syncthreads();
    int* is_last = reinterpret_cast<int*>(smem);
    if (tid == 0) {
        unsigned int* counter = params.split_counters + static_cast<int64_t>(batch) * params.num_heads + head;
        const bool last = atomic_add_acq_rel(counter, 1u) == static_cast<unsigned int>(params.num_splits) - 1;
        if (last) *counter = 0;  // every split has counted: zero again for the next call
        *is_last = last;
    }
    __syncthreads();
    if (!*is_last) return;
    merge_splits<Traits>(params, group_row0, split_rows, seqlen_q, out, out_lse, tid);
}

}  // namespace flash
