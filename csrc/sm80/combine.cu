// flash_attn_combine's kernel (sm80.h: run_combine): attention computed over
// disjoint sets of keys (context-parallel chunks, a ring's steps) merged by the
// parts' log-sum-exps. Bound by reading out_partial: one warp per (b, s, h)
// row reads each part's row once, 16 bytes a lane where the layout allows, and
// with the parts' loads unrolled so that several are in flight per warp.
#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/flash.h"
#include "common/ptx.cuh"
#include "common/static_switch.h"
#include "sm80/sm80.h"

namespace flash::sm80 {
namespace {

constexpr int kCombineWarps = 8;  // warps (rows) per block
constexpr int kPartsInFlight = 8;  // parts whose loads one warp issues before it uses them
// Blocks an SM holds at once: 32 warps of 8 parts' 16-byte loads a lane keep
// ~128 KB in flight per SM, far more than the bandwidth needs; it also gives
// ptxas a register budget (64), without which CUDA 13's ptxas spilled the
// unrolled loads at 32-48 registers.
constexpr int kCombineBlocksPerSm = 4;

// kVec consecutive fp32 values to and from memory.
template <int kVec>
__device__ __forceinline__ void load_vec(const float* src, float (&v)[kVec]) {
    if constexpr (kVec == 4) {
        const float4 x = *reinterpret_cast<const float4*>(src);
        v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
    } else {
#pragma unroll
        for (int i = 0; i < kVec; ++i) v[i] = src[i];
    }
}

template <typename Out, int kVec>
__device__ __forceinline__ void store_vec(Out* dst, const float (&v)[kVec]) {
    if constexpr (std::is_same_v<Out, float>) {
        if constexpr (kVec == 4) {
            *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
        } else {
#pragma unroll
            for (int i = 0; i < kVec; ++i) dst[i] = v[i];
        }
    } else if constexpr (kVec == 4) {
        *reinterpret_cast<uint2*>(dst) = make_uint2(pack2<Out>(v[0], v[1]), pack2<Out>(v[2], v[3]));
    } else {
#pragma unroll
        for (int i = 0; i < kVec; ++i) dst[i] = from_float<Out>(v[i]);
    }
}

// The row's lse over every part, reduced across the warp (every lane gets it):
// the max, then the sum of exp(lse_s - max). -inf when every part is -inf.
__device__ __forceinline__ float row_lse(const CombineParams& params, const float* lse_row, int lane) {
    float max_lse = -INFINITY;
    for (int s = lane; s < params.num_splits; s += 32) max_lse = fmaxf(max_lse, lse_row[s * params.lp_split_stride]);
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
        max_lse = fmaxf(max_lse, __shfl_xor_sync(0xffffffffu, max_lse, offset));
    }
    if (max_lse == -INFINITY) return -INFINITY;
    float sum = 0.f;
    for (int s = lane; s < params.num_splits; s += 32) sum += expf(lse_row[s * params.lp_split_stride] - max_lse);
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    return max_lse + logf(sum);
}

template <typename Out, int kVec>
__global__ void __launch_bounds__(32 * kCombineWarps, kCombineBlocksPerSm) combine_kernel(const CombineParams params) {
    const int row_in_batch = blockIdx.x * kCombineWarps + threadIdx.x / 32;  // s * H + h (int32: run_combine)
    const int b = blockIdx.y;
    const int lane = threadIdx.x % 32;
    if (row_in_batch >= params.seqlen * params.num_heads) return;
    const int h = row_in_batch % params.num_heads;
    const int s = row_in_batch / params.num_heads;
    const int64_t row = static_cast<int64_t>(b) * params.seqlen * params.num_heads + row_in_batch;
    const float* lse_row = params.lse_partial_ptr + b * params.lp_batch_stride + s * params.lp_row_stride +
                           h * params.lp_head_stride;
    const float* out_row = params.out_partial_ptr + b * params.op_batch_stride + s * params.op_row_stride +
                           h * params.op_head_stride;
    const float lse = row_lse(params, lse_row, lane);
    // exp(lse_s - lse) of part s; 0 for a part that saw no key, and for every
    // part of a row that none saw (its out is then 0).
    auto weight = [&](int part) {
        const float lse_s = lse_row[part * params.lp_split_stride];
        return lse == -INFINITY || lse_s == -INFINITY ? 0.f : expf(lse_s - lse);
    };
    Out* out = static_cast<Out*>(params.out_ptr) + b * params.o_batch_stride + s * params.o_row_stride +
               h * params.o_head_stride;
    // Every lane runs every pass of the column loop (the weights' shuffles are
    // the whole warp's); a lane past the head dim loads and stores nothing.
    for (int col0 = 0; col0 < params.head_dim; col0 += 32 * kVec) {
        const int col = col0 + lane * kVec;
        const bool has_col = col < params.head_dim;
        float acc[kVec] = {};
        for (int s0 = 0; s0 < params.num_splits; s0 += 32) {
            // Lane j holds part s0 + j's weight; the warp takes them in turn.
            const float w_lane = s0 + lane < params.num_splits ? weight(s0 + lane) : 0.f;
            const int parts = min(32, params.num_splits - s0);
#pragma unroll kPartsInFlight
            for (int j = 0; j < parts; ++j) {
                const float w = __shfl_sync(0xffffffffu, w_lane, j);
                if (!has_col) continue;
                float v[kVec];
                load_vec<kVec>(out_row + (s0 + j) * params.op_split_stride + col, v);
#pragma unroll
                for (int i = 0; i < kVec; ++i) acc[i] = fmaf(w, v[i], acc[i]);
            }
        }
        if (has_col) store_vec<Out, kVec>(out + col, acc);
    }
    if (lane == 0) params.lse_ptr[row] = lse;
}

template <typename Out>
cudaError_t launch_combine(const CombineParams& params, cudaStream_t stream) {
    const int64_t rows_per_batch = static_cast<int64_t>(params.seqlen) * params.num_heads;
    const dim3 grid(static_cast<unsigned>((rows_per_batch + kCombineWarps - 1) / kCombineWarps), params.batch);
    if (params.vectorized) {
        combine_kernel<Out, 4><<<grid, 32 * kCombineWarps, 0, stream>>>(params);
    } else {
        combine_kernel<Out, 1><<<grid, 32 * kCombineWarps, 0, stream>>>(params);
    }
    return cudaGetLastError();
}

}  // namespace

cudaError_t run_combine(const CombineParams& params, cudaStream_t stream) {
    // A batch's rows index in int32, the batch is the grid's y (the binding checks both).
    const int64_t rows_per_batch = static_cast<int64_t>(params.seqlen) * params.num_heads;
    if (rows_per_batch == 0 || params.batch == 0) return cudaSuccess;
    if (rows_per_batch > INT32_MAX || params.batch > 65535) return cudaErrorInvalidConfiguration;
    switch (params.out_type) {
        case CombineParams::OutType::kFloat16: return launch_combine<__half>(params, stream);
        case CombineParams::OutType::kBFloat16: return launch_combine<__nv_bfloat16>(params, stream);
        default: return launch_combine<float>(params, stream);
    }
}

}  // namespace flash::sm80
