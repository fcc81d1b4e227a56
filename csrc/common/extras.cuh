// The optional parts of the score and probability pipeline, compiled only into
// the Has_extras kernels and switched on per call: softcap (scores become
// softcap * tanh(score / softcap)), ALiBi (a bias of -slope * |i + Sk - Sq - j|)
// and dropout (Philox keep flags, philox.cuh). The kernels hold scores in the
// "score unit" that flash.h describes, so capping is s = tanh(q.k * inner) and
// the bias is pre-divided by the unit's scale (params.alibi_scale).
//
// Fragments are mma accumulators: for m16 tile mt a thread holds rows
// lane/4 (+8) and columns (lane%4)*2 (+1) of each n8 tile. In the plain layout
// rows are queries and columns keys; Is_transposed swaps them (the dK/dV
// kernel's S^T).
#pragma once

#include <cmath>
#include <cstdint>

#include "common/flash.h"
#include "common/philox.cuh"

namespace flash {

// The extras of one (batch, head).
struct ScoreExtras {
    bool softcap;
    float softcap_inner_scale;
    float alibi_slope;  // in the score unit; 0 without ALiBi
    int diagonal;       // Sk - Sq

    __device__ __forceinline__ ScoreExtras(const FwdParams& params, int batch, int head, int diagonal_)
        : softcap(params.softcap > 0.f), softcap_inner_scale(params.softcap_inner_scale), diagonal(diagonal_) {
        alibi_slope = params.alibi_slopes_ptr == nullptr
                          ? 0.f
                          : params.alibi_slopes_ptr[batch * params.alibi_batch_stride + head] * params.alibi_scale;
    }
};

// Caps and biases the raw scores q.k of a fragment in place (before the mask).
// With softcap, dtanh (if not null) receives 1 - tanh^2 of each element: the
// backward's chain factor.
template <bool Is_transposed, int kMTiles, int kNTiles>
__device__ __forceinline__ void apply_score_extras(float (&s)[kMTiles][kNTiles][4], const ScoreExtras& extras,
                                                   int row0, int col0, int lane,
                                                   float (*dtanh)[kNTiles][4] = nullptr) {
    if (extras.softcap) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
            for (int j = 0; j < kNTiles; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float t = tanhf(s[mt][j][e] * extras.softcap_inner_scale);
                    s[mt][j][e] = t;
                    if (dtanh != nullptr) dtanh[mt][j][e] = 1.f - t * t;
                }
    }
    if (extras.alibi_slope != 0.f) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
            for (int j = 0; j < kNTiles; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int row = row0 + lane / 4 + mt * 16 + (e / 2) * 8;
                    const int col = col0 + j * 8 + (lane % 4) * 2 + e % 2;
                    const int query = Is_transposed ? col : row, key = Is_transposed ? row : col;
                    s[mt][j][e] -= extras.alibi_slope * static_cast<float>(abs(key - query - extras.diagonal));
                }
    }
}

// Dropout's keep flags of a fragment, bit mt * kNTiles * 4 + j * 4 + e for
// element [mt][j][e]; one Philox draw per pair of elements.
template <bool Is_transposed, int kMTiles, int kNTiles>
__device__ __forceinline__ uint64_t dropout_keep_bits(const DropoutRng& rng, int row0, int col0, int lane) {
    static_assert(kMTiles * kNTiles * 4 <= 64, "one bit per fragment element");
    uint64_t bits = 0;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int half = 0; half < 2; ++half)
#pragma unroll
            for (int j = 0; j < kNTiles; ++j) {
                const int row = row0 + lane / 4 + mt * 16 + half * 8;
                const int col = col0 + j * 8 + (lane % 4) * 2;  // even: the pair (col, col + 1)
                bool keep0, keep1;
                if (Is_transposed) {
                    rng.keep_query_pair(col, row, keep0, keep1);
                } else {
                    rng.keep_key_pair(row, col, keep0, keep1);
                }
                const int bit = mt * kNTiles * 4 + j * 4 + half * 2;
                bits |= (static_cast<uint64_t>(keep0) << bit) | (static_cast<uint64_t>(keep1) << (bit + 1));
            }
    return bits;
}

__device__ __forceinline__ bool kept(uint64_t bits, int mt, int j, int e, int kNTiles) {
    return (bits >> (mt * kNTiles * 4 + j * 4 + e)) & 1u;
}

// Zeroes the dropped elements of a fragment of probabilities.
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void drop(float (&p)[kMTiles][kNTiles][4], uint64_t keep_bits) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int j = 0; j < kNTiles; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (!kept(keep_bits, mt, j, e, kNTiles)) p[mt][j][e] = 0.f;
}

}  // namespace flash
