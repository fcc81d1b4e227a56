// Tile shapes of the sm80 family's KV-cache kernels: the tiled forward over a
// cache (more than kDecodeRows rows per block) and the decoding kernel.
#pragma once

#include "sm80/kernel_traits.h"

namespace flash::sm80 {

constexpr int kMaxKvSplits = 128;  // the most splits a call takes (more are clamped)
// Up to this many rows per (batch, head) -- with pack_gqa per KV head -- a
// KV-cache forward runs the decoding kernel (which merges its own splits).
constexpr int kDecodeRows = 16;
static_assert(kDecodeRows == kFp8KvcacheMaxRows, "an FP8 cache's calls are the decoding kernel's");

// The decoding kernel's head dim for an FP8 cache of `head_dim` (a multiple of
// 16): the smallest compiled one that holds it, whose 8-bit rows are whole
// 64-byte blocks (64, 128, 192, 256).
constexpr int fp8_cache_head_dim(int head_dim) {
    return head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : head_dim <= 192 ? 192 : 256;
}

// The KV-cache forward for more than kDecodeRows rows per block (chunked
// prefill, a GQA group of more than 16 heads): 64-row tiles, every option
// switched at run time (one kernel per dtype and head dim).
template <int kHeadDim, typename Element>
using KvcacheTraits = FwdKernelTraits<kHeadDim, 64, 64, 4, Element>;

// The decoding kernel (decode_kernel.cuh): a block holds up to kRows query
// rows and walks key tiles of kBlockN keys, 16 per warp, with kStages - 1
// tiles in flight while it computes on one. Decoding is bound by reading the
// cache; two shapes of block, picked per call (plan_kvcache in kvcache.cu),
// reach the memory's bandwidth in different regimes:
//   Wide:  a 108 KB budget (3 stages at d128), at most two blocks per SM: the
//          most bytes in flight per block, for one block per SM (a few
//          (batch, KV head) pairs split across the SMs);
//   Dense: a 76 KB budget (2 stages at d128): three blocks per SM on the H100,
//          for many (batch, KV head) pairs.
// Four warps (64-key tiles) up to d128, two (32-key tiles) beyond, where a
// 64-key stage would not fit twice in the budget. Dense fits the 99 KB of
// sm_86/sm_89; Wide needs the larger shared memory of sm_80/sm_90.
// kFp8Kv: the cache is e4m3 (fp8_cache.cuh), Element q's and out's 16-bit
// type; its K and V tiles take half the bytes, so the budget holds more stages.
template <int kHeadDim_, typename Element_, bool Wide, bool kFp8Kv_ = false>
struct DecodeTraits {
    using Element = Element_;
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr bool kFp8Kv = kFp8Kv_;
    static constexpr int kKvBytes = kFp8Kv ? 1 : 2;  // bytes of a cache element
    static constexpr int kRows = kDecodeRows;  // one m16 tile
    static constexpr int kNWarps = kHeadDim <= 128 ? 4 : 2;
    static constexpr int kBlockN = 16 * kNWarps;
    static constexpr int kNThreads = kNWarps * 32;
    static constexpr int kNTilesO = kHeadDim / 8;
    static constexpr int kKSteps = kHeadDim / 16;
    using QTile = SmemTile<kRows, kHeadDim>;
    // The cache's tiles as 16-bit units (byte pairs when kFp8Kv).
    using KVTile = SmemTile<kBlockN, kHeadDim * kKvBytes / 2>;
    static constexpr int kBudget = (Wide ? 108 : 76) * 1024;
    // Paged caches: block-table entries staged in shared memory, two windows of
    // kTableWindow (one read while the next lands, decode_kernel.cuh).
    static constexpr int kTableWindow = 512;
    static constexpr int kTableBytes = 2 * kTableWindow * 4;
    static constexpr int kStageBytes = 2 * KVTile::kBytes;  // K then V
    static constexpr int kFitStages = (kBudget - QTile::kBytes - kTableBytes) / kStageBytes;
    static constexpr int kStages = kFitStages < 2 ? 2 : kFitStages > 6 ? 6 : kFitStages;
    static constexpr int kSmemStagesOffset = QTile::kBytes;
    static constexpr int kSmemTableOffset = kSmemStagesOffset + kStages * kStageBytes;
    static constexpr int kSmemBytes = kSmemTableOffset + kTableBytes;
    static_assert(kTableWindow * 4 % (kNThreads * 4) == 0, "whole table-window copies");
    // A window (>= kTableWindow rows: pages hold at least one) spans the tiles in
    // flight, so the next window has landed before the lookups enter it.
    static_assert(kTableWindow / kBlockN >= kStages, "a table window must span the pipeline");
    // Blocks per SM the registers must allow (Dense at d128: three, so at most
    // 170 registers a thread).
    static constexpr int kMinBlocksPerSm = Wide ? 1 : 3;
    // The Q copy uses as many threads as 16 rows keep busy with whole passes.
    static constexpr int kQCopyThreads = kNThreads < kRows * QTile::kBlockChunks ? kNThreads
                                                                                 : kRows * QTile::kBlockChunks;
    static_assert(kNWarps * kRows * kHeadDim * 4 <= kStages * kStageBytes,
                  "the warps' fp32 partial outputs are merged in the stage buffers");
    static_assert((kNWarps + 1) * kRows * 4 <= QTile::kBytes, "the warps' LSEs are merged in the Q tile");
    static_assert(kSmemBytes <= kBudget, "over the shared memory budget");
};

}  // namespace flash::sm80
