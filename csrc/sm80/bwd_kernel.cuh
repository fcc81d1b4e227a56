// The backward kernels. Nothing of size [Sq, Sk] is stored: each recomputes
// the probabilities of one tile from Q, K and the forward's log-sum-exp,
// P = exp(S * scale - lse), and folds the tile into its gradients:
//   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - D),  dK = scale * dS^T Q,  dQ = scale * dS K,
// with D = rowsum(dO * O) from the preprocess kernel (minus the LSE's gradient
// where one is given: d lse_i / d s_ij = P_ij). A learnable sink needs nothing
// here: the forward's lse includes it, so P is recomputed as the forward
// normalised it, and the sink's own gradient comes from the preprocess's
// rows (bwd_rows.cu). The dK/dV kernel owns a
// tile of keys and walks the query tiles. dQ either comes out of that same
// walk, each block adding its share with fp32 atomics into a zeroed buffer
// (five GEMMs per tile, like FlashAttention-2; the order of the additions,
// hence the rounding, varies run to run), or, for deterministic=True, from a
// dQ kernel that owns a tile of queries and walks the key tiles (recomputing
// S and dP: seven GEMMs, bitwise reproducible).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/flash.h"
#include "sm80/gemm.cuh"
#include "sm80/kernel_traits.h"
#include "common/extras.cuh"
#include "common/mask.cuh"
#include "common/ptx.cuh"
#include "common/softmax.cuh"
#include "sm80/ptx.cuh"
#include "sm80/tile_copy.cuh"

namespace flash::sm80 {

__device__ __forceinline__ float lse_log2_of_row(const float* lse_row, int row, int seqlen_q) {
    return lse_to_log2(row < seqlen_q ? lse_row[row] : -INFINITY);
}

// The preprocess: D[b, h, i] = sum_d dO[b, i, h, d] * O[b, i, h, d] - dlse[b,
// h, i] in fp32 (the LSE's gradient, where there is one, folds into D: flash.h,
// BwdParams::dlse_ptr; a row whose lse is -inf saw no key and drops its dlse,
// NaN or not), and dq_accum zeroed where the call has one (flash.h:
// BwdWorkspace). A thread per 16-byte chunk of a row (8 elements; the head dims
// are multiples of 8): 1 << lanes_log2 consecutive lanes take a row (the
// chunks of head_dim_v rounded up to a power of two, at most 32, each lane its
// chunks lane, lane + lanes, ...), rows in (batch, query, head) order, the
// order of a contiguous dout and out in memory, so that a warp reads whole
// lines (one warp a row, as this kernel had, left 3/4 of its lanes idle at
// d64 and read at half of what d128 did: NOTES.md); then each thread zeroes
// its share of dq_accum's 16-byte chunks. A variable-length batch runs as one
// sequence of total_q rows, which writes D in lse's [H, total_q] layout; lse
// and dlse are contiguous in that layout too.
constexpr int kPreprocessThreads = 256;

template <typename Element>
__global__ void __launch_bounds__(kPreprocessThreads) bwd_dot_do_o_kernel(const BwdParams params, int lanes_log2) {
    const int lanes = 1 << lanes_log2;
    const int64_t thread = static_cast<int64_t>(blockIdx.x) * kPreprocessThreads + threadIdx.x;
    const int64_t rows = static_cast<int64_t>(params.batch) * params.num_heads * params.seqlen_q;
    const int64_t row = thread >> lanes_log2;  // (b * Sq + i) * H + h
    const int lane = static_cast<int>(thread & (lanes - 1));
    const int h = static_cast<int>(row % params.num_heads);
    const int64_t bi = row / params.num_heads;
    const int i = static_cast<int>(bi % params.seqlen_q);
    const int b = static_cast<int>(bi / params.seqlen_q);
    float sum = 0.f;
    if (row < rows) {
        const Element* dout = static_cast<const Element*>(params.do_ptr) + b * params.do_batch_stride +
                              i * params.do_row_stride + h * params.do_head_stride;
        const Element* out = static_cast<const Element*>(params.o_ptr) + b * params.o_batch_stride +
                             i * params.o_row_stride + h * params.o_head_stride;
        for (int col = lane * 8; col < params.head_dim_v; col += lanes * 8) {
            const uint4 d4 = *reinterpret_cast<const uint4*>(dout + col);
            const uint4 o4 = *reinterpret_cast<const uint4*>(out + col);
            const uint32_t d_words[4] = {d4.x, d4.y, d4.z, d4.w};
            const uint32_t o_words[4] = {o4.x, o4.y, o4.z, o4.w};
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                const float2 d2 = unpack2<Element>(d_words[w]);
                const float2 o2 = unpack2<Element>(o_words[w]);
                sum += d2.x * o2.x + d2.y * o2.y;
            }
        }
    }
    // Every lane of the warp shuffles (a partial last warp's lanes past the rows add zeros).
    for (int offset = lanes / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (row < rows && lane == 0) {
        const int64_t at = (static_cast<int64_t>(b) * params.num_heads + h) * params.seqlen_q + i;
        if (params.dlse_ptr != nullptr && params.lse_ptr[at] != -INFINITY) sum -= params.dlse_ptr[at];
        params.dsum_ptr[at] = sum;
    }
    if (params.dq_accum_ptr != nullptr) {  // [rows, head_dim] fp32, contiguous
        const int64_t chunks = rows * (params.head_dim / 4);
        const int64_t threads = static_cast<int64_t>(gridDim.x) * kPreprocessThreads;
        for (int64_t c = thread; c < chunks; c += threads) {
            reinterpret_cast<float4*>(params.dq_accum_ptr)[c] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
}

// p = exp2(s * scale_log2 - lse_log2) in place on a transposed score fragment
// (columns are queries), lse_log2_smem starting at the warp's first query.
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void probs_from_scores_by_column(float (&s)[kMTiles][kNTiles][4],
                                                            const float* lse_log2_smem, float scale_log2, int lane) {
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float lse_log2 = lse_log2_smem[j * 8 + (lane % 4) * 2 + e % 2];
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) {
                s[mt][j][e] = exp2_approx(fmaf(s[mt][j][e], scale_log2, -lse_log2));
            }
        }
    }
}

// Adds this step's dQ share, dS [queries, keys] K [keys, D], to the fp32 dQ
// buffer, from the dS^T tile in shared memory: units of kDqRows queries x
// kDqCols columns, dealt round-robin to the warps.
template <typename Traits>
__device__ __forceinline__ void add_dq_share(float* dq_accum, int64_t dq_row_stride, int m0, int seqlen_q,
                                             int head_dim, uint32_t ds_smem, uint32_t k_smem, int warp, int lane) {
    using Element = typename Traits::Element;
    constexpr int kMTiles = Traits::kDqRows / 16;
    constexpr int kNTiles = Traits::kDqCols / 8;
    // Run-time unit indices keep one copy of the GEMM in the step's code.
#pragma unroll 1
    for (int unit = warp; unit < Traits::kDqUnits; unit += Traits::kNWarps) {
        const int q0 = (unit % Traits::kDqRowUnits) * Traits::kDqRows;
        const int col0 = (unit / Traits::kDqRowUnits) * Traits::kDqCols;
        if (col0 >= head_dim) continue;  // the compiled head dim's padding columns: no dQ there
        float acc[kMTiles][kNTiles][4];
        clear(acc);
        gemm_smem_kn<Element, true, kMTiles, kNTiles, Traits::kKStepsOwn, typename Traits::ScoreTile,
                     typename Traits::OwnTile>(acc, ds_smem, q0, k_smem, col0 / 8, opaque(lane));
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int row = m0 + q0 + mt * 16 + half * 8 + lane / 4;
                if (row >= seqlen_q) continue;
                float* dst = dq_accum + row * dq_row_stride + col0 + (lane % 4) * 2;
#pragma unroll
                for (int j = 0; j < kNTiles; ++j) {
                    if (col0 + j * 8 >= head_dim) break;  // head_dim is a multiple of 8
#if __CUDA_ARCH__ >= 900
                    atomicAdd(reinterpret_cast<float2*>(dst + j * 8),
                              make_float2(acc[mt][j][2 * half], acc[mt][j][2 * half + 1]));
#else
                    atomicAdd(dst + j * 8, acc[mt][j][2 * half]);
                    atomicAdd(dst + j * 8 + 1, acc[mt][j][2 * half + 1]);
#endif
                }
            }
        }
    }
}

// The dK/dV kernel's shared memory (BwdKernelTraits): the block's K and V tiles
// (read by every step, then reused to stage dK and dV on the way out; V's is
// kHeadDimV wide), kStages stages of Q and dO (dO's kHeadDimV wide), the
// step's query rows' lse and D, and the step's P^T and dS^T tiles, which the
// dV, dK and dQ GEMMs read back.
template <typename Traits>
struct DkDvSmem {
    // Generic pointers for the fragment stores and the final copy out; shared-
    // space addresses for cp.async and ldmatrix.
    char* k_smem_ptr;
    char* v_smem_ptr;
    char* p_smem_ptr;   // P^T [keys, queries] of the step
    char* ds_smem_ptr;  // dS^T [keys, queries] of the step
    uint32_t k_smem;
    uint32_t v_smem;
    uint32_t q_smem0;  // stage s: + s * kSmemStageBytes
    uint32_t do_smem0;
    float* lse_log2_smem;  // [kStreamRows]
    float* dsum_smem;      // [kStreamRows]

    __device__ __forceinline__ explicit DkDvSmem(char* smem)
        : k_smem_ptr(smem + Traits::kSmemOwnOffset0),
          v_smem_ptr(smem + Traits::kSmemOwnOffset1),
          p_smem_ptr(smem + Traits::kSmemPOffset),
          ds_smem_ptr(smem + Traits::kSmemDsOffset),
          k_smem(smem_addr(k_smem_ptr)),
          v_smem(smem_addr(v_smem_ptr)),
          q_smem0(smem_addr(smem + Traits::kSmemStreamOffset0)),
          do_smem0(smem_addr(smem + Traits::kSmemStreamOffset1)),
          lse_log2_smem(reinterpret_cast<float*>(smem + Traits::kSmemRowStatsOffset)),
          dsum_smem(lse_log2_smem + Traits::kStreamRows) {}

    __device__ __forceinline__ uint32_t q_stage(int stage) const { return q_smem0 + stage * Traits::kSmemStageBytes; }
    __device__ __forceinline__ uint32_t do_stage(int stage) const { return do_smem0 + stage * Traits::kSmemStageBytes; }
};

// This thread's place in the dK/dV kernel's warp grid (BwdKernelTraits): its
// warp's keys (rows of S^T, dK and dV), queries (columns of S^T) and head-dim
// chunks (n8 tiles of dK, and of dV, which is kHeadDimV wide).
template <typename Traits>
struct DkDvWarp {
    static constexpr int kWarpKeys = 32;  // two m16 tiles, so each operand read serves both
    static constexpr int kKeyMTiles = kWarpKeys / 16;

    int lane, warp;
    int key_row0;    // of the K tile
    int query_col0;  // of the streamed Q tile
    int d_chunk0;   // of dK
    int dv_chunk0;  // of dV

    __device__ __forceinline__ explicit DkDvWarp(int tid)
        : lane(tid % 32),
          warp(tid / 32),
          key_row0((warp / Traits::kQueryWarps) * kWarpKeys),
          query_col0((warp % Traits::kQueryWarps) * Traits::kWarpQueries),
          d_chunk0((warp % Traits::kQueryWarps) * Traits::kNTilesDk),
          dv_chunk0((warp % Traits::kQueryWarps) * Traits::kNTilesDv) {}
};

// Starts the copies of the block's K and V tiles (keys n0 .. n0 + kOwnRows of
// KV head head_k): they stay in shared memory for the whole walk.
template <typename Traits>
__device__ __forceinline__ void load_key_value_tiles_async(
    const BwdParams& params, const TileCopy<typename Traits::OwnTile, Traits::kNThreads>& own_copy,
    const TileCopy<typename Traits::OwnTileV, Traits::kNThreads>& own_copy_v, const DkDvSmem<Traits>& tiles,
    int batch, int head_k, const Sequence& seq, int n0) {
    using Element = typename Traits::Element;
    const Element* k = static_cast<const Element*>(params.k_ptr) + batch * params.k_batch_stride +
                       head_k * params.k_head_stride + (seq.k_start + n0) * params.k_row_stride;
    const Element* v = static_cast<const Element*>(params.v_ptr) + batch * params.v_batch_stride +
                       head_k * params.v_head_stride + (seq.k_start + n0) * params.v_row_stride;
    own_copy.load_async(tiles.k_smem, k, params.k_row_stride, seq.seqlen_k - n0, params.head_dim);
    own_copy_v.load_async(tiles.v_smem, v, params.v_row_stride, seq.seqlen_k - n0, params.head_dim_v);
}

// Starts a step's Q and dO copies (queries m0 .. m0 + kStreamRows of query head
// `head`) into `stage`, and loads its rows' lse and D into registers, one row
// per thread: they go to shared memory only when the step begins, since the
// step before may still be reading its own.
template <typename Traits>
__device__ __forceinline__ void load_query_tiles_async(
    const BwdParams& params, const TileCopy<typename Traits::StreamTile, Traits::kNThreads>& stream_copy,
    const TileCopy<typename Traits::StreamTileV, Traits::kNThreads>& stream_copy_v, const DkDvSmem<Traits>& tiles,
    int stage, int batch, int head, const Sequence& seq, int m0, int tid, float& step_lse, float& step_dsum) {
    using Element = typename Traits::Element;
    const Element* q = static_cast<const Element*>(params.q_ptr) + batch * params.q_batch_stride +
                       head * params.q_head_stride + (seq.q_start + m0) * params.q_row_stride;
    const Element* dout = static_cast<const Element*>(params.do_ptr) + batch * params.do_batch_stride +
                          head * params.do_head_stride + (seq.q_start + m0) * params.do_row_stride;
    stream_copy.load_async(tiles.q_stage(stage), q, params.q_row_stride, seq.seqlen_q - m0, params.head_dim);
    stream_copy_v.load_async(tiles.do_stage(stage), dout, params.do_row_stride, seq.seqlen_q - m0,
                             params.head_dim_v);
    if (tid < Traits::kStreamRows) {
        const int64_t row = batch * params.lse_batch_stride + head * params.lse_head_stride + seq.q_start + m0 + tid;
        const bool valid = m0 + tid < seq.seqlen_q;
        step_lse = valid ? params.lse_ptr[row] : -INFINITY;
        step_dsum = valid ? params.dsum_ptr[row] : 0.f;
    }
}

// The step's P^T for the warp's keys and queries: S^T = K Q^T, softcap and
// ALiBi (dtanh gets softcap's chain factor), dropout's keep bits, the mask
// where the tile needs one, then p = exp2(s * scale_log2 - lse_log2).
template <typename Traits, bool Is_local, bool Has_extras, bool Is_masked>
__device__ __forceinline__ void probs_transposed(
    float (&p)[DkDvWarp<Traits>::kKeyMTiles][Traits::kNTilesS][4],
    float (&dtanh)[Has_extras ? DkDvWarp<Traits>::kKeyMTiles : 1][Traits::kNTilesS][4], uint64_t& keep_bits,
    const BwdParams& params, const DkDvSmem<Traits>& tiles, const DkDvWarp<Traits>& warp_tile, uint32_t q_smem,
    int batch, int head, const Window& window, int n0, int m0, bool has_dropout) {
    using Element = typename Traits::Element;
    constexpr int kKeyMTiles = DkDvWarp<Traits>::kKeyMTiles;
    constexpr int kNTilesS = Traits::kNTilesS;
    const int key_row0 = warp_tile.key_row0;
    const int query_col0 = warp_tile.query_col0;
    const int lane = warp_tile.lane;
    clear(p);
    gemm_smem_smem<Element, kKeyMTiles, kNTilesS, Traits::kKStepsD, typename Traits::OwnTile,
                   typename Traits::StreamTile>(p, tiles.k_smem, key_row0, q_smem, query_col0, opaque(lane));
    if constexpr (Has_extras) {
        apply_score_extras<true>(p, ScoreExtras(params, batch, head, window.diagonal), n0 + key_row0,
                                 m0 + query_col0, lane, dtanh);
        if (has_dropout) {
            const DropoutRng rng(params.rng_state, batch, params.num_heads, head, params.dropout_threshold);
            keep_bits = dropout_keep_bits<true, kKeyMTiles, kNTilesS>(rng, n0 + key_row0, m0 + query_col0, lane);
        }
    }
    if constexpr (Is_masked) apply_mask_transposed<Is_local>(p, n0 + key_row0, m0 + query_col0, window, lane);
    probs_from_scores_by_column(p, tiles.lse_log2_smem + query_col0, params.softmax_scale_log2, lane);
}

// The warp's part of the step's P^T tile, for dV += P^T dO: only the kept
// elements under dropout (dV takes 1 / (1 - p) once, at the end).
template <typename Traits>
__device__ __forceinline__ void store_probs_transposed(
    const float (&p)[DkDvWarp<Traits>::kKeyMTiles][Traits::kNTilesS][4], uint64_t keep_bits, bool has_dropout,
    const DkDvSmem<Traits>& tiles, const DkDvWarp<Traits>& warp_tile) {
    using Element = typename Traits::Element;
    using ScoreTile = typename Traits::ScoreTile;
    constexpr int kKeyMTiles = DkDvWarp<Traits>::kKeyMTiles;
    constexpr int kNTilesS = Traits::kNTilesS;
    const int key_row0 = warp_tile.key_row0;
    const int query_col0 = warp_tile.query_col0;
    const int lane = warp_tile.lane;
    if (has_dropout) {
        float p_kept[kKeyMTiles][kNTilesS][4];
#pragma unroll
        for (int mt = 0; mt < kKeyMTiles; ++mt)
#pragma unroll
            for (int j = 0; j < kNTilesS; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) p_kept[mt][j][e] = kept(keep_bits, mt, j, e, kNTilesS) ? p[mt][j][e] : 0.f;
        store_fragment<Element, ScoreTile>(p_kept, tiles.p_smem_ptr, key_row0, query_col0 / 8, lane);
    } else {
        store_fragment<Element, ScoreTile>(p, tiles.p_smem_ptr, key_row0, query_col0 / 8, lane);
    }
}

// The warp's part of the step's dS^T tile, for dK += dS^T Q and dQ += dS K:
// dP^T = V dO^T, then dS^T = P^T * (dP^T - D) (dP^T of a dropped element is 0,
// of a kept one scaled by 1 / (1 - p)), times softcap's 1 - tanh^2.
template <typename Traits, bool Has_extras>
__device__ __forceinline__ void store_ds_transposed(
    const float (&p)[DkDvWarp<Traits>::kKeyMTiles][Traits::kNTilesS][4],
    const float (&dtanh)[Has_extras ? DkDvWarp<Traits>::kKeyMTiles : 1][Traits::kNTilesS][4], uint64_t keep_bits,
    bool has_dropout, const BwdParams& params, const DkDvSmem<Traits>& tiles, const DkDvWarp<Traits>& warp_tile,
    uint32_t do_smem) {
    using Element = typename Traits::Element;
    constexpr int kKeyMTiles = DkDvWarp<Traits>::kKeyMTiles;
    constexpr int kNTilesS = Traits::kNTilesS;
    const int key_row0 = warp_tile.key_row0;
    const int query_col0 = warp_tile.query_col0;
    const int lane = warp_tile.lane;
    float ds[kKeyMTiles][kNTilesS][4];
    clear(ds);
    gemm_smem_smem<Element, kKeyMTiles, kNTilesS, Traits::kKStepsDv, typename Traits::OwnTileV,
                   typename Traits::StreamTileV>(ds, tiles.v_smem, key_row0, do_smem, query_col0, opaque(lane));
#pragma unroll
    for (int j = 0; j < kNTilesS; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float dsum = tiles.dsum_smem[query_col0 + j * 8 + (lane % 4) * 2 + e % 2];
#pragma unroll
            for (int mt = 0; mt < kKeyMTiles; ++mt) {
                float dp = ds[mt][j][e];
                if (has_dropout) dp = kept(keep_bits, mt, j, e, kNTilesS) ? dp * params.dropout_rescale : 0.f;
                ds[mt][j][e] = p[mt][j][e] * (dp - dsum);
                if constexpr (Has_extras) {
                    if (params.softcap > 0.f) ds[mt][j][e] *= dtanh[mt][j][e];
                }
            }
        }
    }
    store_fragment<Element, typename Traits::ScoreTile>(ds, tiles.ds_smem_ptr, key_row0, query_col0 / 8, lane);
}

// Epilogue: dK takes the softmax scale and dV dropout's 1 / (1 - p), both left
// out of every step; they are staged through the K and V tiles (no longer
// read) and stored with 16-byte writes.
template <typename Traits, bool Has_dK, bool Has_dV>
__device__ __forceinline__ void store_dk_dv(float (&dk)[DkDvWarp<Traits>::kKeyMTiles][Traits::kNTilesDk][4],
                                            float (&dv)[DkDvWarp<Traits>::kKeyMTiles][Traits::kNTilesDv][4],
                                            const BwdParams& params,
                                            const TileCopy<typename Traits::OwnTile, Traits::kNThreads>& own_copy,
                                            const TileCopy<typename Traits::OwnTileV, Traits::kNThreads>& own_copy_v,
                                            const DkDvSmem<Traits>& tiles, const DkDvWarp<Traits>& warp_tile, int batch,
                                            int head_k, const Sequence& seq, int n0, bool has_dropout) {
    using Element = typename Traits::Element;
    const int key_row0 = warp_tile.key_row0;
    const int lane = warp_tile.lane;
    cp_async_wait<0>();  // with no query tile the K/V copies may still be in flight
    __syncthreads();     // and every warp is done reading K and V
    if constexpr (Has_dK) {
        scale(dk, params.softmax_scale);
        store_fragment<Element, typename Traits::OwnTile>(dk, tiles.k_smem_ptr, key_row0, warp_tile.d_chunk0, lane);
    }
    if constexpr (Has_dV) {
        if (has_dropout) scale(dv, params.dropout_rescale);
        store_fragment<Element, typename Traits::OwnTileV>(dv, tiles.v_smem_ptr, key_row0, warp_tile.dv_chunk0,
                                                           lane);
    }
    __syncthreads();  // every warp's rows are staged
    if constexpr (Has_dK) {
        Element* dk_out = static_cast<Element*>(params.dk_ptr) + batch * params.dk_batch_stride +
                          head_k * params.dk_head_stride + (seq.k_start + n0) * params.dk_row_stride;
        own_copy.store(tiles.k_smem_ptr, dk_out, params.dk_row_stride, seq.seqlen_k - n0, params.head_dim);
    }
    if constexpr (Has_dV) {
        Element* dv_out = static_cast<Element*>(params.dv_ptr) + batch * params.dv_batch_stride +
                          head_k * params.dv_head_stride + (seq.k_start + n0) * params.dv_row_stride;
        own_copy_v.store(tiles.v_smem_ptr, dv_out, params.dv_row_stride, seq.seqlen_k - n0, params.head_dim_v);
    }
}

// dK and dV for one tile of kOwnRows keys of one KV head: walks the query tiles
// of every query head that shares the KV head, so the group sum of GQA happens
// in registers. Has_dK / Has_dV select the gradients of this pass (both at
// head dims up to 128; one each past that, to fit the registers); Has_dQ adds
// each step's dQ share to the fp32 buffer (with dK, which computes dS). Warp
// layouts: BwdKernelTraits.
template <typename Traits, bool Is_local, bool Has_extras, bool Has_dK, bool Has_dV, bool Has_dQ>
__global__ void __launch_bounds__(Traits::kNThreads) bwd_dk_dv_kernel(const BwdParams params) {
    static_assert(!Has_dQ || Has_dK, "dQ needs dS, which the dK pass computes");
    using Element = typename Traits::Element;
    using StreamTile = typename Traits::StreamTile;
    using StreamTileV = typename Traits::StreamTileV;
    using ScoreTile = typename Traits::ScoreTile;
    constexpr int kOwnRows = Traits::kOwnRows;
    constexpr int kStreamRows = Traits::kStreamRows;
    constexpr int kNThreads = Traits::kNThreads;
    constexpr int kNTilesS = Traits::kNTilesS;
    constexpr int kNTilesDk = Traits::kNTilesDk;
    constexpr int kNTilesDv = Traits::kNTilesDv;
    constexpr int kKeyMTiles = DkDvWarp<Traits>::kKeyMTiles;

    extern __shared__ __align__(128) char smem[];
    const DkDvSmem<Traits> tiles(smem);
    const int tid = threadIdx.x;
    const DkDvWarp<Traits> warp_tile(tid);
    const int n0 = blockIdx.x * kOwnRows;
    const int head_k = blockIdx.y;
    const int batch = blockIdx.z;
    const Sequence seq = sequence_of<false>(params, batch);
    const int seqlen_q = seq.seqlen_q;
    const int seqlen_k = seq.seqlen_k;
    if (n0 >= seqlen_k) return;  // a shorter sequence of a variable-length batch
    const Window window = window_of(params, seqlen_q, seqlen_k);
    const bool has_dropout = Has_extras && params.rng_state != nullptr;

    const TileCopy<typename Traits::OwnTile, kNThreads> own_copy(tid);
    const TileCopy<typename Traits::OwnTileV, kNThreads> own_copy_v(tid);
    const TileCopy<StreamTile, kNThreads> stream_copy(tid);
    const TileCopy<StreamTileV, kNThreads> stream_copy_v(tid);
    load_key_value_tiles_async<Traits>(params, own_copy, own_copy_v, tiles, batch, head_k, seq, n0);
    cp_async_commit();

    float dk[kKeyMTiles][kNTilesDk][4];
    float dv[kKeyMTiles][kNTilesDv][4];
    clear(dk);
    clear(dv);

    // The query tiles that see a key of this tile.
    const QueryTileRange query_tiles = query_tile_range<kStreamRows, kOwnRows>(n0, seqlen_q, window);
    const int m_begin = query_tiles.m_begin;

    // The steps: every (query head of the group, query tile) pair, flattened so
    // that the next step's tiles can be loaded while this one computes.
    const int m_tiles = query_tiles.m_end - m_begin;
    const int steps = params.heads_per_kv_head * m_tiles;
    auto head_of = [&](int t) { return head_k * params.heads_per_kv_head + t / m_tiles; };
    auto m0_of = [&](int t) { return (m_begin + t % m_tiles) * kStreamRows; };
    float step_lse = -INFINITY, step_dsum = 0.f;  // the loading step's row, this thread's
    auto load_step = [&](int t, int stage) {
        load_query_tiles_async<Traits>(params, stream_copy, stream_copy_v, tiles, stage, batch, head_of(t), seq,
                                       m0_of(t), tid, step_lse, step_dsum);
    };

    // dQ buffer [B, Sq, H, D] ([total_q, H, D]; fp32, contiguous) of the current query head.
    float* dq_accum_head = nullptr;
    const int64_t dq_accum_row_stride = static_cast<int64_t>(params.num_heads) * params.head_dim;

    // One step on the tiles in shared memory: q_smem, do_smem, the rows' lse and D.
    auto compute = [&](uint32_t q_smem, uint32_t do_smem, int head, int m0, auto is_masked) {
        float p[kKeyMTiles][kNTilesS][4];  // S^T, then P^T
        [[maybe_unused]] float dtanh[Has_extras ? kKeyMTiles : 1][kNTilesS][4];  // softcap's chain factor
        uint64_t keep_bits = ~uint64_t{0};
        probs_transposed<Traits, Is_local, Has_extras, decltype(is_masked)::value>(
            p, dtanh, keep_bits, params, tiles, warp_tile, q_smem, batch, head, window, n0, m0, has_dropout);
        if constexpr (Has_dV) store_probs_transposed<Traits>(p, keep_bits, has_dropout, tiles, warp_tile);
        if constexpr (Has_dK) {
            store_ds_transposed<Traits, Has_extras>(p, dtanh, keep_bits, has_dropout, params, tiles, warp_tile,
                                                    do_smem);
        }
        __syncthreads();  // the whole P^T and dS^T tiles, every warp's part, are in place

        if constexpr (Has_dV) {  // dV += P^T dO
            gemm_smem_kn<Element, false, kKeyMTiles, kNTilesDv, Traits::kKStepsStream, ScoreTile, StreamTileV>(
                dv, smem_addr(tiles.p_smem_ptr), warp_tile.key_row0, do_smem, warp_tile.dv_chunk0,
                opaque(warp_tile.lane));
        }
        if constexpr (Has_dK) {  // dK += dS^T Q (scaled once, at the end)
            gemm_smem_kn<Element, false, kKeyMTiles, kNTilesDk, Traits::kKStepsStream, ScoreTile, StreamTile>(
                dk, smem_addr(tiles.ds_smem_ptr), warp_tile.key_row0, q_smem, warp_tile.d_chunk0,
                opaque(warp_tile.lane));
        }
        if constexpr (Has_dQ) {
            add_dq_share<Traits>(dq_accum_head, dq_accum_row_stride, m0, seqlen_q, params.head_dim,
                                 smem_addr(tiles.ds_smem_ptr), tiles.k_smem, warp_tile.warp, warp_tile.lane);
        }
    };

    if constexpr (Traits::kStages == 2) {
        if (steps > 0) load_step(0, 0);
        cp_async_commit();
    }
    for (int t = 0; t < steps; ++t) {
        const int stage = Traits::kStages == 2 ? t % 2 : 0;
        if constexpr (Traits::kStages == 1) {
            __syncthreads();  // every warp is done with step t - 1's Q and dO
            load_step(t, 0);
            cp_async_commit();
        }
        cp_async_wait<0>();  // this step's Q and dO (and K, V) have landed
        // Every warp is past step t - 1's P^T/dS^T barrier, so done with its lse and D.
        if (tid < kStreamRows) {
            tiles.lse_log2_smem[tid] = lse_to_log2(step_lse);
            tiles.dsum_smem[tid] = step_dsum;
        }
        __syncthreads();  // the step's tiles and rows are visible; step t - 1 is done everywhere
        if constexpr (Traits::kStages == 2) {
            if (t + 1 < steps) load_step(t + 1, stage ^ 1);  // into the stage step t - 1 read
            cp_async_commit();
        }

        const int m0 = m0_of(t);
        const int head = head_of(t);
        if constexpr (Has_dQ) {
            dq_accum_head = params.dq_accum_ptr + batch * params.dq_accum_batch_stride +
                            (static_cast<int64_t>(seq.q_start) * params.num_heads + head) * params.head_dim;
        }
        const uint32_t q_smem = tiles.q_stage(stage);
        const uint32_t do_smem = tiles.do_stage(stage);
        // Masked only where some query of the tile misses some key: the causal
        // diagonal, window edges, the sequence's last key tile.
        if (tile_is_full<kStreamRows, kOwnRows>(m0, n0, seqlen_q, window)) {
            compute(q_smem, do_smem, head, m0, std::false_type{});
        } else {
            compute(q_smem, do_smem, head, m0, std::true_type{});
        }
    }

    store_dk_dv<Traits, Has_dK, Has_dV>(dk, dv, params, own_copy, own_copy_v, tiles, warp_tile, batch, head_k, seq,
                                        n0, has_dropout);
}

// The forward's lse (in base 2) and D of this thread's two rows of the dQ
// kernel's fragments, rows g and g + 8 of the warp's 16 from warp_m0 on.
__device__ __forceinline__ void load_row_stats(float (&lse_log2)[2], float (&dsum)[2], const BwdParams& params,
                                               int batch, int head, const Sequence& seq, int warp_m0, int lane) {
    const int64_t row_stats = batch * params.lse_batch_stride + head * params.lse_head_stride + seq.q_start;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = warp_m0 + half * 8 + lane / 4;
        lse_log2[half] = lse_log2_of_row(params.lse_ptr + row_stats, row, seq.seqlen_q);
        dsum[half] = row < seq.seqlen_q ? params.dsum_ptr[row_stats + row] : 0.f;
    }
}

// dS = P * (dP - D) in place on the dP fragment, P = exp2(s * scale_log2 -
// lse_log2) recomputed from the scores (dP of a dropped element is 0, of a
// kept one scaled by 1 / (1 - p)), times softcap's 1 - tanh^2.
template <bool Has_extras, int kNTiles, int kDtanhTiles>
__device__ __forceinline__ void ds_from_dp(float (&ds)[1][kNTiles][4], const float (&p)[1][kNTiles][4],
                                           const float (&dtanh)[1][kDtanhTiles][4], uint64_t keep_bits,
                                           const float (&lse_log2)[2], const float (&dsum)[2],
                                           const BwdParams& params, bool has_dropout) {
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float prob = exp2_approx(fmaf(p[0][j][e], params.softmax_scale_log2, -lse_log2[e / 2]));
            float dp = ds[0][j][e];
            if (has_dropout) dp = kept(keep_bits, 0, j, e, kNTiles) ? dp * params.dropout_rescale : 0.f;
            ds[0][j][e] = prob * (dp - dsum[e / 2]);
            if constexpr (Has_extras) {
                if (params.softcap > 0.f) ds[0][j][e] *= dtanh[0][j][e];
            }
        }
    }
}

// Epilogue of the dQ kernel: dQ (the block's columns from dq_col0 on) takes
// the softmax scale, left out of every step, and is staged through the Q tile
// (no longer read), then stored with 16-byte writes.
template <typename Traits>
__device__ __forceinline__ void store_dq(float (&dq)[1][Traits::kNTilesD][4], const BwdParams& params,
                                         const TileCopy<typename Traits::OwnTile, Traits::kNThreads>& own_copy,
                                         char* q_smem_ptr, int warp_row0, int lane, int batch, int head,
                                         const Sequence& seq, int m0, int dq_col0) {
    using Element = typename Traits::Element;
    cp_async_wait<0>();  // with no key tile the Q and dO copies may still be in flight
    __syncthreads();     // and every warp is done reading Q
    scale(dq, params.softmax_scale);
    store_fragment<Element, typename Traits::OwnTile>(dq, q_smem_ptr, warp_row0, 0, lane);
    __syncthreads();  // every warp's rows are staged
    Element* dq_out = static_cast<Element*>(params.dq_ptr) + batch * params.dq_batch_stride +
                      head * params.dq_head_stride + (seq.q_start + m0) * params.dq_row_stride + dq_col0;
    own_copy.store(q_smem_ptr, dq_out, params.dq_row_stride, seq.seqlen_q - m0,
                   min(params.head_dim - dq_col0, Traits::kHeadDimDq));
}

// dQ for one tile of kOwnRows queries of one head, Traits::kHeadDimDq of its
// columns (a block per chunk of them, adjacent in launch order): walks the key
// tiles the tile sees, as the forward does.
template <typename Traits, bool Is_local, bool Has_extras>
__global__ void __launch_bounds__(Traits::kNThreads) bwd_dq_kernel(const BwdParams params) {
    static_assert(Traits::kOwnRows == 16 * Traits::kNWarps, "each warp owns 16 query rows");
    using Element = typename Traits::Element;
    using OwnTile = typename Traits::OwnTile;
    using OwnTileV = typename Traits::OwnTileV;
    using StreamTile = typename Traits::StreamTile;
    using StreamTileV = typename Traits::StreamTileV;
    constexpr int kOwnRows = Traits::kOwnRows;
    constexpr int kStreamRows = Traits::kStreamRows;
    constexpr int kNThreads = Traits::kNThreads;

    extern __shared__ __align__(128) char smem[];
    char* q_smem_ptr = smem + Traits::kSmemOwnOffset0;
    const uint32_t q_smem = smem_addr(q_smem_ptr);
    const uint32_t do_smem = smem_addr(smem + Traits::kSmemOwnOffset1);
    const uint32_t k_smem = smem_addr(smem + Traits::kSmemStreamOffset0);
    const uint32_t v_smem = smem_addr(smem + Traits::kSmemStreamOffset1);

    const int tid = threadIdx.x;
    const int lane = tid % 32;
    const int warp_row0 = (tid / 32) * 16;
    const int dq_chunks = Traits::dq_chunks(params.head_dim);
    const int dq_col0 = static_cast<int>(blockIdx.x) % dq_chunks * Traits::kHeadDimDq;
    const int m0 = static_cast<int>(blockIdx.x) / dq_chunks * kOwnRows;
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    const int head_k = head / params.heads_per_kv_head;
    const Sequence seq = sequence_of<false>(params, batch);
    const int seqlen_q = seq.seqlen_q;
    const int seqlen_k = seq.seqlen_k;
    if (m0 >= seqlen_q) return;  // a shorter sequence of a variable-length batch
    // K's columns of this block's dQ chunk: the stream tile from the chunk's first column block on.
    const uint32_t k_smem_dq = k_smem + (dq_col0 / (StreamTile::kBlockChunks * StreamTile::kChunkElems)) *
                                            StreamTile::kBlockBytes;
    const Window window = window_of(params, seqlen_q, seqlen_k);
    const ScoreExtras extras(params, batch, head, window.diagonal);
    const bool has_dropout = Has_extras && params.rng_state != nullptr;
    const DropoutRng rng = has_dropout ? DropoutRng(params.rng_state, batch, params.num_heads, head,
                                                    params.dropout_threshold)
                                       : DropoutRng{};

    const TileCopy<OwnTile, kNThreads> own_copy(tid);
    const TileCopy<OwnTileV, kNThreads> own_copy_v(tid);
    const TileCopy<StreamTile, kNThreads> stream_copy(tid);
    const TileCopy<StreamTileV, kNThreads> stream_copy_v(tid);
    const Element* q = static_cast<const Element*>(params.q_ptr) + batch * params.q_batch_stride +
                       head * params.q_head_stride + (seq.q_start + m0) * params.q_row_stride;
    const Element* dout = static_cast<const Element*>(params.do_ptr) + batch * params.do_batch_stride +
                          head * params.do_head_stride + (seq.q_start + m0) * params.do_row_stride;
    const Element* k = static_cast<const Element*>(params.k_ptr) + batch * params.k_batch_stride +
                       head_k * params.k_head_stride + seq.k_start * params.k_row_stride;
    const Element* v = static_cast<const Element*>(params.v_ptr) + batch * params.v_batch_stride +
                       head_k * params.v_head_stride + seq.k_start * params.v_row_stride;
    own_copy.load_async(q_smem, q, params.q_row_stride, seqlen_q - m0, params.head_dim);
    own_copy_v.load_async(do_smem, dout, params.do_row_stride, seqlen_q - m0, params.head_dim_v);
    cp_async_commit();

    float lse_log2[2], dsum[2];  // this thread's two rows (g and g + 8 of the warp's 16)
    load_row_stats(lse_log2, dsum, params, batch, head, seq, m0 + warp_row0, lane);

    const KeyTileRange key_tiles = key_tile_range<kOwnRows, kStreamRows>(m0, seqlen_q, window);

    float dq[1][Traits::kNTilesD][4];
    clear(dq);
    auto step = [&](int n_block, auto is_masked) {
        constexpr bool Is_masked = decltype(is_masked)::value;
        const int n0 = n_block * kStreamRows;
        __syncthreads();  // every warp is done with the previous K, V
        stream_copy.load_async(k_smem, k + n0 * params.k_row_stride, params.k_row_stride, seqlen_k - n0,
                               params.head_dim);
        stream_copy_v.load_async(v_smem, v + n0 * params.v_row_stride, params.v_row_stride, seqlen_k - n0,
                                 params.head_dim_v);
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();

        float p[1][Traits::kNTilesStream][4];  // S = Q K^T, then P
        clear(p);
        gemm_smem_smem<Element, 1, Traits::kNTilesStream, Traits::kKStepsD, OwnTile, StreamTile>(
            p, q_smem, warp_row0, k_smem, 0, lane);
        [[maybe_unused]] float dtanh[1][Has_extras ? Traits::kNTilesStream : 1][4];  // softcap's chain factor
        uint64_t keep_bits = ~uint64_t{0};
        if constexpr (Has_extras) {
            apply_score_extras<false>(p, extras, m0 + warp_row0, n0, lane, dtanh);
            if (has_dropout) {
                keep_bits = dropout_keep_bits<false, 1, Traits::kNTilesStream>(rng, m0 + warp_row0, n0, lane);
            }
        }
        if constexpr (Is_masked) apply_mask<Is_local>(p, m0 + warp_row0, n0, window, lane);
        float ds[1][Traits::kNTilesStream][4];  // dP = dO V^T, then dS
        clear(ds);
        gemm_smem_smem<Element, 1, Traits::kNTilesStream, Traits::kKStepsDv, OwnTileV, StreamTileV>(
            ds, do_smem, warp_row0, v_smem, 0, lane);
        ds_from_dp<Has_extras>(ds, p, dtanh, keep_bits, lse_log2, dsum, params, has_dropout);
        // dQ += dS K (scaled once, at the end)
        gemm_regs_smem<Element, 1, Traits::kNTilesD, Traits::kKStepsStream, StreamTile>(dq, ds, k_smem_dq, lane);
    };
    int n_block = key_tiles.n_end - 1;
    for (; n_block >= key_tiles.full_end; --n_block) step(n_block, std::true_type{});
    for (; n_block >= key_tiles.full_begin; --n_block) step(n_block, std::false_type{});
    for (; n_block >= key_tiles.n_begin; --n_block) step(n_block, std::true_type{});

    store_dq<Traits>(dq, params, own_copy, q_smem_ptr, warp_row0, lane, batch, head, seq, m0, dq_col0);
}

// dQ = softmax_scale * dq_accum, rounded to the input dtype and written in
// dQ's layout: one thread per 8 consecutive head-dim elements. A
// variable-length batch runs as one sequence of total_q rows.
template <typename Element>
__global__ void __launch_bounds__(256) bwd_convert_dq_kernel(const BwdParams params) {
    const int chunks_per_row = params.head_dim / 8;
    const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t total = static_cast<int64_t>(params.batch) * params.seqlen_q * params.num_heads * chunks_per_row;
    if (idx >= total) return;
    const int col = static_cast<int>(idx % chunks_per_row) * 8;
    int64_t rest = idx / chunks_per_row;  // (b * Sq + i) * H + h
    const float* src = params.dq_accum_ptr + rest * params.head_dim + col;
    const int h = static_cast<int>(rest % params.num_heads);
    rest /= params.num_heads;
    const int i = static_cast<int>(rest % params.seqlen_q);
    const int b = static_cast<int>(rest / params.seqlen_q);
    uint32_t words[4];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        words[w] = pack2<Element>(src[2 * w] * params.softmax_scale, src[2 * w + 1] * params.softmax_scale);
    }
    Element* dst = static_cast<Element*>(params.dq_ptr) + b * params.dq_batch_stride + i * params.dq_row_stride +
                   h * params.dq_head_stride + col;
    *reinterpret_cast<uint4*>(dst) = make_uint4(words[0], words[1], words[2], words[3]);
}

}  // namespace flash::sm80
