// Dropout's random numbers: Philox4x32-10 (Salmon et al., "Parallel random
// numbers: as easy as 1, 2, 3", SC'11), a counter-based generator, so any
// thread can draw the number of any (batch, head, query, key) without state,
// and the backward redraws the forward's mask instead of storing it.
//
// One draw covers a 2 x 2 block of (query pair, key pair): the forward holds
// two adjacent keys of a query per fragment pair, the transposed backward two
// adjacent queries of a key, and both use two of the draw's four words.
// flashattn/philox.py computes the same numbers on the CPU (tests compare).
#pragma once

#include <cstdint>

namespace flash {

struct PhiloxKey {
    uint32_t k0, k1;
};

__host__ __device__ __forceinline__ uint4 philox4x32_10(uint4 ctr, PhiloxKey key) {
    constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;  // round multipliers
    constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;  // key schedule increments
#pragma unroll
    for (int round = 0; round < 10; ++round) {
        const uint64_t p0 = static_cast<uint64_t>(kMul0) * ctr.x;
        const uint64_t p1 = static_cast<uint64_t>(kMul1) * ctr.z;
        const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
        const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
        ctr = make_uint4(hi1 ^ ctr.y ^ key.k0, lo1, hi0 ^ ctr.w ^ key.k1, lo0);
        key.k0 += kWeyl0;
        key.k1 += kWeyl1;
    }
    return ctr;
}

// Draws of one (batch, head): seed and offset from rng_state, the (b, h)
// stream in the counter's third word.
struct DropoutRng {
    PhiloxKey key;
    uint32_t stream;  // b * H + h
    uint32_t offset;  // low word of rng_state[1]
    uint32_t threshold;

    DropoutRng() = default;
    __device__ __forceinline__ DropoutRng(const int64_t* rng_state, int batch, int num_heads, int head,
                                          uint32_t threshold_)
        : threshold(threshold_) {
        const uint64_t seed = static_cast<uint64_t>(rng_state[0]);
        key = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
        stream = static_cast<uint32_t>(batch * num_heads + head);
        offset = static_cast<uint32_t>(static_cast<uint64_t>(rng_state[1]));
    }

    // The draw of the block holding query `query` and key `key_index`.
    __device__ __forceinline__ uint4 draw(int query, int key_index) const {
        return philox4x32_10(make_uint4(static_cast<uint32_t>(key_index) >> 1, static_cast<uint32_t>(query) >> 1,
                                        stream, offset),
                             key);
    }

    __device__ __forceinline__ bool keep(uint32_t word) const { return (word & 0xFFFFu) >= threshold; }

    // Keep flags of keys (key, key + 1) of query `query`, key even: the block's
    // words 2 * (query & 1) and 2 * (query & 1) + 1.
    __device__ __forceinline__ void keep_key_pair(int query, int key_index, bool& keep0, bool& keep1) const {
        const uint4 r = draw(query, key_index);
        const bool odd = query & 1;
        keep0 = keep(odd ? r.z : r.x);
        keep1 = keep(odd ? r.w : r.y);
    }

    // Keep flags of queries (query, query + 1) of key `key_index`, query even:
    // the block's words (key & 1) and 2 + (key & 1).
    __device__ __forceinline__ void keep_query_pair(int query, int key_index, bool& keep0, bool& keep1) const {
        const uint4 r = draw(query, key_index);
        const bool odd = key_index & 1;
        keep0 = keep(odd ? r.y : r.x);
        keep1 = keep(odd ? r.w : r.z);
    }
};

}  // namespace flash
