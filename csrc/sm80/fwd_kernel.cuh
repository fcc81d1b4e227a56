// The forward kernel: one thread block per (query tile, head, batch) walks the
// key/value tiles with an online softmax; the [Sq, Sk] score matrix exists only
// one [kBlockM, kBlockN] tile at a time, in registers.
//
// Pipeline (cp.async, two tiles in flight against compute): while S = Q K_j^T
// runs, V_j is loading; while softmax and O += P V_j run, K_{j-1} is loading.
// Key tiles are walked from the last to the first, so that the tiles that need
// a mask at the top (the sequence tail, the causal diagonal, a window's right
// edge) come first, then every whole tile unmasked, then the window's left edge
// masked again (mask.cuh: key_tile_range).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/flash.h"
#include "sm80/gemm.cuh"
#include "sm80/kernel_traits.h"
#include "sm80/kvcache/kv_rows.cuh"
#include "sm80/kvcache/merge.cuh"
#include "common/extras.cuh"
#include "common/mask.cuh"
#include "common/ptx.cuh"
#include "sm80/ptx.cuh"
#include "common/sink.cuh"
#include "common/softmax.cuh"
#include "sm80/tile_copy.cuh"

namespace flash::sm80 {

// Is_kvcache: the keys are read through a cache's indexing (flash.h: pages,
// per batch cache lengths, leftpad, batch index): flash_attn_with_kvcache, whose
// decoding rows may be a GQA group (pack_gqa) and whose blocks, with num_splits
// > 1, each take one range of the key tiles and write a partial result, merged
// by merge_splits_kernel (kvcache/); and paged variable-length batches (one
// split). Is_paged (with Is_kvcache): the keys are always paged (a paged
// variable-length batch), known at compile time.
template <typename Traits, bool Is_local, bool Has_extras, bool Is_kvcache = false, bool Is_paged = false>
__global__ void __launch_bounds__(Traits::kNThreads) fwd_kernel(const FwdParams params) {
    using Element = typename Traits::Element;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kNThreads = Traits::kNThreads;

    extern __shared__ __align__(128) char smem[];
    const uint32_t q_smem = smem_addr(smem + Traits::kSmemQOffset);
    const uint32_t k_smem = smem_addr(smem + Traits::kSmemKOffset);
    const uint32_t v_smem = smem_addr(smem + Traits::kSmemVOffset);

    const int tid = threadIdx.x;
    const int lane = tid % 32;
    const int warp = tid / 32;
    const int warp_row0 = warp * Traits::kWarpRows;  // first row of this warp within the tile

    // O in column chunks (Traits::kVChunked): this block's kHeadDimV columns of
    // V and O from v_col0 on. A query tile's chunks are adjacent blocks, so
    // that they find its Q and K tiles in L2.
    static_assert(!Traits::kVChunked || !Is_kvcache || Is_paged, "no column chunks in split-KV partial results");
    const int v_chunks = Traits::v_chunks(params.head_dim_v);
    const int v_col0 = Traits::kVChunked ? static_cast<int>(blockIdx.x) % v_chunks * Traits::kHeadDimV : 0;
    const int block_x = Traits::kVChunked ? static_cast<int>(blockIdx.x) / v_chunks : static_cast<int>(blockIdx.x);
    const int num_splits = Is_kvcache ? params.num_splits : 1;
    const int split = Is_kvcache ? block_x % num_splits : 0;
    const int m_blocks = static_cast<int>(gridDim.x) / v_chunks / num_splits;
    // Causal tiles on the bottom rows see the most keys: schedule them first.
    const int m_block = Is_local ? m_blocks - 1 - block_x / num_splits : block_x / num_splits;
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    const int head_k = head / params.heads_per_kv_head;
    Sequence seq = sequence_of<Is_kvcache>(params, batch);
    const int seqlen_q = seq.seqlen_q;
    const int m0 = m_block * kBlockM;
    if (m0 >= seqlen_q) return;  // a shorter sequence of a variable-length batch
    const Window window = Is_kvcache ? kvcache_window(params, seq) : window_of(params, seqlen_q, seq.seqlen_k);

    const Element* q = static_cast<const Element*>(params.q_ptr) + batch * params.q_batch_stride +
                       head * params.q_head_stride + (seq.q_start + m0) * params.q_row_stride;
    const KeyValueRows<Element, Is_kvcache, Is_paged, kBlockN> kv(params, seq, batch, head_k,
                                                                  smem + Traits::kSmemBytes, v_col0);

    // With split-KV, this block's share of the tiles.
    const KeyTileRange key_tiles =
        split_key_tiles(key_tile_range<kBlockM, kBlockN>(m0, seqlen_q, window), split, num_splits);
    const ScoreExtras extras(params, batch, head, window.diagonal);
    const bool has_dropout = Has_extras && params.rng_state != nullptr;
    const DropoutRng rng = has_dropout ? DropoutRng(params.rng_state, batch, params.num_heads, head,
                                                    params.dropout_threshold)
                                       : DropoutRng{};

    const TileCopy<typename Traits::QTile, kNThreads> q_copy(tid);
    const TileCopy<typename Traits::KTile, kNThreads> k_copy(tid);
    const TileCopy<typename Traits::VTile, kNThreads> v_copy(tid);
    q_copy.load_async(q_smem, q, params.q_row_stride, seqlen_q - m0, params.head_dim);
    cp_async_commit();
    if (key_tiles.n_end > key_tiles.n_begin) {
        if (kv.paged) {  // the first tile's row addresses, before its rows
            const int n0 = (key_tiles.n_end - 1) * kBlockN;
            kv.template stage_row<kNThreads>(n0, tid, kv.template fetch_row<kNThreads>(n0, tid));
            __syncthreads();
        }
        kv.load_k(k_copy, k_smem, (key_tiles.n_end - 1) * kBlockN);
    }
    cp_async_commit();
    kv.template check_pages<kNThreads>(key_tiles.n_begin, key_tiles.n_end, tid);

    float o[Traits::kMTiles][Traits::kNTilesO][4];
    clear(o);
    OnlineSoftmax<Traits::kMTiles> softmax;
    if (params.learnable_sink != nullptr && num_splits == 1) {
        // The sink joins each row's softmax as its first column (a split's partial result leaves it to
        // the merge of the splits, which adds it once). pack_gqa: KV-cache decoding only, never a paged
        // variable-length batch.
        float sink_log2[Traits::kRowsPerThread];
#pragma unroll
        for (int r = 0; r < Traits::kRowsPerThread; ++r) {
            const int row = m0 + warp_row0 + (r / 2) * 16 + (r % 2) * 8 + lane / 4;
            sink_log2[r] = learnable_sink_log2_of<Is_kvcache && !Is_paged>(params, head, row);
        }
        softmax.start_at_sink(sink_log2, params.softmax_scale_log2, lane);
    }

    // One key tile: the steps of the algorithm, in order.
    auto step = [&](int n_block, auto is_masked) {
        constexpr bool Is_masked = decltype(is_masked)::value;
        const int n0 = n_block * kBlockN;
        // K_j (and Q, the first time) has landed; every warp is done with V_{j+1}.
        cp_async_wait<0>();
        __syncthreads();
        kv.load_v(v_copy, v_smem, n0);
        cp_async_commit();
        // Paged: tile j-1's rows looked up (the block table read under the S GEMM), their addresses
        // staged for K_{j-1} after the next barrier.
        const int next_n0 = n_block > key_tiles.n_begin ? n0 - kBlockN : -1;
        const PagedRow next_row = kv.template fetch_row<kNThreads>(next_n0, tid);

        float s[Traits::kMTiles][Traits::kNTilesS][4];  // S = Q K^T for the warp's rows
        clear(s);
        gemm_smem_smem<Element, Traits::kMTiles, Traits::kNTilesS, Traits::kKStepsQK, typename Traits::QTile,
                       typename Traits::KTile>(s, q_smem, warp_row0, k_smem, 0, lane);
        if constexpr (Has_extras) apply_score_extras<false>(s, extras, m0 + warp_row0, n0, lane);
        if constexpr (Is_masked) apply_mask<Is_local>(s, m0 + warp_row0, n0, window, lane);

        kv.template stage_row<kNThreads>(next_n0, tid, next_row);
        // V_j has landed; every warp is done with K_j, so K_{j-1} may overwrite it.
        cp_async_wait<0>();
        __syncthreads();
        if (n_block > key_tiles.n_begin) kv.load_k(k_copy, k_smem, n0 - kBlockN);
        cp_async_commit();

        softmax.update(s, o, params.softmax_scale_log2);
        if (has_dropout) {
            drop(s, dropout_keep_bits<false, Traits::kMTiles, Traits::kNTilesS>(rng, m0 + warp_row0, n0, lane));
        }
        // O += P V; P stays in registers.
        gemm_regs_smem<Element, Traits::kMTiles, Traits::kNTilesO, Traits::kKStepsPV, typename Traits::VTile>(
            o, s, v_smem, lane);
    };

    int n_block = key_tiles.n_end - 1;
    for (; n_block >= key_tiles.full_end; --n_block) step(n_block, std::true_type{});
    for (; n_block >= key_tiles.full_begin; --n_block) step(n_block, std::false_type{});
    for (; n_block >= key_tiles.n_begin; --n_block) step(n_block, std::true_type{});

    // Epilogue: normalise (the row sums counted every probability, dropped or
    // not: dropout rescales the kept ones by 1 / (1 - p) here), stage O through
    // this warp's rows of the Q tile (no other warp reads them), then store with
    // 16-byte writes.
    float lse[Traits::kRowsPerThread];
    softmax.finalize(o, lse);
    if (has_dropout) scale(o, params.dropout_rescale);

    if (num_splits > 1) {  // a partial result, merged after the last split (kvcache/merge.cuh)
        const int64_t split_row0 =
            ((static_cast<int64_t>(split) * params.batch + batch) * params.num_heads + head) * seqlen_q;
        store_partial_fragment(params, o, lse, split_row0, m0 + warp_row0, seqlen_q, lane);
        cp_async_wait<0>();  // nothing may stay in flight when the block exits
        return;
    }

    cp_async_wait<0>();  // with no key tile the Q copy may still be in flight
    __syncthreads();
    using QTile = typename Traits::QTile;
    store_fragment<Element, QTile>(o, smem + Traits::kSmemQOffset, warp_row0, 0, lane);
#pragma unroll
    for (int r = 0; r < Traits::kRowsPerThread; ++r) {
        const int row = warp_row0 + (r / 2) * 16 + (r % 2) * 8 + lane / 4;
        if (lane % 4 == 0 && m0 + row < seqlen_q && v_col0 == 0) {  // one chunk writes the LSE
            params.lse_ptr[batch * params.lse_batch_stride + head * params.lse_head_stride + seq.q_start + m0 +
                           row] = lse[r];
        }
    }
    __syncthreads();
    Element* out = static_cast<Element*>(params.o_ptr) + batch * params.o_batch_stride +
                   head * params.o_head_stride + (seq.q_start + m0) * params.o_row_stride + v_col0;
    q_copy.store(smem + Traits::kSmemQOffset, out, params.o_row_stride, seqlen_q - m0,
                 min(params.head_dim_v - v_col0, Traits::kHeadDimV));
}

}  // namespace flash::sm80
