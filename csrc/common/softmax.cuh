// Online softmax over the rows an mma fragment holds.
//
// Fragment layout (mma.m16n8k16 accumulators): for m16 tile `mt`, a thread holds
// rows g = lane/4 and g + 8, two adjacent columns per n8 tile: acc[mt][j][0..1]
// belong to row g, acc[mt][j][2..3] to row g + 8. The four threads of a quad
// (lanes 4g .. 4g+3) share a row, so row reductions are two xor-shuffles.
#pragma once

#include <cmath>

#include "common/ptx.cuh"

namespace flash {

constexpr float kLn2 = 0.6931471805599453f;  // lse in natural log = lse in base 2 * ln(2)
constexpr float kLog2e = 1.4426950408889634f;  // exp(x) = exp2(x * log2(e))

// The forward's natural-log lse of a query row, in base 2 for the backward's
// exp2. A row that saw no key (lse = -inf) or lies past the sequence (passed as
// -inf) gets +inf, so that every p of the row is exp2(s - inf) = 0 rather than
// exp2(-inf + inf) = NaN.
__device__ __forceinline__ float lse_to_log2(float lse) { return lse == -INFINITY ? INFINITY : lse * kLog2e; }

// kExpBias: every p is taken 2^kExpBias larger (exp2(s * scale_log2 - m +
// kExpBias)), the row sums with them, so that out = sum p v / sum p is the same
// (row_offset is the unbiased one less kExpBias, so the LSE, row_offset +
// log2(sum), is the same): FP8 attention's P uses e4m3's range up to 2^8 (its
// largest normal is 448), not only up to 1.
//
// kChains: the independent chains of a row's sum over a tile (1: one add after
// the other, the rounding of the sum fixed by the order of the keys); above 1
// the row max is a tree over the tile's scores (pairs, then pairs of those, ...)
// instead of one chain of fmax. FP8's tiles take so little tensor-core time
// against their softmax that dependent chains of 96 adds or fmax per row show
// (NOTES.md). The max is exact in any order; the sum's rounding changes at
// fp32's level.
//
// kSlack: a row keeps the offset its p are taken against while its max grows
// by at most kSlack (base 2) past it, so that p stays below 2^(kExpBias +
// kSlack) and neither the output nor the sum is rescaled for it (0: the offset
// follows every new max). Late in a long row the max moves by little, and a
// warp rescales its output whenever one of its 16 rows' max moves.
template <int kMTiles, int kExpBias = 0, int kChains = 1, int kSlack = 0>
struct OnlineSoftmax {
    static constexpr int kRows = 2 * kMTiles;
    float row_max[kRows];     // running max of the raw scores; -inf until the row sees a key
    float row_offset[kRows];  // row_max * scale_log2 as rounded once: the exponent every p was taken against
    float row_sum[kRows];     // this thread's share of sum(exp); quad-reduced once, in finalize

    __device__ __forceinline__ OnlineSoftmax() {
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
            row_max[r] = -INFINITY;
            row_offset[r] = 0.f;
            row_sum[r] = 0.f;
        }
    }

    // A learnable sink (sink.cuh) as each row's first column, seen before any
    // key: the max starts at it and the sum at its term, with nothing added to
    // the output, so that the rows are normalised over the keys and the sink
    // by the loop and finalize as they are (a row that then sees no key keeps
    // the sink alone: output 0, lse = sink). sink_log2[r]: row r's sink in the
    // base-2 domain, -inf for none (the state stays as constructed). The sum's
    // term goes to one thread of the quad (finalize adds the quad's shares).
    // Called before the loop, where it holds no register the loop needs.
    __device__ __forceinline__ void start_at_sink(const float (&sink_log2)[kRows], float scale_log2, int lane) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
            if (sink_log2[r] == -INFINITY) continue;
            // Any max in score units works, as long as every p is taken against
            // row_offset: the sink's own term is 2^(sink_log2 - row_offset), ~1.
            static_assert(kExpBias == 0, "a sink with a biased exponent");
            row_max[r] = __fdividef(sink_log2[r], scale_log2);
            row_offset[r] = row_max[r] * scale_log2;
            row_sum[r] = lane % 4 == 0 ? exp2_approx(sink_log2[r] - row_offset[r]) : 0.f;
        }
    }

    // exp(m_old - m_new) per row (1 exactly when the max did not move), and
    // whether any row max of the warp moved.
    struct Correction {
        float factor[kRows];
        bool any_moved;
    };

    // Folds one tile of scores into the running state: updates the row max,
    // rescales the output accumulator and the running sum by exp(m_old - m_new),
    // and overwrites the scores with p = exp(score * scale - m_new * scale).
    // Works in base 2 with scale_log2 = softmax_scale * log2(e), so each p is one
    // FFMA and one ex2.
    template <int kNTilesS, int kNTilesO>
    __device__ __forceinline__ void update(float (&s)[kMTiles][kNTilesS][4],
                                           float (&o)[kMTiles][kNTilesO][4], float scale_log2) {
        const Correction correction = fold_max(s, scale_log2);
        rescale(o, correction);
        exponentiate(s, scale_log2);
    }

    // update() in its three steps, for kernels that rescale the output later
    // (the sm90 kernel, whose O += P V of the previous tile is still running
    // while this tile's scores are folded in). fold_max: the new row max, the
    // running sums rescaled; returns the output's correction.
    template <int kNTilesS>
    __device__ __forceinline__ Correction fold_max(const float (&s)[kMTiles][kNTilesS][4], float scale_log2) {
        Correction correction;
        bool max_moved = false;
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int r = mt * 2 + half;
                float m_new;
                if constexpr (kChains == 1) {
                    m_new = row_max[r];
#pragma unroll
                    for (int j = 0; j < kNTilesS; ++j) {
                        m_new = fmaxf(m_new, fmaxf(s[mt][j][2 * half], s[mt][j][2 * half + 1]));
                    }
                } else {
                    float m[kNTilesS];
#pragma unroll
                    for (int j = 0; j < kNTilesS; ++j) m[j] = fmaxf(s[mt][j][2 * half], s[mt][j][2 * half + 1]);
#pragma unroll
                    for (int width = 1; width < kNTilesS; width *= 2) {
#pragma unroll
                        for (int j = 0; j + width < kNTilesS; j += 2 * width) m[j] = fmaxf(m[j], m[j + width]);
                    }
                    m_new = fmaxf(m[0], row_max[r]);
                }
                m_new = fmaxf(m_new, __shfl_xor_sync(0xffffffffu, m_new, 1));
                m_new = fmaxf(m_new, __shfl_xor_sync(0xffffffffu, m_new, 2));
                // A row that has seen only masked keys keeps max = -inf; subtracting 0
                // instead keeps exp2(-inf - offset) = 0 rather than exp2(-inf + inf) = NaN.
                float offset = (m_new == -INFINITY) ? 0.f : m_new * scale_log2;
                if constexpr (kExpBias != 0) offset = (m_new == -INFINITY) ? 0.f : offset - kExpBias;
                if constexpr (kSlack != 0) {
                    if (row_max[r] != -INFINITY && offset <= row_offset[r] + kSlack) {
                        // Within the slack: the offset (and the max it was taken at) stay.
                        correction.factor[r] = 1.f;
                        continue;
                    }
                }
                // The difference of the two stored offsets, not row_max * scale_log2 -
                // offset: the compiler contracts that into an FMA whose result is the
                // product's rounding error, not 0, when the max did not move, and a
                // factor 2^err != 1 on every key tile adds up over a long row (1e-3 in
                // the LSE at 256k keys). A row that saw no key yet has nothing to scale.
                correction.factor[r] = (row_max[r] == -INFINITY) ? 0.f : exp2_approx(row_offset[r] - offset);
                max_moved |= m_new != row_max[r];
                row_max[r] = m_new;
                row_offset[r] = offset;
                row_sum[r] *= correction.factor[r];
            }
        }
        // Late in the key loop most tiles leave every row max of the warp where it
        // was; then every correction is exactly 1 and rescale() skips its
        // multiplies (a warp-uniform branch, so no divergence).
        correction.any_moved = __any_sync(0xffffffffu, max_moved);
        return correction;
    }

    // The scores, after fold_max, overwritten by p = exp2(score * scale_log2 -
    // row_offset), and added to the running sums.
    template <int kNTilesS>
    __device__ __forceinline__ void exponentiate(float (&s)[kMTiles][kNTilesS][4], float scale_log2) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int r = mt * 2 + half;
                float sums[kChains];
#pragma unroll
                for (int c = 0; c < kChains; ++c) sums[c] = 0.f;
#pragma unroll
                for (int j = 0; j < kNTilesS; ++j) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const float p = exp2_approx(fmaf(s[mt][j][2 * half + e], scale_log2, -row_offset[r]));
                        s[mt][j][2 * half + e] = p;
                        sums[j % kChains] += p;
                    }
                }
                float sum = sums[0];
#pragma unroll
                for (int c = 1; c < kChains; ++c) sum += sums[c];
                row_sum[r] += sum;
            }
        }
    }

    // The output accumulator times the correction of its rows.
    template <int kNTilesO>
    __device__ __forceinline__ static void rescale(float (&o)[kMTiles][kNTilesO][4], const Correction& correction) {
        if (correction.any_moved) {
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
                for (int j = 0; j < kNTilesO; ++j) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) o[mt][j][e] *= correction.factor[mt * 2 + e / 2];
                }
            }
        }
    }

    // Normalises the output by the row sums and returns each row's natural-log
    // log-sum-exp of the scaled scores in lse[]. A row that saw no key gets
    // output 0 and lse = -inf (the log of an empty sum); a NaN score makes the
    // sum, hence the row's output and lse, NaN (the max ignores NaN: fmaxf).
    template <int kNTilesO>
    __device__ __forceinline__ void finalize(float (&o)[kMTiles][kNTilesO][4], float (&lse)[kRows]) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int r = mt * 2 + half;
                float sum = row_sum[r];
                sum += __shfl_xor_sync(0xffffffffu, sum, 1);
                sum += __shfl_xor_sync(0xffffffffu, sum, 2);
                const bool empty = sum == 0.f;
                const float inv_sum = empty ? 0.f : 1.f / sum;
                // Every p was exp2(score * scale_log2 - row_offset): the LSE in base 2 is
                // row_offset + log2(sum), with no rounding of row_max * scale_log2 between.
                // (With kExpBias, row_offset holds it already: p = 2^(s - row_offset) is
                // 2^kExpBias times the unbiased p, and so is the sum.)
                lse[r] = empty ? -INFINITY : (row_offset[r] + log2_approx(sum)) * kLn2;
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
