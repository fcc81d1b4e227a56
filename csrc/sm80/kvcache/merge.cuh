// Merging split-KV partial results (common/lse_merge.cuh): the decoding
// kernel's last block of a (batch, head) calls merge_split_columns for the
// group's rows, merge_splits_kernel does the same for every row after the
// tiled KV-cache forward. store_partial_fragment stores a split's part.
//
// Partial rows: fp32 [splits, B, H, Sq, head_dim_v] (o_accum_ptr) and [splits,
// B, H, Sq] (lse_accum_ptr); row r = (b * H + h) * Sq + i of split s is at
// s * split_rows + r, split_rows = B * H * Sq.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/flash.h"
#include "common/lse_merge.cuh"
#include "common/ptx.cuh"
#include "common/sink.cuh"

namespace flash::sm80 {

// Columns [col, col + 4) of partial row `row` (query row i of head h) merged
// over every split into out_row (16-bit), and, for col 0, the row's lse into
// *out_lse; the row's learnable sink, which the splits' parts leave out, joins
// once after them (read there, not passed in: a value read before the loop
// held a register across the splits' loads, +12 in the wide decoding kernel).
// The merge is bound by latency (one round trip to L2 per batch of kBatch
// splits, whose loads are all in flight at once); the partial rows were
// written by other SMs, so they are read through L2 (__ldcg).
template <int kBatch, typename Element>
__device__ __forceinline__ void merge_split_columns(const FwdParams& params, int64_t row, int h, int i,
                                                    int64_t split_rows, int col, Element* out_row, float* out_lse) {
    const bool has_col = col < params.head_dim_v;
    LseMerge merge;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s0 = 0; s0 < params.num_splits; s0 += kBatch) {
        float l[kBatch];
        float4 o[kBatch];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
            const int64_t at = (s0 + j) * split_rows + row;
            const bool valid = s0 + j < params.num_splits;
            l[j] = valid ? __ldcg(params.lse_accum_ptr + at) : -INFINITY;
            o[j] = valid && has_col
                       ? __ldcg(reinterpret_cast<const float4*>(params.o_accum_ptr + at * params.head_dim_v + col))
                       : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        float batch_max = merge.max_lse;
#pragma unroll
        for (int j = 0; j < kBatch; ++j) batch_max = fmaxf(batch_max, l[j]);
        const float rescale = merge.raise_max(batch_max);
        acc.x *= rescale, acc.y *= rescale, acc.z *= rescale, acc.w *= rescale;
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
            const float w = merge.add(l[j]);
            acc.x += w * o[j].x, acc.y += w * o[j].y, acc.z += w * o[j].z, acc.w += w * o[j].w;
        }
    }
    const float rescale = merge.add_sink(learnable_sink_of</*May_pack=*/true>(params, h, i));
    acc.x *= rescale, acc.y *= rescale, acc.z *= rescale, acc.w *= rescale;
    const float inv = merge.inv_sum();
    if (has_col) {
        *reinterpret_cast<uint2*>(out_row + col) =
            make_uint2(pack2<Element>(acc.x * inv, acc.y * inv), pack2<Element>(acc.z * inv, acc.w * inv));
    }
    if (col == 0) *out_lse = merge.lse();
}

// A split's part from the tiled forward: the warp's fp32 output fragment
// (mma accumulator layout: a thread holds rows lane/4 and lane/4 + 8 of each
// m16 tile, columns (lane%4)*2 and +1 of each n8 tile), already normalised, and
// its rows' lse, at partial rows split_row0 + row0 + ... (rows past seqlen_q
// are not stored).
template <int kMTiles, int kNTilesO>
__device__ __forceinline__ void store_partial_fragment(const FwdParams& params, const float (&o)[kMTiles][kNTilesO][4],
                                                       const float (&lse)[2 * kMTiles], int64_t split_row0, int row0,
                                                       int seqlen_q, int lane) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = row0 + mt * 16 + half * 8 + lane / 4;
            if (row >= seqlen_q) continue;
            if (lane % 4 == 0) params.lse_accum_ptr[split_row0 + row] = lse[mt * 2 + half];
            float* dst = params.o_accum_ptr + (split_row0 + row) * params.head_dim_v + (lane % 4) * 2;
#pragma unroll
            for (int j = 0; j < kNTilesO; ++j) {
                if (j * 8 < params.head_dim_v) {
                    *reinterpret_cast<float2*>(dst + j * 8) = make_float2(o[mt][j][2 * half], o[mt][j][2 * half + 1]);
                }
            }
        }
    }
}

// One thread per (row, 4 columns) of every (batch, head, query) row: the merge
// after the tiled KV-cache forward. Rows follow params' layout (with pack_gqa
// a "head" is a KV head and its "rows" the query heads of its group).
constexpr int kMergeThreads = 256;

template <typename Element>
__global__ void __launch_bounds__(kMergeThreads) merge_splits_kernel(const FwdParams params) {
    const int quads = params.head_dim_v / 4;
    const int64_t split_rows = static_cast<int64_t>(params.batch) * params.num_heads * params.seqlen_q;
    const int64_t idx = static_cast<int64_t>(blockIdx.x) * kMergeThreads + threadIdx.x;
    if (idx >= split_rows * quads) return;
    const int64_t row = idx / quads;  // (b * H + h) * Sq + i
    const int col = static_cast<int>(idx % quads) * 4;
    const int i = static_cast<int>(row % params.seqlen_q);
    const int h = static_cast<int>((row / params.seqlen_q) % params.num_heads);
    const int b = static_cast<int>(row / (static_cast<int64_t>(params.seqlen_q) * params.num_heads));
    Element* out = static_cast<Element*>(params.o_ptr) + b * params.o_batch_stride + i * params.o_row_stride +
                   h * params.o_head_stride;
    float* lse = params.lse_ptr + b * params.lse_batch_stride + h * params.lse_head_stride + i;
    merge_split_columns</*kBatch=*/16>(params, row, h, i, split_rows, col, out, lse);
}

inline int64_t merge_splits_blocks(const FwdParams& params) {
    const int64_t threads =
        static_cast<int64_t>(params.batch) * params.num_heads * params.seqlen_q * (params.head_dim_v / 4);
    return (threads + kMergeThreads - 1) / kMergeThreads;
}

}  // namespace flash::sm80
