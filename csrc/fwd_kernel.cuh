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
#include "kernel_traits.h"
#include "mask.cuh"
#include "ptx.cuh"
#include "softmax.cuh"

namespace flash {

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

// S = Q K^T for the warp's rows: Q [kWarpRows, D] from rows q_row0.. of the Q
// tile, K [kBlockN, D] the whole K tile.
template <typename Traits>
__device__ __forceinline__ void gemm_qk(float (&s)[Traits::kMTiles][Traits::kNTilesS][4], uint32_t q_smem,
                                        uint32_t k_smem, int q_row0, int lane) {
    using QTile = typename Traits::QTile;
    using KTile = typename Traits::KTile;
#pragma unroll
    for (int mt = 0; mt < Traits::kMTiles; ++mt)
#pragma unroll
        for (int j = 0; j < Traits::kNTilesS; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[mt][j][e] = 0.f;

    // ldmatrix.x4 lane roles. A (Q): matrices {rows 0-7, 8-15} x {k 0-7, 8-15};
    // B (K, stored [key][d], i.e. already "col"): matrices {keys 0-7} x {k 0-7, 8-15},
    // then {keys 8-15} x {k 0-7, 8-15}.
    const auto q_lane = QTile::lane_offsets(q_row0 + lane % 16, lane / 16);
    const auto k_lane = KTile::lane_offsets((lane / 16) * 8 + lane % 8, (lane / 8) % 2);
#pragma unroll
    for (int kk = 0; kk < Traits::kKStepsQK; ++kk) {
        uint32_t a[Traits::kMTiles][4];
#pragma unroll
        for (int mt = 0; mt < Traits::kMTiles; ++mt) {
            ldmatrix_x4(a[mt], q_smem + QTile::offset(q_lane, mt * 16, kk * 2));
        }
#pragma unroll
        for (int jp = 0; jp < Traits::kNTilesS / 2; ++jp) {
            uint32_t b[4];
            ldmatrix_x4(b, k_smem + KTile::offset(k_lane, jp * 16, kk * 2));
            const uint32_t b_lo[2] = {b[0], b[1]};
            const uint32_t b_hi[2] = {b[2], b[3]};
#pragma unroll
            for (int mt = 0; mt < Traits::kMTiles; ++mt) {
                mma_m16n8k16<typename Traits::Element>(s[mt][2 * jp], a[mt], b_lo);
                mma_m16n8k16<typename Traits::Element>(s[mt][2 * jp + 1], a[mt], b_hi);
            }
        }
    }
}

// O += P V. P stays in registers: the fp32 accumulator fragment of S, rounded
// to 16 bits, is exactly the A-operand fragment of the next mma (n8 tiles 2kk and
// 2kk+1 of S form the k16 step kk).
template <typename Traits>
__device__ __forceinline__ void gemm_pv(float (&o)[Traits::kMTiles][Traits::kNTilesO][4],
                                        const float (&p)[Traits::kMTiles][Traits::kNTilesS][4],
                                        uint32_t v_smem, int lane) {
    using Element = typename Traits::Element;
    using VTile = typename Traits::VTile;
    // ldmatrix.x4.trans on V stored [key][d]: matrices {keys 0-7, 8-15} x {d 0-7},
    // then {keys 0-7, 8-15} x {d 8-15}; .trans hands each lane two keys of one d.
    const auto v_lane = VTile::lane_offsets(((lane / 8) % 2) * 8 + lane % 8, lane / 16);
#pragma unroll
    for (int kk = 0; kk < Traits::kKStepsPV; ++kk) {
        uint32_t a[Traits::kMTiles][4];
#pragma unroll
        for (int mt = 0; mt < Traits::kMTiles; ++mt) {
            a[mt][0] = pack2<Element>(p[mt][2 * kk][0], p[mt][2 * kk][1]);
            a[mt][1] = pack2<Element>(p[mt][2 * kk][2], p[mt][2 * kk][3]);
            a[mt][2] = pack2<Element>(p[mt][2 * kk + 1][0], p[mt][2 * kk + 1][1]);
            a[mt][3] = pack2<Element>(p[mt][2 * kk + 1][2], p[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < Traits::kNTilesO / 2; ++dp) {
            uint32_t b[4];
            ldmatrix_x4_trans(b, v_smem + VTile::offset(v_lane, kk * 16, dp * 2));
            const uint32_t b_lo[2] = {b[0], b[1]};
            const uint32_t b_hi[2] = {b[2], b[3]};
#pragma unroll
            for (int mt = 0; mt < Traits::kMTiles; ++mt) {
                mma_m16n8k16<Element>(o[mt][2 * dp], a[mt], b_lo);
                mma_m16n8k16<Element>(o[mt][2 * dp + 1], a[mt], b_hi);
            }
        }
    }
}

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

    // Key tiles [0, n_blocks) hold every key some row of this tile sees; tiles
    // [n_unmasked, n_blocks) need a mask (sequence tail, causal diagonal).
    int n_blocks = (seqlen_k + kBlockN - 1) / kBlockN;
    int n_unmasked = seqlen_k / kBlockN;
    if (Is_causal) {
        const int diag = m0 + seqlen_k - seqlen_q;  // last key row m0 sees
        // One past the last key that the tile's last real row sees.
        const int last_key_end = min(m0 + kBlockM, seqlen_q) + seqlen_k - seqlen_q;
        n_blocks = min(n_blocks, last_key_end <= 0 ? 0 : (last_key_end + kBlockN - 1) / kBlockN);
        n_unmasked = min(n_unmasked, diag + 1 <= 0 ? 0 : (diag + 1) / kBlockN);
    }

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
#pragma unroll
    for (int mt = 0; mt < Traits::kMTiles; ++mt)
#pragma unroll
        for (int j = 0; j < Traits::kNTilesO; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[mt][j][e] = 0.f;
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

        float s[Traits::kMTiles][Traits::kNTilesS][4];
        gemm_qk<Traits>(s, q_smem, k_smem, warp_row0, lane);
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
        gemm_pv<Traits>(o, s, v_smem, lane);
    };

    int n_block = n_blocks - 1;
    for (; n_block >= n_unmasked; --n_block) step(n_block, std::true_type{});
    for (; n_block >= 0; --n_block) step(n_block, std::false_type{});

    // Epilogue: normalise, stage O through this warp's rows of the Q tile (no
    // other warp reads them), then store with 16-byte writes.
    float lse[Traits::kRowsPerThread];
    softmax.finalize(o, params.softmax_scale, lse);

    cp_async_wait<0>();  // with no key tile the Q copy may still be in flight
    __syncthreads();
    using QTile = typename Traits::QTile;
    const int g = lane / 4;
#pragma unroll
    for (int mt = 0; mt < Traits::kMTiles; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = warp_row0 + mt * 16 + half * 8 + g;
#pragma unroll
            for (int j = 0; j < Traits::kNTilesO; ++j) {
                *reinterpret_cast<uint32_t*>(smem + Traits::kSmemQOffset + QTile::offset(row, j) +
                                             (lane % 4) * 4) =
                    pack2<Element>(o[mt][j][2 * half], o[mt][j][2 * half + 1]);
            }
            if (lane % 4 == 0 && m0 + row < seqlen_q) {
                params.lse_ptr[(static_cast<int64_t>(batch) * params.num_heads + head) * seqlen_q + m0 + row] =
                    lse[mt * 2 + half];
            }
        }
    }
    __syncthreads();
    Element* out = static_cast<Element*>(params.o_ptr) + batch * params.o_batch_stride +
                   head * params.o_head_stride + m0 * params.o_row_stride;
    q_copy.store(smem + Traits::kSmemQOffset, out, params.o_row_stride, seqlen_q - m0, params.head_dim);
}

}  // namespace flash
