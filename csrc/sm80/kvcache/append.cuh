// The append of flash_attn_with_kvcache, before its forward: the new keys and
// values written into the cache, rotary applied to the keys and the queries.
// Plain CUDA (no family instructions).
#pragma once

#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/flash.h"
#include "common/index_check.cuh"
#include "common/ptx.cuh"

namespace flash::sm80 {

// Rotary embedding of one pair of a row: the row's elements (a, b) rotated by
// angle t of the position, from the cos/sin tables ([positions, rotary_dim / 2]).
// Pair t < rotary_dim / 2 of a row is (2t, 2t + 1) interleaved, (t, t +
// rotary_dim / 2) otherwise; pairs past the rotary dims are copied.
struct RotaryPair {
    int a, b;      // element indices
    int freq;      // column of the cos/sin tables; -1: copy, no rotation
};

__device__ __forceinline__ RotaryPair rotary_pair(int t, int rotary_dim, bool interleaved) {
    const int half = rotary_dim / 2;
    if (t >= half) {
        const int a = rotary_dim + 2 * (t - half);
        return {a, a + 1, -1};
    }
    return interleaved ? RotaryPair{2 * t, 2 * t + 1, t} : RotaryPair{t, t + half, t};
}

template <typename Element>
__device__ __forceinline__ void rotate_pair(const Element* src, Element* dst, const RotaryPair& pair,
                                            const float* cos, const float* sin, int position, int rotary_dim) {
    const float x = to_float(src[pair.a]), y = to_float(src[pair.b]);
    if (pair.freq < 0) {  // also every pair without rotary (rotary_dim 0)
        dst[pair.a] = src[pair.a];
        dst[pair.b] = src[pair.b];
        return;
    }
    const int at = position * (rotary_dim / 2) + pair.freq;
    const float c = cos[at], s = sin[at];
    // Each product rounded on its own (no FMA), as PyTorch's elementwise ops
    // round them: the cache then holds exactly what apply_rotary_emb computes.
    dst[pair.a] = from_float<Element>(__fsub_rn(__fmul_rn(x, c), __fmul_rn(y, s)));
    dst[pair.b] = from_float<Element>(__fadd_rn(__fmul_rn(x, s), __fmul_rn(y, c)));
}

// rotate_pair for an FP8 cache (AppendParams::kv_fp8): the key's e4m3 pair
// dequantised (x descale, rounded to Element, as the 16-bit copy of the
// cache that flashattn/fp8.py's route rotates), rotated as rotate_pair does,
// and stored re-quantised (/ descale, saturated at e4m3's largest, rounded to
// nearest even). Pairs that do not rotate are copied as they are.
template <typename Element>
__device__ __forceinline__ void rotate_pair_fp8(const uint8_t* src, uint8_t* dst, const RotaryPair& pair,
                                                const float* cos, const float* sin, int position, int rotary_dim,
                                                float descale) {
    if (pair.freq < 0) {
        dst[pair.a] = src[pair.a];
        dst[pair.b] = src[pair.b];
        return;
    }
    auto dequantised = [&](uint8_t stored) {
        const __half_raw raw = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(stored), __NV_E4M3);
        return to_float(from_float<Element>(__fmul_rn(__half2float(__half(raw)), descale)));
    };
    const float x = dequantised(src[pair.a]), y = dequantised(src[pair.b]);
    const int at = position * (rotary_dim / 2) + pair.freq;
    const float c = cos[at], s = sin[at];
    auto requantised = [&](float rotated) {
        const float value = __fdiv_rn(to_float(from_float<Element>(rotated)), descale);
        return static_cast<uint8_t>(__nv_cvt_float_to_fp8(value, __NV_SATFINITE, __NV_E4M3));
    };
    dst[pair.a] = requantised(__fsub_rn(__fmul_rn(x, c), __fmul_rn(y, s)));
    dst[pair.b] = requantised(__fadd_rn(__fmul_rn(x, s), __fmul_rn(y, c)));
}

// Batch b's cache_seqlens and a rotary position, each checked before it is
// used (index_check.cuh): the new rows must fit the cache, and the tables hold
// the position.
__device__ __forceinline__ int cached_rows(const AppendParams& p, int b) {
    return checked_index(p.cache_seqlens[b], 0, p.capacity - p.seqlen_knew, p.faults, IndexArgument::kCacheSeqlens, b);
}

__device__ __forceinline__ int rotary_position(const AppendParams& p, int b, int position) {
    return p.rotary_dim == 0 ? 0
                             : checked_index(position, 0, p.rotary_rows - 1, p.faults, IndexArgument::kRotaryPosition, b);
}

// One thread per pair of elements: first the new keys and values (written into
// the cache), then the queries (written into q_rot when they rotate). kFp8Cache:
// the cache and the new keys and values are e4m3 (AppendParams::kv_fp8), q is
// Element.
template <typename Element, bool kFp8Cache>
__global__ void __launch_bounds__(256) kvcache_append_kernel(const AppendParams p) {
    using Stored = std::conditional_t<kFp8Cache, uint8_t, Element>;
    const int pairs = p.head_dim / 2;
    const int64_t kv_threads = static_cast<int64_t>(p.batch) * p.seqlen_knew * p.num_heads_k * pairs;
    const int64_t q_threads =
        p.q_rot_ptr == nullptr ? 0 : static_cast<int64_t>(p.batch) * p.seqlen_q * p.num_heads * pairs;
    int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const bool rotary = p.rotary_dim > 0;
    if (idx < kv_threads) {
        const int t = static_cast<int>(idx % pairs);
        idx /= pairs;
        const int h = static_cast<int>(idx % p.num_heads_k);
        idx /= p.num_heads_k;
        const int j = static_cast<int>(idx % p.seqlen_knew);
        const int b = static_cast<int>(idx / p.seqlen_knew);
        const int cached = cached_rows(p, b);
        const int cache_row = cached + j;
        int64_t kc, vc;  // the row's offset in the caches
        if (p.block_table != nullptr) {
            const int entry = cache_row / p.page_size;
            const int page = checked_index(p.block_table[b * p.block_table_batch_stride + entry], 0,
                                           p.num_cache_rows - 1, p.faults, IndexArgument::kBlockTable, b, entry);
            const int row = cache_row % p.page_size;
            kc = page * p.kc_batch_stride + row * p.kc_row_stride;
            vc = page * p.vc_batch_stride + row * p.vc_row_stride;
        } else {
            const int cache_b = p.kv_batch_idx == nullptr
                                    ? b
                                    : checked_index(p.kv_batch_idx[b], 0, p.num_cache_rows - 1, p.faults,
                                                    IndexArgument::kCacheBatchIdx, b);
            kc = cache_b * p.kc_batch_stride + static_cast<int64_t>(cache_row) * p.kc_row_stride;
            vc = cache_b * p.vc_batch_stride + static_cast<int64_t>(cache_row) * p.vc_row_stride;
        }
        const Stored* k_src = static_cast<const Stored*>(p.k_new_ptr) + b * p.knew_batch_stride +
                              j * p.knew_row_stride + h * p.knew_head_stride;
        const Stored* v_src = static_cast<const Stored*>(p.v_new_ptr) + b * p.vnew_batch_stride +
                              j * p.vnew_row_stride + h * p.vnew_head_stride;
        Stored* k_dst = static_cast<Stored*>(p.k_cache_ptr) + kc + h * p.kc_head_stride;
        Stored* v_dst = static_cast<Stored*>(p.v_cache_ptr) + vc + h * p.vc_head_stride;
        const RotaryPair pair = rotary_pair(t, rotary ? p.rotary_dim : 0, p.rotary_interleaved);
        if constexpr (kFp8Cache) {
            const float descale = p.k_descale == nullptr ? 1.f : p.k_descale[b * p.num_heads_k + h];
            rotate_pair_fp8<Element>(k_src, k_dst, pair, p.rotary_cos, p.rotary_sin, rotary_position(p, b, cache_row),
                                     p.rotary_dim, descale);
        } else {
            rotate_pair(k_src, k_dst, pair, p.rotary_cos, p.rotary_sin, rotary_position(p, b, cache_row),
                        p.rotary_dim);
        }
        if (2 * t < p.head_dim_v) {  // v's head dim may be below k's (a multiple of 8 too)
            v_dst[2 * t] = v_src[2 * t];
            v_dst[2 * t + 1] = v_src[2 * t + 1];
        }
        return;
    }
    idx -= kv_threads;
    if (idx >= q_threads) return;
    const int t = static_cast<int>(idx % pairs);
    idx /= pairs;
    const int h = static_cast<int>(idx % p.num_heads);
    idx /= p.num_heads;
    const int i = static_cast<int>(idx % p.seqlen_q);
    const int b = static_cast<int>(idx / p.seqlen_q);
    const int cached = cached_rows(p, b);
    const int position = rotary_position(p, b, cached + (p.q_positions_per_row ? i : 0));
    const Element* src = static_cast<const Element*>(p.q_ptr) + b * p.q_batch_stride + i * p.q_row_stride +
                         h * p.q_head_stride;
    Element* dst = static_cast<Element*>(p.q_rot_ptr) + ((static_cast<int64_t>(b) * p.seqlen_q + i) * p.num_heads + h) *
                                                            p.head_dim;
    rotate_pair(src, dst, rotary_pair(t, p.rotary_dim, p.rotary_interleaved), p.rotary_cos, p.rotary_sin, position,
                p.rotary_dim);
}

}  // namespace flash::sm80
