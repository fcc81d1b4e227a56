// The order in which the sm90 forward's persistent blocks take their query
// tiles when they draw them (a causal mask or a window: fwd_kernel.cuh,
// WorkQueue).
//
// A call's tiles are (tile, head) pairs: `tiles` query tiles for each of
// `heads` heads (a head here is a (batch, head) pair). Under a causal mask the
// tiles of a head differ in work by up to the sequence's length over the tile's.
// Taken head after head, longest first within each, the last heads' long tiles
// start late and end after the other SMs have run dry. Taken longest first
// over all heads, the last tiles are the shortest, but the blocks at work at
// one time then read as many heads' K and V as there are SMs, far more than L2
// holds. So heads are taken in sections of `section` heads, as many as fit in
// half of L2, and within a section tile after tile (the section's heads' tile
// 0, then their tile 1, ...), tile 0 being the longest: each section ends on
// short tiles, and its keys stay in L2 while its tiles run. A section of one
// head is the order head after head, which the forward keeps where every tile
// takes as long as the others.
#pragma once

#include <cstdint>

namespace flash::sm90 {

struct TileOfHead {
    int tile, head;
};

// The t-th tile taken: its tile index (0 first) and head.
__host__ __device__ __forceinline__ TileOfHead tile_in_order(int t, int tiles, int heads, int section) {
    const int section_tiles = section * tiles;
    const int s = t / section_tiles;
    const int r = t - s * section_tiles;
    const int heads_here = heads - s * section < section ? heads - s * section : section;  // the last may be short
    return {r / heads_here, s * section + r % heads_here};
}

// The heads of a section: as many as half of L2 holds, given what each of a
// head's tiles reads again (its K and V), at least one and at most `heads`.
inline int heads_per_section(int64_t bytes_per_head, int64_t l2_bytes, int heads) {
    const int most = heads > 0 ? heads : 1;
    if (bytes_per_head <= 0) return most;
    const int64_t fit = l2_bytes / 2 / bytes_per_head;
    return static_cast<int>(fit < 1 ? 1 : fit > most ? most : fit);
}

}  // namespace flash::sm90
