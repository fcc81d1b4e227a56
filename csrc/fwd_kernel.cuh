// The forward kernel: one thread block per (query tile, head, batch) walks the
// key/value tiles with an online softmax; the [Sq, Sk] score matrix exists only
// one [kBlockM, kBlockN] tile at a time, in registers.
//
// Pipeline (cp.async, two tiles in flight against compute): while S = Q K_j^T
// runs, V_j is loading; while softmax and O += P V_j run, K_{j-1} is loading.
// Key tiles are walked from the last to the first, so that the few tiles that
// need a mask (the sequence tail and, when causal, the diagonal) come first and
// every later tile runs the unmasked path.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "flash.h"
#include "gemm.cuh"
#include "kernel_traits.h"
#include "mask.cuh"
#include "ptx.cuh"
#include "softmax.cuh"
#include "tile_copy.cuh"

namespace flash {

template <typename Traits, bool Is_causal>
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

    // Causal tiles on the bottom rows see the most keys: schedule them first.
    const int m_block = Is_causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    const int head_k = head / params.heads_per_kv_head;
    const int seqlen_q = params.seqlen_q;
    const int seqlen_k = params.seqlen_k;
    const int m0 = m_block * kBlockM;

    const Element* q = static_cast<const Element*>(params.q_ptr) + batch * params.q_batch_stride +
                       head * params.q_head_stride + m0 * params.q_row_stride;
    const Element* k = static_cast<const Element*>(params.k_ptr) + batch * params.k_batch_stride +
                       head_k * params.k_head_stride;
    const Element* v = static_cast<const Element*>(params.v_ptr) + batch * params.v_batch_stride +
                       head_k * params.v_head_stride;

    const KeyTileRange key_tiles = key_tile_range<Is_causal, kBlockM, kBlockN>(m0, seqlen_q, seqlen_k);
    const int n_blocks = key_tiles.n_blocks, n_unmasked = key_tiles.n_unmasked;

    const TileCopy<typename Traits::QTile, kNThreads> q_copy(tid);
    const TileCopy<typename Traits::KTile, kNThreads> kv_copy(tid);  // K and V tiles share a shape
    q_copy.load_async(q_smem, q, params.q_row_stride, seqlen_q - m0, params.head_dim);
    cp_async_commit();
    if (n_blocks > 0) {
        kv_copy.load_async(k_smem, k + (n_blocks - 1) * kBlockN * params.k_row_stride, params.k_row_stride,
                           seqlen_k - (n_blocks - 1) * kBlockN, params.head_dim);
    }
    cp_async_commit();

    float o[Traits::kMTiles][Traits::kNTilesO][4];
    clear(o);
    OnlineSoftmax<Traits::kMTiles> softmax;

    // One key tile: the steps of the algorithm, in order.
    auto step = [&](int n_block, auto is_masked) {
        constexpr bool Is_masked = decltype(is_masked)::value;
        const int n0 = n_block * kBlockN;
        // K_j (and Q, the first time) has landed; every warp is done with V_{j+1}.
        cp_async_wait<0>();
        __syncthreads();
        kv_copy.load_async(v_smem, v + n0 * params.v_row_stride, params.v_row_stride, seqlen_k - n0,
                           params.head_dim);
        cp_async_commit();

        float s[Traits::kMTiles][Traits::kNTilesS][4];  // S = Q K^T for the warp's rows
        clear(s);
        gemm_smem_smem<Element, Traits::kMTiles, Traits::kNTilesS, Traits::kKStepsQK, typename Traits::QTile,
                       typename Traits::KTile>(s, q_smem, warp_row0, k_smem, 0, lane);
        if constexpr (Is_masked) {
            apply_mask<Is_causal>(s, m0 + warp_row0, n0, seqlen_q, seqlen_k, lane);
        }

        // V_j has landed; every warp is done with K_j, so K_{j-1} may overwrite it.
        cp_async_wait<0>();
        __syncthreads();
        if (n_block > 0) {
            kv_copy.load_async(k_smem, k + (n0 - kBlockN) * params.k_row_stride, params.k_row_stride,
                               seqlen_k - (n0 - kBlockN), params.head_dim);
        }
        cp_async_commit();

        softmax.update(s, o, params.softmax_scale_log2);
        // O += P V; P stays in registers.
        gemm_regs_smem<Element, Traits::kMTiles, Traits::kNTilesO, Traits::kKStepsPV, typename Traits::VTile>(
            o, s, v_smem, lane);
    };

    int n_block = n_blocks - 1;
    for (; n_block >= n_unmasked; --n_block) step(n_block, std::true_type{});
    for (; n_block >= 0; --n_block) step(n_block, std::false_type{});

    // Epilogue: normalise, stage O through this warp's rows of the Q tile (no
    // other warp reads them), then store with 16-byte writes.
    float lse[Traits::kRowsPerThread];
    softmax.finalize(o, lse);

    cp_async_wait<0>();  // with no key tile the Q copy may still be in flight
    __syncthreads();
    using QTile = typename Traits::QTile;
    store_fragment<Element, QTile>(o, smem + Traits::kSmemQOffset, warp_row0, 0, lane);
#pragma unroll
    for (int r = 0; r < Traits::kRowsPerThread; ++r) {
        const int row = warp_row0 + (r / 2) * 16 + (r % 2) * 8 + lane / 4;
        if (lane % 4 == 0 && m0 + row < seqlen_q) {
            params.lse_ptr[(static_cast<int64_t>(batch) * params.num_heads + head) * seqlen_q + m0 + row] = lse[r];
        }
    }
    __syncthreads();
    Element* out = static_cast<Element*>(params.o_ptr) + batch * params.o_batch_stride +
                   head * params.o_head_stride + m0 * params.o_row_stride;
    q_copy.store(smem + Traits::kSmemQOffset, out, params.o_row_stride, seqlen_q - m0, params.head_dim);
}

}  // namespace flash
