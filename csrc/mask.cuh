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

// The key tiles a tile of query rows [m0, m0 + kRows) walks, in tiles of
// kKeys: [0, n_blocks) hold every key one of its rows sees, and tiles
// [n_unmasked, n_blocks) need a mask (sequence tail, causal diagonal).
struct KeyTileRange {
    int n_blocks;
    int n_unmasked;
};

template <bool Is_causal, int kRows, int kKeys>
__device__ __forceinline__ KeyTileRange key_tile_range(int m0, int seqlen_q, int seqlen_k) {
    KeyTileRange range{(seqlen_k + kKeys - 1) / kKeys, seqlen_k / kKeys};
    if (Is_causal) {
        const int diag = m0 + seqlen_k - seqlen_q;  // last key row m0 sees
        // One past the last key that the tile's last real row sees.
        const int last_key_end = min(m0 + kRows, seqlen_q) + seqlen_k - seqlen_q;
        range.n_blocks = min(range.n_blocks, last_key_end <= 0 ? 0 : (last_key_end + kKeys - 1) / kKeys);
        range.n_unmasked = min(range.n_unmasked, diag + 1 <= 0 ? 0 : (diag + 1) / kKeys);
    }
    return range;
}

// The mask on a transposed score fragment (rows are keys, columns queries), as
// the dK/dV kernel holds it: the warp's first key is `key0`, its first query
// `query0`. Keys past the sequence are hidden (a padded key row scores 0, and
// exp(0 - lse) of a row with a low lse would overflow 16 bits in P^T and dS^T,
// then meet K's zero rows in dQ as inf * 0), and, when causal, key j is hidden
// from query i iff j > i + Sk - Sq. Padded queries need no mask: their lse is
// +inf, so their p is 0.
template <bool Is_causal, int kMTiles, int kNTilesS>
__device__ __forceinline__ void apply_mask_transposed(float (&s)[kMTiles][kNTilesS][4], int key0, int query0,
                                                      int seqlen_q, int seqlen_k, int lane) {
    const int key_base = key0 + lane / 4;
    const int query_base = query0 + (lane % 4) * 2 + seqlen_k - seqlen_q;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int key = key_base + mt * 16 + half * 8;
#pragma unroll
            for (int j = 0; j < kNTilesS; ++j) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    if (key >= seqlen_k || (Is_causal && key > query_base + j * 8 + e)) {
                        s[mt][j][2 * half + e] = -INFINITY;
                    }
                }
            }
        }
    }
}

}  // namespace flash
