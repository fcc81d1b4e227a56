// Tile shapes and shared-memory layouts of the sm80 family's forward and
// backward kernels, derived from a few constants per head dim and checked at
// compile time (the KV-cache kernels' are in kvcache/kvcache_traits.h).
#pragma once

#include <cstdint>

#include "common/flash.h"

namespace flash::sm80 {

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
    // `row_lane + R` and chunk `chunk_base + chunk_lane + C`, with R a multiple
    // of 8 and C even (both compile-time in unrolled loops), chunk_lane in
    // {0, 1} and chunk_base even (the warp's first column, at run time), finds
    // its chunk in block (c / kBlockChunks) at swizzled position
    // (c % kBlockChunks) ^ chunk_lane ^ swizzle(row_lane) for c = chunk_base +
    // C: R leaves the swizzle unchanged, c's low bit is free, and C - C %
    // kBlockChunks only moves whole blocks. So one byte offset per even
    // position C % kBlockChunks is precomputed and everything else is an
    // immediate (indexing by a run-time chunk would put the table in local
    // memory).
    struct LaneOffsets {
        uint32_t base[kBlockChunks / 2];
    };

    __device__ __forceinline__ static LaneOffsets lane_offsets(int row_lane, int chunk_lane, int chunk_base = 0) {
        LaneOffsets lo;
#pragma unroll
        for (int i = 0; i < kBlockChunks / 2; ++i) {
            const int c = chunk_base + 2 * i;
            lo.base[i] = static_cast<uint32_t>((c / kBlockChunks) * kBlockBytes + row_lane * kBlockRowBytes +
                                               ((c % kBlockChunks) ^ chunk_lane ^ swizzle(row_lane)) * 16);
        }
        return lo;
    }

    __device__ __forceinline__ static uint32_t offset(const LaneOffsets& lo, int R, int C) {
        return lo.base[(C % kBlockChunks) / 2] + (C / kBlockChunks) * kBlockBytes + R * kBlockRowBytes;
    }
};

// The widest fp32 accumulator a warp keeps for its 16 rows: 256 columns, 128
// registers a thread. An output wider than that (O and the dQ kernel's dQ at
// head dim 512) is computed in chunks of this many columns, a block each.
constexpr int kMaxAccumulatorCols = 256;
constexpr int accumulator_cols(int cols) { return cols > kMaxAccumulatorCols ? kMaxAccumulatorCols : cols; }

// kHeadDimV: the columns of O (of V) a block computes. kHeadDim's, or at head
// dim 512 half of them (accumulator_cols): each block computes 256 of V's
// columns and the launch runs a block per 256 (fwd_kernel.cuh: v_col0), each
// recomputing S = Q K^T over the full head dim (a third more MMA work than one
// pass).
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, typename Element_, int kHeadDimV_ = kHeadDim_>
struct FwdKernelTraits {
    using Element = Element_;  // __half or __nv_bfloat16
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kHeadDimV = kHeadDimV_;
    static constexpr bool kVChunked = kHeadDimV < kHeadDim;  // a block per kHeadDimV columns of V
    // The blocks of one query tile: one per chunk of V's head_dim_v columns.
    __host__ __device__ static constexpr int v_chunks(int head_dim_v) {
        return kVChunked ? (head_dim_v + kHeadDimV - 1) / kHeadDimV : 1;
    }
    static constexpr int kBlockM = kBlockM_;  // query rows per thread block
    static constexpr int kBlockN = kBlockN_;  // keys per main-loop step
    static constexpr int kNWarps = kNWarps_;
    static constexpr int kNThreads = kNWarps * 32;

    // Each warp owns kWarpRows consecutive query rows, so the softmax row
    // statistics never leave the warp.
    static constexpr int kWarpRows = kBlockM / kNWarps;
    static constexpr int kMTiles = kWarpRows / 16;    // m16 tiles per warp
    static constexpr int kNTilesS = kBlockN / 8;      // n8 tiles of S = Q K^T per warp
    static constexpr int kNTilesO = kHeadDimV / 8;    // n8 tiles of O per warp
    static constexpr int kKStepsQK = kHeadDim / 16;   // k16 steps of Q K^T
    static constexpr int kKStepsPV = kBlockN / 16;    // k16 steps of P V
    static constexpr int kRowsPerThread = 2 * kMTiles;  // an mma fragment holds rows g and g+8

    using QTile = SmemTile<kBlockM, kHeadDim>;  // also stages O for the final store
    using KTile = SmemTile<kBlockN, kHeadDim>;
    using VTile = SmemTile<kBlockN, kHeadDimV>;
    static constexpr int kSmemQOffset = 0;
    static constexpr int kSmemKOffset = kSmemQOffset + QTile::kBytes;
    static constexpr int kSmemVOffset = kSmemKOffset + KTile::kBytes;
    static constexpr int kSmemBytes = kSmemVOffset + VTile::kBytes;

    static_assert(kBlockM % (16 * kNWarps) == 0, "each warp needs whole m16 tiles");
    static_assert(kBlockN % 16 == 0 && kHeadDim % 16 == 0, "mma k16 steps");
    static_assert(kNTilesS % 2 == 0 && kNTilesO % 2 == 0, "ldmatrix.x4 loads two n8 tiles");
    static_assert(kHeadDimV <= kHeadDim, "O's columns per block: at most the head dim");
    static_assert(kSmemBytes <= 163 * 1024, "shared memory over the sm_80 per-block limit");
};

// Tile config per compiled head dim, {kBlockM, kBlockN, kNWarps}: the fastest
// measured on the H100 (benchmarks/NOTES.md). It may need up to 128 KB of shared
// memory per block, which A100 and H100 have. kHeadDimV: O's columns per block
// (FwdKernelTraits), 256 at head dim 512, where 64 query rows of 4 warps keep
// the registers of d256's 128 rows of 8 warps and 32-key tiles take 112 KB.
template <int kHeadDim> struct FwdConfig;
template <> struct FwdConfig<32> { static constexpr int kBlockM = 128, kBlockN = 64, kNWarps = 4; };
template <> struct FwdConfig<64> { static constexpr int kBlockM = 128, kBlockN = 64, kNWarps = 4; };
template <> struct FwdConfig<96> { static constexpr int kBlockM = 128, kBlockN = 64, kNWarps = 4; };
template <> struct FwdConfig<128> { static constexpr int kBlockM = 128, kBlockN = 64, kNWarps = 4; };
template <> struct FwdConfig<192> { static constexpr int kBlockM = 128, kBlockN = 64, kNWarps = 8; };
template <> struct FwdConfig<256> { static constexpr int kBlockM = 128, kBlockN = 64, kNWarps = 8; };
template <> struct FwdConfig<512> { static constexpr int kBlockM = 64, kBlockN = 32, kNWarps = 4; };

// GPUs that give a block at most 99 KB of shared memory (sm_86, sm_89) run the
// head dims whose FwdConfig needs more on this config instead.
constexpr int kSmallSmemPerBlock = 99 * 1024;
template <int kHeadDim> struct FwdSmallSmemConfig : FwdConfig<kHeadDim> {};
template <> struct FwdSmallSmemConfig<256> { static constexpr int kBlockM = 128, kBlockN = 32, kNWarps = 8; };
template <> struct FwdSmallSmemConfig<512> { static constexpr int kBlockM = 64, kBlockN = 16, kNWarps = 4; };

// Backward tile config per compiled head dim, {kNWarps, kOwnRows, kStreamRows,
// kStages}: a block owns kOwnRows rows of one side (keys in the dK/dV kernel,
// queries in the dQ kernel) and streams tiles of kStreamRows rows of the other
// side past them. 8 warps; 128-key tiles up to d128 and 64 past it, so that dK
// and dV fit one pass in registers (FA2's shapes); 128-query stream tiles up
// to d64, where the small fragments leave room to double the work per barrier
// (benchmarks/NOTES.md, b3-b5). kStages = 2 double-buffers the streamed tiles
// (one block fills an SM, so nothing else hides their loads) where that stays
// within the 163 KB of sm_80.
template <int kHeadDim> struct BwdConfig {
    static constexpr int kNWarps = 8;
    static constexpr int kOwnRows = kHeadDim <= 128 ? 128 : 64;
    static constexpr int kStreamRows = kHeadDim <= 64 ? 128 : 64;
    static constexpr int kStages = kHeadDim <= 128 ? 2 : 1;
};
// Head dim 512: 32 keys of 8 warps, each a 32 x 64 share of dK and of dV in
// one pass (128 registers of accumulators, as at d256) and 8 queries of the
// 64-query stream tiles (S^T one n8 tile a warp). 200.5 KB of shared memory:
// a GPU with 227 KB per block (sm_90) runs it; on the others (A100's 163 KB,
// sm_86's 99 KB) there is no config for it and the launch fails with an error
// that says how much shared memory the device allows (kMaxSmemPerBlock).
template <> struct BwdConfig<512> {
    static constexpr int kNWarps = 8;
    static constexpr int kOwnRows = 32;
    static constexpr int kStreamRows = 64;
    static constexpr int kStages = 1;
};
// The most shared memory a block may take: sm_90's 227 KB. A config that needs
// more than a GPU gives is not launched there (launch_with_smem).
constexpr int kMaxSmemPerBlock = 227 * 1024;
// Half-size tiles and one stage for the GPUs that give a block 99 KB of shared
// memory (sm_86, sm_89), for the head dims whose tiles need more (104-161 KB:
// all of them).
template <int kHeadDim> struct BwdSmallSmemConfig {
    static constexpr int kNWarps = kHeadDim <= 128 ? 4 : 2;
    static constexpr int kOwnRows = kHeadDim <= 128 ? 64 : 32;
    static constexpr int kStreamRows = kHeadDim <= 64 ? 128 : kHeadDim <= 128 ? 64 : 32;
    static constexpr int kStages = 1;
};
// The deterministic path's dQ kernel: the same own and stream tiles, a warp
// per 16 own (query) rows.
template <typename Config> struct BwdDqConfig {
    static constexpr int kNWarps = Config::kOwnRows / 16;
    static constexpr int kOwnRows = Config::kOwnRows;
    static constexpr int kStreamRows = Config::kStreamRows;
    static constexpr int kStages = 1;
};

// The narrower V head dim the backward is compiled for under a head dim, 0
// where there is none (dispatch.cu runs a call whose v, dout and dv are at most
// that wide on it): DeepSeek MLA's 128 under Q and K's 192, whose dV, dO and
// the dP = dO V^T and dV = P^T dO GEMMs are then 128 wide instead of 192. The
// tile config stays the head dim's (BwdConfig): Q and K decide the tile shape.
constexpr int narrow_head_dim_v(int head_dim) { return head_dim == 192 ? 128 : 0; }

// Backward tiles and warp layouts. In the dK/dV kernel each step recomputes
// the transposed scores S^T = K Q^T [own keys, streamed queries]: the warps
// form a grid of kKeyWarps x kQueryWarps, each holding 32 keys x
// kStreamRows / kQueryWarps queries, which writes P^T and dS^T to shared
// memory; then dV += P^T dO and dK += dS^T Q split the same warps into
// kKeyWarps x kQueryWarps tiles of 32 keys x kHeadDimV / kQueryWarps (dV) or
// kHeadDim / kQueryWarps (dK) columns, and dQ = dS K (fused path) is cut into
// units of kDqRows queries x kDqCols columns dealt round-robin to the warps.
// Each GEMM operand a warp reads from shared memory then serves two m16 tiles,
// which is what bounds this kernel (NOTES.md, b4). The dQ kernel gives each
// warp 16 own query rows (BwdDqConfig). kHeadDimV is V's head dim (dO's and
// dV's): kHeadDim's, or a narrower one (narrow_head_dim_v); Q, K, dQ and dK keep
// kHeadDim.
template <int kHeadDim_, typename Element_, typename Config_ = BwdConfig<kHeadDim_>, int kHeadDimV_ = kHeadDim_>
struct BwdKernelTraits {
    using Element = Element_;
    using Config = Config_;
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kHeadDimV = kHeadDimV_;
    static constexpr int kNWarps = Config::kNWarps;
    static constexpr int kNThreads = kNWarps * 32;
    static constexpr int kOwnRows = Config::kOwnRows;
    static constexpr int kStreamRows = Config::kStreamRows;
    static constexpr int kKStepsD = kHeadDim / 16;          // k16 steps of S = Q K^T (S^T = K Q^T)
    static constexpr int kKStepsDv = kHeadDimV / 16;        // k16 steps of dP = dO V^T (dP^T = V dO^T)
    static constexpr int kKStepsStream = kStreamRows / 16;  // k16 steps of a GEMM over the stream rows
    static constexpr int kKStepsOwn = kOwnRows / 16;        // k16 steps of a GEMM over the own rows
    // dK and dV accumulators take kOwnRows * (kHeadDim + kHeadDimV) / kNThreads
    // fp32 registers per thread: past 128 the dK/dV kernel runs twice, once
    // per gradient.
    static constexpr bool kSplitDkDv = kOwnRows * (kHeadDim + kHeadDimV) / kNThreads > 128;

    // dK/dV kernel warp grid.
    static constexpr int kKeyWarps = kOwnRows / 32;
    static constexpr int kQueryWarps = kNWarps / kKeyWarps;
    static constexpr int kWarpQueries = kStreamRows / kQueryWarps;  // of S^T, per warp
    static constexpr int kNTilesS = kWarpQueries / 8;               // n8 tiles of a warp's S^T
    static constexpr int kWarpCols = kHeadDim / kQueryWarps;        // of dK, per warp
    static constexpr int kNTilesDk = kWarpCols / 8;                 // n8 tiles of a warp's dK
    static constexpr int kWarpColsV = kHeadDimV / kQueryWarps;      // of dV, per warp
    static constexpr int kNTilesDv = kWarpColsV / 8;                // n8 tiles of a warp's dV
    // dQ units of the fused path: 32 x 32, or smaller where that leaves warps idle.
    static constexpr bool kDqWide = (kStreamRows / 32) * (kHeadDim / 32) >= kNWarps;
    static constexpr bool kDqTall = kDqWide || (kStreamRows / 32) * (kHeadDim / 16) >= kNWarps;
    static constexpr int kDqRows = kDqTall ? 32 : 16;
    static constexpr int kDqCols = kDqWide ? 32 : 16;
    static constexpr int kDqRowUnits = kStreamRows / kDqRows;
    static constexpr int kDqUnits = kDqRowUnits * (kHeadDim / kDqCols);
    // dQ kernel: 16 own rows per warp, the whole stream tile, and dQ's columns
    // in chunks of kHeadDimDq, a block each (accumulator_cols: 256 at head dim
    // 512; each block recomputes S and dP).
    static constexpr int kNTilesStream = kStreamRows / 8;  // n8 tiles of a dQ-kernel warp's S
    static constexpr int kHeadDimDq = accumulator_cols(kHeadDim);
    __host__ __device__ static constexpr int dq_chunks(int head_dim) { return (head_dim + kHeadDimDq - 1) / kHeadDimDq; }
    static constexpr int kNTilesD = kHeadDimDq / 8;        // n8 tiles of a dQ-kernel warp's dQ

    // Each side's tiles in pairs, the one kHeadDim wide first, then the one
    // kHeadDimV wide: K, V own and Q, dO streamed in the dK/dV kernel; Q, dO
    // own and K, V streamed in the dQ kernel.
    using OwnTile = SmemTile<kOwnRows, kHeadDim>;
    using OwnTileV = SmemTile<kOwnRows, kHeadDimV>;
    using StreamTile = SmemTile<kStreamRows, kHeadDim>;
    using StreamTileV = SmemTile<kStreamRows, kHeadDimV>;
    using ScoreTile = SmemTile<kOwnRows, kStreamRows>;  // P^T and dS^T [keys, queries]
    // dK/dV kernel: K, V own; kStages stages of Q, dO streamed; their rows' lse
    // and D; P^T, dS^T. dQ kernel: Q, dO own; one stage of K, V streamed.
    static constexpr int kStages = Config::kStages;
    static constexpr int kSmemOwnOffset0 = 0;
    static constexpr int kSmemOwnOffset1 = OwnTile::kBytes;
    static constexpr int kSmemStreamOffset0 = kSmemOwnOffset1 + OwnTileV::kBytes;
    static constexpr int kSmemStreamOffset1 = kSmemStreamOffset0 + StreamTile::kBytes;
    static constexpr int kSmemStageBytes = StreamTile::kBytes + StreamTileV::kBytes;
    static constexpr int kSmemBytesDq = kSmemStreamOffset0 + kSmemStageBytes;
    static constexpr int kSmemRowStatsOffset = kSmemStreamOffset0 + kStages * kSmemStageBytes;
    static constexpr int kSmemPOffset = kSmemRowStatsOffset + 2 * kStreamRows * 4;
    static constexpr int kSmemDsOffset = kSmemPOffset + ScoreTile::kBytes;
    static constexpr int kSmemBytesDkDv = kSmemDsOffset + ScoreTile::kBytes;
    static constexpr int kSmemBytes = kSmemBytesDkDv;  // the larger of the two

    static_assert(kOwnRows % 32 == 0 && kNWarps % kKeyWarps == 0, "32 keys per warp of the S^T grid");
    static_assert(kHeadDimV <= kHeadDim && kHeadDimV % 32 == 0,
                  "V's head dim: kHeadDim's or narrower, whole 32-column tiles (SmemTile)");
    static_assert(kHeadDim % (16 * kQueryWarps) == 0 && kHeadDimV % (16 * kQueryWarps) == 0,
                  "each warp's dK and dV columns are whole pairs of n8 tiles");
    static_assert(kNTilesDk % 2 == 0 && kNTilesDv % 2 == 0 && kNTilesStream % 2 == 0 && kDqCols % 16 == 0,
                  "ldmatrix.x4 loads two n8 tiles");
    static_assert(kWarpQueries % 8 == 0, "a warp's S^T columns are whole n8 tiles");
    static_assert(kStreamRows % kDqRows == 0 && kHeadDim % kDqCols == 0, "whole dQ units");
    static_assert(kStages == 1 || kStages == 2, "one or two stages of streamed tiles");
    static_assert(kHeadDimDq == kHeadDim || (kHeadDim % kHeadDimDq == 0 && kHeadDimDq % 64 == 0),
                  "a dQ chunk starts a 64-column block of K's tile (the dS K GEMM reads it from there)");
    static_assert(kSmemBytes <= kMaxSmemPerBlock, "shared memory over the sm_90 per-block limit");
};

template <int kHeadDim, typename Element, typename Config = FwdConfig<kHeadDim>>
using FwdTraitsFor =
    FwdKernelTraits<kHeadDim, Config::kBlockM, Config::kBlockN, Config::kNWarps, Element, accumulator_cols(kHeadDim)>;

}  // namespace flash::sm80
