// Which keys a query sees, and which tiles need a mask at all.
//
// Query i of a sequence sees keys [key_begin(i), key_end(i)): the sequence's
// keys, cut by the window around the bottom-right diagonal d = i + Sk - Sq
// (causal: d + 0 on the right). Non-local attention is the same with both
// sides unbounded, so one set of formulas serves every case; the Is_local
// template flag only lets the non-local kernels skip the diagonal compares on
// the one tile they mask (the sequence tail). Masks are applied only on the
// tiles the ranges below mark; every other tile runs unmasked.
#pragma once

#include <cmath>

#include "common/flash.h"
#include "common/index_check.cuh"

namespace flash {

// One sequence of the batch: its lengths, where its rows start in the packed
// layout (0 in the padded one) or the cache, and its batch index in k and v.
struct Sequence {
    int seqlen_q, seqlen_k;
    int q_start, k_start;
    int kv_batch;
};

// flash_attn_with_kvcache's sequence b: its cache rows (flash.h).
__device__ __forceinline__ Sequence cache_sequence_of(const FwdParams& params, int batch) {
    const int cached = checked_index(params.cache_seqlens[batch], 0, params.kv_capacity - params.seqlen_knew,
                                     params.faults, IndexArgument::kCacheSeqlens, batch);
    const int k_start = params.leftpad_k == nullptr
                            ? 0
                            : checked_index(params.leftpad_k[batch], 0, cached, params.faults,
                                            IndexArgument::kCacheLeftpad, batch);
    const int kv_batch = params.kv_batch_idx == nullptr
                             ? batch
                             : checked_index(params.kv_batch_idx[batch], 0, params.kv_cache_batch - 1,
                                             params.faults, IndexArgument::kCacheBatchIdx, batch);
    return {params.seqlen_q, cached + params.seqlen_knew - k_start, 0, k_start, kv_batch};
}

// Entry `entry` of sequence b's block-table row `table`: the page it names,
// recorded (index_check.cuh) and clamped into [0, num_pages) when out of range.
// checked_page_value: the same check of a value read from the row earlier.
__device__ __forceinline__ int checked_page_value(const FwdParams& params, int page, int batch, int entry) {
    return checked_index(page, 0, params.kv_cache_batch - 1, params.faults, IndexArgument::kBlockTable, batch, entry);
}

__device__ __forceinline__ int checked_page(const FwdParams& params, const int* table, int batch, int entry) {
    return checked_page_value(params, table[entry], batch, entry);
}

// Sequence b of a variable-length batch: its cu_seqlens rows, cut by seqused_q/k
// and leftpad_k, keys counted from 0 when paged (Is_kvcache with a block table).
// The lengths that only narrow a sequence are clamped into it; cu_seqlens
// themselves are the caller's promise (checks.h), except a paged sequence's
// length, which must stay within its block-table row.
template <bool Is_kvcache>
__device__ __forceinline__ Sequence varlen_sequence_of(const FwdParams& params, int batch) {
    const bool paged = Is_kvcache && params.block_table != nullptr;
    const int q_start = params.cu_seqlens_q[batch];
    int seqlen_q = params.cu_seqlens_q[batch + 1] - q_start;
    if (params.seqused_q != nullptr) {
        seqlen_q = checked_index(params.seqused_q[batch], 0, max(seqlen_q, 0), params.faults,
                                 IndexArgument::kSequsedQ, batch);
    }
    int k_start = paged ? 0 : params.cu_seqlens_k[batch];
    int k_end = params.cu_seqlens_k[batch + 1] - params.cu_seqlens_k[batch];
    if (paged && params.seqused_k == nullptr) {
        k_end = checked_index(k_end, 0, params.kv_capacity, params.faults, IndexArgument::kCuSeqlensK, batch);
    }
    if (params.seqused_k != nullptr) {
        k_end = checked_index(params.seqused_k[batch], 0, paged ? params.kv_capacity : max(k_end, 0), params.faults,
                              IndexArgument::kSequsedK, batch);
    }
    const int leftpad = params.leftpad_k == nullptr
                            ? 0
                            : checked_index(params.leftpad_k[batch], 0, max(k_end, 0), params.faults,
                                            IndexArgument::kLeftpadK, batch);
    k_start += leftpad;
    return {seqlen_q, k_end - leftpad, q_start, k_start, batch};
}

// Sequence b's lengths and where its rows start (Is_kvcache: the kernels that
// read keys through a cache's indexing, flash.h).
template <bool Is_kvcache>
__device__ __forceinline__ Sequence sequence_of(const FwdParams& params, int batch) {
    if (Is_kvcache && params.cache_seqlens != nullptr) return cache_sequence_of(params, batch);
    if (params.cu_seqlens_q == nullptr) return {params.seqlen_q, params.seqlen_k, 0, 0, batch};
    return varlen_sequence_of<Is_kvcache>(params, batch);
}

struct Window {
    int seqlen_k;
    int begin_offset;  // key_begin(i) = max(0, i + begin_offset)
    int end_offset;    // key_end(i) = min(Sk, i + end_offset)
    int diagonal;      // Sk - Sq: query i's diagonal key is i + diagonal

    __host__ __device__ __forceinline__ int key_begin(int i) const { return max(0, i + begin_offset); }
    __host__ __device__ __forceinline__ int key_end(int i) const { return min(seqlen_k, i + end_offset); }
};

// An unbounded side is clamped to the sequence: a window of Sk keys to the left
// or Sq to the right already reaches every key, and the sums stay in int.
__host__ __device__ __forceinline__ Window window_of(int window_left, int window_right, int seqlen_q, int seqlen_k) {
    const int left = window_left < 0 ? seqlen_k : min(window_left, seqlen_k);
    const int right = window_right < 0 ? seqlen_q : min(window_right, seqlen_q);
    const int diagonal = seqlen_k - seqlen_q;
    return {seqlen_k, diagonal - left, diagonal + right + 1, diagonal};
}

__device__ __forceinline__ Window window_of(const FwdParams& params, int seqlen_q, int seqlen_k) {
    return window_of(params.window_left, params.window_right, seqlen_q, seqlen_k);
}

// A KV-cache sequence's window. With pack_gqa the rows are query heads at one
// position, the last: the window of that one row cuts the keys (moving
// seq.k_start and seq.seqlen_k), then every row sees all that is left.
__device__ __forceinline__ Window kvcache_window(const FwdParams& params, Sequence& seq) {
    if (!params.pack_gqa) return window_of(params, seq.seqlen_q, seq.seqlen_k);
    const Window one_row = window_of(params, 1, seq.seqlen_k);
    const int key_lo = one_row.key_begin(0), key_hi = one_row.key_end(0);
    seq.k_start += key_lo;
    seq.seqlen_k = max(0, key_hi - key_lo);
    return window_of(-1, -1, seq.seqlen_q, seq.seqlen_k);
}

// s: the warp's [kMTiles][kNTilesS][4] score fragment of the tile whose first
// query row is `row0` (this warp's first row) and first key is `col0`.
template <bool Is_local, int kMTiles, int kNTilesS>
__device__ __forceinline__ void apply_mask(float (&s)[kMTiles][kNTilesS][4], int row0, int col0,
                                           const Window& window, int lane) {
    const int row_base = row0 + lane / 4;
    const int col_base = col0 + (lane % 4) * 2;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = row_base + mt * 16 + half * 8;
            // The row's bounds relative to the thread's first column: each
            // element compares a constant (j * 8 + e) with two registers, and
            // no column index is held per element.
            const int begin = (Is_local ? window.key_begin(row) : 0) - col_base;
            const int end = (Is_local ? window.key_end(row) : window.seqlen_k) - col_base;
#pragma unroll
            for (int j = 0; j < kNTilesS; ++j) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    if (j * 8 + e >= end || j * 8 + e < begin) s[mt][j][2 * half + e] = -INFINITY;
                }
            }
        }
    }
}

// The mask on a transposed score fragment (rows are keys, columns queries), as
// the dK/dV kernel holds it: the warp's first key is `key0`, its first query
// `query0`. Keys past the sequence are hidden too (a padded key row scores 0,
// and exp(0 - lse) of a row with a low lse would overflow 16 bits in P^T and
// dS^T, then meet K's zero rows in dQ as inf * 0). Padded queries need no
// mask: their lse is +inf, so their p is 0.
template <bool Is_local, int kMTiles, int kNTilesS>
__device__ __forceinline__ void apply_mask_transposed(float (&s)[kMTiles][kNTilesS][4], int key0, int query0,
                                                      const Window& window, int lane) {
    const int key_base = key0 + lane / 4;
    const int query_base = query0 + (lane % 4) * 2;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int key = key_base + mt * 16 + half * 8;
#pragma unroll
            for (int j = 0; j < kNTilesS; ++j) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int query = query_base + j * 8 + e;
                    const bool hidden = key >= window.seqlen_k ||
                                        (Is_local && (key < query + window.begin_offset ||
                                                      key >= query + window.end_offset));
                    if (hidden) s[mt][j][2 * half + e] = -INFINITY;
                }
            }
        }
    }
}

// The key tiles of kKeys keys that query rows [m0, m0 + kRows) walk: tiles
// [n_begin, n_end) hold every key one of the rows sees; of them, tiles
// [full_begin, full_end) are seen whole by every row (no mask), the others
// (window edges, causal diagonal, sequence tail) need one.
struct KeyTileRange {
    int n_begin, n_end;
    int full_begin, full_end;
};

template <int kRows, int kKeys>
__host__ __device__ __forceinline__ KeyTileRange key_tile_range(int m0, int seqlen_q, const Window& window) {
    const int m_last = min(m0 + kRows, seqlen_q) - 1;
    const int key_lo = window.key_begin(m0), key_hi = window.key_end(m_last);
    if (key_hi <= key_lo) return {0, 0, 0, 0};
    KeyTileRange range;
    range.n_begin = key_lo / kKeys;
    range.n_end = (key_hi + kKeys - 1) / kKeys;
    // A tile is whole for every row when its first key is at or after the last
    // row's first key and its last key before the first row's end.
    const int full_lo = window.key_begin(m_last), full_hi = max(0, window.key_end(m0));
    range.full_begin = min(max((full_lo + kKeys - 1) / kKeys, range.n_begin), range.n_end);
    range.full_end = min(max(full_hi / kKeys, range.full_begin), range.n_end);
    return range;
}

// The key tiles that rows [row0, row0 + kRows) of a block compute while the
// block walks `block` (its key_tile_range) from the last tile down: their own
// range, inside the block's; where they lie past the sequence or see no key,
// an empty range at block.n_begin (key_tile_range's empty {0, 0} would lie
// below a window's first tile), so that a walk that takes the tiles above
// n_end and below n_begin as idle steps takes every tile once either way.
template <int kRows, int kKeys>
__host__ __device__ __forceinline__ KeyTileRange rows_key_tiles(const KeyTileRange& block, int row0, int seqlen_q,
                                                                 const Window& window) {
    if (row0 < seqlen_q) {
        const KeyTileRange rows = key_tile_range<kRows, kKeys>(row0, seqlen_q, window);
        if (rows.n_begin < rows.n_end) return rows;
    }
    return {block.n_begin, block.n_begin, block.n_begin, block.n_begin};
}

// Split `split` of `num_splits` of a tile range: an even share of whole tiles.
__device__ __forceinline__ KeyTileRange split_key_tiles(const KeyTileRange& tiles, int split, int num_splits) {
    if (num_splits <= 1) return tiles;
    const int per_split = (tiles.n_end - tiles.n_begin + num_splits - 1) / num_splits;
    const int begin = min(tiles.n_begin + split * per_split, tiles.n_end);
    const int end = min(begin + per_split, tiles.n_end);
    return {begin, end, min(max(tiles.full_begin, begin), end), min(max(tiles.full_end, begin), end)};
}

// The query tiles of kRows queries that see a key of [n0, n0 + kKeys):
// [m_begin, m_end).
struct QueryTileRange {
    int m_begin, m_end;
};

template <int kRows, int kKeys>
__device__ __forceinline__ QueryTileRange query_tile_range(int n0, int seqlen_q, const Window& window) {
    // Query i sees a key of the tile iff key_begin(i) <= n0 + kKeys - 1 and key_end(i) > n0.
    const int q_lo = max(0, n0 - window.end_offset + 1);
    const int q_hi = min(seqlen_q, n0 + kKeys - window.begin_offset);
    if (q_hi <= q_lo) return {0, 0};
    return {q_lo / kRows, (q_hi + kRows - 1) / kRows};
}

// Whether every query of [m0, m0 + kRows) sees every key of [n0, n0 + kKeys).
template <int kRows, int kKeys>
__device__ __forceinline__ bool tile_is_full(int m0, int n0, int seqlen_q, const Window& window) {
    const int m_last = min(m0 + kRows, seqlen_q) - 1;
    return window.key_begin(m_last) <= n0 && window.key_end(m0) >= n0 + kKeys;
}

}  // namespace flash
