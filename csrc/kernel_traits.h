// Tile shapes and shared-memory layout of the forward kernel, derived from a few
// constants per head dim and checked at compile time.
#pragma once

#include <cstdint>

namespace flash {

// A [kRows, kCols] tile of 16-bit elements in shared memory. Rows are cut into
// column blocks of 64 elements (128 bytes) -- 32 elements (64 bytes) when the
// width is not a multiple of 64 -- and the 16-byte chunks of each block row are
// XOR-swizzled, so that the 8 row addresses of one ldmatrix phase (same logical
// chunk, 8 consecutive rows) fall in 8 different 16-byte bank groups.
template <int kRows_, int kCols_>
struct SmemTile {
    static constexpr int kRows = kRows_;
    static constexpr int kCols = kCols_;
    static constexpr int kChunkElems = 8;  // one 16-byte chunk of 16-bit elements
    static constexpr int kChunksPerRow = kCols / kChunkElems;
    static constexpr int kBlockChunks = (kCols % 64 == 0) ? 8 : 4;  // chunks per block row
    static constexpr int kBytes = kRows * kCols * 2;
    static_assert(kCols % 32 == 0, "tile width must be a multiple of 32 elements");
    static_assert(kRows % 8 == 0, "the swizzle pattern repeats every 8 rows");

    static constexpr int kBlockRowBytes = kBlockChunks * 16;
    static constexpr int kBlockBytes = kRows * kBlockRowBytes;

    __device__ __forceinline__ static int swizzle(int row) {
        // 128-byte block rows: 8 rows span the 8 bank groups; 64-byte block rows:
        // two rows share a 128-byte line, so the pattern advances every 2 rows.
        return (kBlockChunks == 8) ? (row & 7) : ((row >> 1) & 3);
    }

    // Byte offset of chunk `chunk` (0 .. kChunksPerRow-1) of row `row`.
    __device__ __forceinline__ static uint32_t offset(int row, int chunk) {
        const int block = chunk / kBlockChunks;
        const int within = chunk % kBlockChunks;
        return static_cast<uint32_t>(block * kBlockBytes + row * kBlockRowBytes + (within ^ swizzle(row)) * 16);
    }

    // ldmatrix addressing without per-load arithmetic. A lane that reads row
    // `row_lane + R` and chunk `chunk_lane + C`, with R a multiple of 8 and C
    // even (both compile-time in unrolled loops) and chunk_lane in {0, 1}, finds
    // its swizzled chunk as (C % kBlockChunks) ^ chunk_lane ^ swizzle(row_lane):
    // R leaves the swizzle unchanged and C's low bit is free. So one byte offset
    // per even chunk position is precomputed and everything else is an immediate.
    struct LaneOffsets {
        uint32_t base[kBlockChunks / 2];
    };

    __device__ __forceinline__ static LaneOffsets lane_offsets(int row_lane, int chunk_lane) {
        LaneOffsets lo;
#pragma unroll
        for (int i = 0; i < kBlockChunks / 2; ++i) {
            lo.base[i] = static_cast<uint32_t>(row_lane * kBlockRowBytes +
                                               ((2 * i) ^ chunk_lane ^ swizzle(row_lane)) * 16);
        }
        return lo;
    }

    __device__ __forceinline__ static uint32_t offset(const LaneOffsets& lo, int R, int C) {
        return lo.base[(C % kBlockChunks) / 2] + (C / kBlockChunks) * kBlockBytes + R * kBlockRowBytes;
    }
};

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, typename Element_>
struct FwdKernelTraits {
    using Element = Element_;  // __half or __nv_bfloat16
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kBlockM = kBlockM_;  // query rows per thread block
    static constexpr int kBlockN = kBlockN_;  // keys per main-loop step
    static constexpr int kNWarps = kNWarps_;
    static constexpr int kNThreads = kNWarps * 32;

    // Each warp owns kWarpRows consecutive query rows, so the softmax row
    // statistics never leave the warp.
    static constexpr int kWarpRows = kBlockM / kNWarps;
    static constexpr int kMTiles = kWarpRows / 16;    // m16 tiles per warp
    static constexpr int kNTilesS = kBlockN / 8;      // n8 tiles of S = Q K^T per warp
    static constexpr int kNTilesO = kHeadDim / 8;     // n8 tiles of O per warp
    static constexpr int kKStepsQK = kHeadDim / 16;   // k16 steps of Q K^T
    static constexpr int kKStepsPV = kBlockN / 16;    // k16 steps of P V
    static constexpr int kRowsPerThread = 2 * kMTiles;  // an mma fragment holds rows g and g+8

    using QTile = SmemTile<kBlockM, kHeadDim>;  // also stages O for the final store
    using KTile = SmemTile<kBlockN, kHeadDim>;
    using VTile = SmemTile<kBlockN, kHeadDim>;
    static constexpr int kSmemQOffset = 0;
    static constexpr int kSmemKOffset = kSmemQOffset + QTile::kBytes;
    static constexpr int kSmemVOffset = kSmemKOffset + KTile::kBytes;
    static constexpr int kSmemBytes = kSmemVOffset + VTile::kBytes;

    static_assert(kBlockM % (16 * kNWarps) == 0, "each warp needs whole m16 tiles");
    static_assert(kBlockN % 16 == 0 && kHeadDim % 16 == 0, "mma k16 steps");
    static_assert(kNTilesS % 2 == 0 && kNTilesO % 2 == 0, "ldmatrix.x4 loads two n8 tiles");
    static_assert(kSmemBytes <= 163 * 1024, "shared memory over the sm_80 per-block limit");
};

// Tile config per compiled head dim, {kBlockM, kBlockN, kNWarps}: the fastest
// measured on the H100 (benchmarks/NOTES.md). It may need up to 128 KB of shared
// memory per block, which A100 and H100 have.
template <int kHeadDim> struct FwdConfig;
template <> struct FwdConfig<32> { static constexpr int kBlockM = 128, kBlockN = 64, kNWarps = 4; };
template <> struct FwdConfig<64> { static constexpr int kBlockM = 128, kBlockN = 64, kNWarps = 4; };
template <> struct FwdConfig<96> { static constexpr int kBlockM = 128, kBlockN = 64, kNWarps = 4; };
template <> struct FwdConfig<128> { static constexpr int kBlockM = 128, kBlockN = 64, kNWarps = 4; };
template <> struct FwdConfig<192> { static constexpr int kBlockM = 128, kBlockN = 64, kNWarps = 8; };
template <> struct FwdConfig<256> { static constexpr int kBlockM = 128, kBlockN = 64, kNWarps = 8; };

// GPUs that give a block at most 99 KB of shared memory (sm_86, sm_89) run the
// head dims whose FwdConfig needs more on this config instead.
constexpr int kSmallSmemPerBlock = 99 * 1024;
template <int kHeadDim> struct FwdSmallSmemConfig : FwdConfig<kHeadDim> {};
template <> struct FwdSmallSmemConfig<256> { static constexpr int kBlockM = 128, kBlockN = 32, kNWarps = 8; };

// Backward tiles. Each warp owns 16 rows of the block's "own" tile (keys in
// the dK/dV kernel, queries in the dQ kernel) and the block streams tiles of
// kStreamRows of the other side past them. 8 warps (128-row own tiles) up to
// d128 halve the dQ atomics per FLOP against 4 (benchmarks/NOTES.md, b3);
// past d128 the own tiles are 64 rows and the stream tiles 32, keeping the
// four 16-bit tiles within the 99 KB of sm_86/sm_89 and the fragments small.
template <int kHeadDim_, typename Element_>
struct BwdKernelTraits {
    using Element = Element_;
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kNWarps = kHeadDim <= 128 ? 8 : 4;
    static constexpr int kNThreads = kNWarps * 32;
    static constexpr int kOwnRows = 16 * kNWarps;
    static constexpr int kStreamRows = kHeadDim <= 128 ? 64 : 32;
    static constexpr int kNTilesS = kStreamRows / 8;      // n8 tiles of a warp's score fragment
    static constexpr int kNTilesD = kHeadDim / 8;         // n8 tiles of a warp's gradient fragment
    static constexpr int kKStepsD = kHeadDim / 16;        // k16 steps of a GEMM over the head dim
    static constexpr int kKStepsStream = kStreamRows / 16;  // k16 steps of a GEMM over the stream rows
    // dK and dV together are 2 * kHeadDim / 2 fp32 registers per thread: past
    // d128 the dK/dV kernel runs twice, once per gradient.
    static constexpr bool kSplitDkDv = kHeadDim > 128;

    using OwnTile = SmemTile<kOwnRows, kHeadDim>;
    using StreamTile = SmemTile<kStreamRows, kHeadDim>;
    // dK/dV kernel: K, V own; Q, dO streamed with their rows' lse and D.
    // dQ kernel: Q, dO own; K, V streamed.
    static constexpr int kSmemOwnOffset0 = 0;
    static constexpr int kSmemOwnOffset1 = OwnTile::kBytes;
    static constexpr int kSmemStreamOffset0 = 2 * OwnTile::kBytes;
    static constexpr int kSmemStreamOffset1 = kSmemStreamOffset0 + StreamTile::kBytes;
    static constexpr int kSmemRowStatsOffset = kSmemStreamOffset1 + StreamTile::kBytes;
    static constexpr int kSmemBytes = kSmemRowStatsOffset + 2 * kStreamRows * 4;
    // The dK/dV pass that also adds up dQ keeps the step's dS^T [keys, queries]
    // after the rest. GPUs that cannot give a block that much take the
    // deterministic path, which needs none.
    using DsTile = SmemTile<kOwnRows, kStreamRows>;
    static constexpr int kSmemDsOffset = kSmemBytes;
    static constexpr int kSmemBytesWithDs = kSmemDsOffset + DsTile::kBytes;
    // dQ of a step is computed and added to memory this many head-dim columns at a time.
    static constexpr int kDqChunkCols = 32;

    static_assert(kHeadDim % kDqChunkCols == 0 && kStreamRows % 16 == 0, "whole mma steps");
    static_assert(kNWarps % (kStreamRows / 16) == 0, "whole warps per 16 queries of dQ");
    static_assert(kSmemBytes <= kSmallSmemPerBlock, "backward tiles must fit sm_86/sm_89");
    static_assert(kSmemBytesWithDs <= 163 * 1024, "shared memory over the sm_80 per-block limit");
};

template <int kHeadDim, typename Element, typename Config = FwdConfig<kHeadDim>>
using FwdTraitsFor = FwdKernelTraits<kHeadDim, Config::kBlockM, Config::kBlockN, Config::kNWarps, Element>;

}  // namespace flash
