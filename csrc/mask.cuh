// Masks for one tile of scores: keys past the end of the sequence and, when
// causal, keys after the query's diagonal (bottom-right aligned: query i sees
// key j iff j <= i + Sk - Sq). Called only on the tiles that need it.
#pragma once

#include <cmath>

namespace flash {

// s: the warp's [kMTiles][kNTilesS][4] score fragment of the tile whose first
// query row is `row0` (this warp's first row) and first key is `col0`.
template <bool Is_causal, int kMTiles, int kNTilesS>
__device__ __forceinline__ void apply_mask(float (&s)[kMTiles][kNTilesS][4], int row0, int col0,
                                           int seqlen_q, int seqlen_k, int lane) {
    const int row_base = row0 + lane / 4;
    const int col_base = col0 + (lane % 4) * 2;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = row_base + mt * 16 + half * 8;
            // One past the last visible key of this row.
            const int col_end = Is_causal ? min(seqlen_k, row + seqlen_k - seqlen_q + 1) : seqlen_k;
#pragma unroll
            for (int j = 0; j < kNTilesS; ++j) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    if (col_base + j * 8 + e >= col_end) s[mt][j][2 * half + e] = -INFINITY;
                }
            }
        }
    }
}

}  // namespace flash
