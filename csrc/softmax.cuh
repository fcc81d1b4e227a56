// Online softmax over the rows an mma fragment holds.
//
// Fragment layout (mma.m16n8k16 accumulators): for m16 tile `mt`, a thread holds
// rows g = lane/4 and g + 8, two adjacent columns per n8 tile: acc[mt][j][0..1]
// belong to row g, acc[mt][j][2..3] to row g + 8. The four threads of a quad
// (lanes 4g .. 4g+3) share a row, so row reductions are two xor-shuffles.
#pragma once

#include <cmath>

#include "ptx.cuh"

namespace flash {

template <int kMTiles>
struct OnlineSoftmax {
    static constexpr int kRows = 2 * kMTiles;
    float row_max[kRows];  // running max of the raw scores; -inf until the row sees a key
    float row_sum[kRows];  // this thread's share of sum(exp); quad-reduced once, in finalize

    __device__ __forceinline__ OnlineSoftmax() {
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
            row_max[r] = -INFINITY;
            row_sum[r] = 0.f;
        }
    }

    // Folds one tile of scores into the running state: updates the row max,
    // rescales the output accumulator and the running sum by exp(m_old - m_new),
    // and overwrites the scores with p = exp(score * scale - m_new * scale).
    // Works in base 2 with scale_log2 = softmax_scale * log2(e), so each p is one
    // FFMA and one ex2.
    template <int kNTilesS, int kNTilesO>
    __device__ __forceinline__ void update(float (&s)[kMTiles][kNTilesS][4],
                                           float (&o)[kMTiles][kNTilesO][4], float scale_log2) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int r = mt * 2 + half;
                float tile_max = row_max[r];
#pragma unroll
                for (int j = 0; j < kNTilesS; ++j) {
                    tile_max = fmaxf(tile_max, fmaxf(s[mt][j][2 * half], s[mt][j][2 * half + 1]));
                }
                tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
                tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
                // A row that has seen only masked keys keeps max = -inf; subtracting 0
                // instead keeps exp2(-inf - offset) = 0 rather than exp2(-inf + inf) = NaN.
                const float offset = (tile_max == -INFINITY) ? 0.f : tile_max * scale_log2;
                const float correction = exp2_approx(row_max[r] * scale_log2 - offset);
                row_max[r] = tile_max;
                row_sum[r] *= correction;
#pragma unroll
                for (int j = 0; j < kNTilesO; ++j) {
                    o[mt][j][2 * half] *= correction;
                    o[mt][j][2 * half + 1] *= correction;
                }
                float sum = 0.f;
#pragma unroll
                for (int j = 0; j < kNTilesS; ++j) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const float p = exp2_approx(fmaf(s[mt][j][2 * half + e], scale_log2, -offset));
                        s[mt][j][2 * half + e] = p;
                        sum += p;
                    }
                }
                row_sum[r] += sum;
            }
        }
    }

    // Normalises the output by the row sums and returns each row's natural-log
    // log-sum-exp of the scaled scores in lse[]. A row that saw no key gets
    // output 0 and lse = -inf (the log of an empty sum).
    template <int kNTilesO>
    __device__ __forceinline__ void finalize(float (&o)[kMTiles][kNTilesO][4], float softmax_scale,
                                             float (&lse)[kRows]) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int r = mt * 2 + half;
                float sum = row_sum[r];
                sum += __shfl_xor_sync(0xffffffffu, sum, 1);
                sum += __shfl_xor_sync(0xffffffffu, sum, 2);
                const bool empty = !(sum > 0.f);
                const float inv_sum = empty ? 0.f : 1.f / sum;
                lse[r] = empty ? -INFINITY : row_max[r] * softmax_scale + __logf(sum);
#pragma unroll
                for (int j = 0; j < kNTilesO; ++j) {
                    o[mt][j][2 * half] *= inv_sum;
                    o[mt][j][2 * half + 1] *= inv_sum;
                }
            }
        }
    }
};

}  // namespace flash
