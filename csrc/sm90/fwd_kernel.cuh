// The sm90 forward kernel: blocks that walk query tiles of kBlockM rows of a
// (head, batch) (WorkTile; the launcher picks persistent blocks or one block
// per tile), warp-specialised.
//
//   producer warpgroup: one thread copies each query tile's Q, then its K
//     and V tiles into kStages shared-memory stages with the bulk tensor copy
//     (TMA, 128-byte swizzle), each stage's arrival tracked by a "full"
//     mbarrier and its release by the consumers by an "empty" one (paged
//     keys: one warp, a box per page, KeyTileSource). The rest of the
//     warpgroup gives its registers back (setmaxnreg) and exits. Paged keys
//     whose pages are smaller than a tile are gathered instead
//     (KeyCopy::kGather*): all 128 threads copy K and V rows with cp.async into
//     the same swizzled layout (KeyTileGather); Q still comes by TMA.
//   consumer warpgroups: 64 query rows each; per key tile: wait K, S = Q K^T
//     (wgmma, both operands from shared memory), release K, mask, online
//     softmax, wait V, O += P V (wgmma, P from registers, V read transposed
//     through the descriptor), release V. Two overlaps hide the softmax
//     behind the tensor cores: within a warpgroup, S of tile i is issued with
//     O += P V of tile i - 1 and its softmax runs while that GEMM does; between
//     the warpgroups (two, or three at d64), named barriers let them issue their
//     GEMMs in turn (ping-pong). Epilogue: each warpgroup normalises
//     its rows and writes them to out, through its own part of a shared-memory
//     output tile and a bulk tensor store: a buffer of its own where the
//     config has room for one (kernel_traits.h: kOStaged), else the V stages
//     once every P V of the query tile is done (kOInValues); then their LSE.
//
// Key tiles are walked from the last to the first, as in the sm80 kernel, so
// that the tiles that need a mask at the top (sequence tail, causal diagonal, a
// window's right edge) come first, then every whole tile unmasked, then the
// window's left edge (mask.cuh: key_tile_range). The online softmax, the mask
// and the LSE are the sm80 family's (common/): a wgmma accumulator row block
// of a warp has the layout of an mma.m16n8 accumulator, so they apply as is.
#pragma once

#include <cuda.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/extras.cuh"
#include "common/flash.h"
#include "common/index_check.cuh"
#include "common/mask.cuh"
#include "common/ptx.cuh"
#include "common/sink.cuh"
#include "common/softmax.cuh"
#include "sm90/fp8_values.cuh"
#include "sm90/kernel_traits.h"
#include "sm90/pipeline.cuh"
#include "sm90/ptx.cuh"
#include "sm90/schedule.h"

namespace flash::sm90 {

// The shared-memory addresses of a block's tiles and barriers.
template <typename Traits>
struct SmemLayout {
    uint32_t base;  // aligned to a swizzle atom

    __device__ __forceinline__ explicit SmemLayout(const char* smem) {
        base = aligned_smem_base<Traits::kSmemAlign>(smem);
    }
    __device__ __forceinline__ uint32_t q() const { return base + Traits::kSmemQOffset; }
    __device__ __forceinline__ uint32_t k(int stage) const { return base + Traits::kSmemKOffset + stage * Traits::kKVBytes; }
    __device__ __forceinline__ uint32_t v(int stage) const { return base + Traits::kSmemVOffset + stage * Traits::kVBytes; }
    // Consumer warpgroup c's rows of the output tile's first column block (kOStaged; kOInValues:
    // in the V stages).
    __device__ __forceinline__ uint32_t o_group(int c) const {
        return base + (Traits::kOStaged ? Traits::kSmemOOffset : Traits::kSmemVOffset) + c * Traits::kOGroupBoxBytes;
    }
    __device__ __forceinline__ uint32_t barrier(int i) const { return base + Traits::kSmemBarrierOffset + 8 * i; }
    __device__ __forceinline__ uint32_t q_full() const { return barrier(0); }
    __device__ __forceinline__ uint32_t q_empty() const { return barrier(1); }
    __device__ __forceinline__ uint32_t k_full(int stage) const { return barrier(2 + stage); }
    __device__ __forceinline__ uint32_t v_full(int stage) const { return barrier(2 + Traits::kStages + stage); }
    __device__ __forceinline__ uint32_t k_empty(int stage) const { return barrier(2 + 2 * Traits::kStages + stage); }
    __device__ __forceinline__ uint32_t v_empty(int stage) const { return barrier(2 + 3 * Traits::kStages + stage); }
    __device__ __forceinline__ uint32_t work_full(int slot) const { return barrier(2 + 4 * Traits::kStages + slot); }
    __device__ __forceinline__ uint32_t work_empty(int slot) const {
        return barrier(2 + 4 * Traits::kStages + Traits::kWorkSlots + slot);
    }
    __device__ __forceinline__ uint32_t o_free() const { return barrier(2 + 4 * Traits::kStages + 2 * Traits::kWorkSlots); }
    // FP8's v as copied, before its transpose (Traits::kValuesInKernel), and its barriers.
    __device__ __forceinline__ uint32_t raw_value(int stage) const {
        return base + Traits::kSmemRawValueOffset + stage * Traits::kRawValueBytes;
    }
    __device__ __forceinline__ uint32_t raw_value_full(int stage) const {
        return barrier(3 + 4 * Traits::kStages + 2 * Traits::kWorkSlots + stage);
    }
    __device__ __forceinline__ uint32_t raw_value_empty(int stage) const {
        return barrier(3 + 4 * Traits::kStages + 2 * Traits::kWorkSlots + Traits::kRawValueStages + stage);
    }
    __device__ __forceinline__ uint32_t work(int slot) const { return base + Traits::kSmemWorkOffset + 4 * slot; }
    __device__ __forceinline__ uint32_t gather_rows() const { return base + Traits::kSmemGatherOffset; }
};

// Where the producer warp copies a key (and value) tile from: rows of k and v
// in the layout of their tensor maps. Contiguous keys: lane 0 copies the whole
// tile, one box per column block (rows past the tensor arrive as zeros). Paged
// keys (block_table): the tile is cut into boxes of kv_box_rows rows, each in
// one page; lane j looks up box j's page (recorded and clamped when out of
// range, index_check.cuh) and copies it. Boxes wholly past the sequence are not
// copied: the consumers mask their keys and zero their value rows. A tile
// is copied in column blocks: K's kColBlocks, V's those of kColBlocksV that
// hold a column of v (value_col_blocks; the rest, wholly past its head dim, are
// not copied: they only reach O's columns past it, which are never written).
template <typename Traits>
struct KeyTileSource {
    struct Box {
        int count;       // boxes this lane copies: 0 or 1 (paged), all of the tile's at lane 0 (contiguous)
        int block_bytes;  // the bytes of one column block of the tile in all (expected on the barrier)
        int row, page, shared_offset;
    };

    const FwdParams& params;
    const Sequence& seq;
    const int* table;  // this sequence's block-table row (paged)
    int batch, head_k, lane, box_rows, page_size;
    bool paged;

    __device__ __forceinline__ KeyTileSource(const FwdParams& params_, const Sequence& seq_, int batch_, int head_k_,
                                             int lane_)
        : params(params_), seq(seq_), batch(batch_), head_k(head_k_), lane(lane_) {
        paged = params.block_table != nullptr;
        table = paged ? params.block_table + batch * params.block_table_batch_stride : nullptr;
        page_size = params.page_size;
        box_rows = paged ? kv_box_rows(page_size, Traits::kBlockN) : Traits::kBlockN;
    }

    // The column blocks of V that hold a column of v.
    __device__ __forceinline__ int value_col_blocks() const {
        return min(Traits::kColBlocksV, (params.head_dim_v + kSwizzleCols - 1) / kSwizzleCols);
    }

    // The box this lane copies of the tile of keys [n0, n0 + kBlockN).
    __device__ __forceinline__ Box box_of(int n0) const {
        if (!paged) {
            const int row = seq.k_start + n0;
            return {lane == 0 ? 1 : 0, Traits::kKVBlockBytes, row, params.cu_seqlens_k == nullptr ? batch : 0, 0};
        }
        const int boxes = min(Traits::kBlockN / box_rows, (seq.seqlen_k - n0 + box_rows - 1) / box_rows);
        const int bytes = boxes * box_rows * kSwizzleBytes;
        if (lane >= boxes) return {0, bytes, 0, 0, 0};
        const int key = n0 + lane * box_rows;  // paged keys count from 0 (sequence_of)
        const int entry = key / page_size;
        const int page = checked_page(params, table, batch, entry);
        return {1, bytes, key - entry * page_size, page, lane * box_rows * kSwizzleBytes};
    }

    // Copies the box's first col_blocks column blocks into a stage (dst)
    // whose arrival `full` tracks.
    __device__ __forceinline__ void load(uint32_t dst, const CUtensorMap* map, uint32_t full, const Box& box,
                                         int col_blocks) const {
        if (lane == 0) mbarrier_arrive_expect_tx(full, box.block_bytes * col_blocks);
        if (paged) __syncwarp();  // the expected bytes are set before any box lands
        if (box.count == 0) return;
#pragma unroll
        for (int cb = 0; cb < Traits::kColBlocks; ++cb) {
            if (cb == col_blocks) break;
            tma_load_4d(dst + cb * Traits::kKVBlockBytes + box.shared_offset, map, full, cb * Traits::kElementCols,
                        box.row, head_k, box.page);
        }
    }
};

// FP8 (Traits::kFp8): copies the V^T tile of the keys from n0 of sequence
// `batch` into a stage (dst), from the family's transposed copy of v
// (fp8_values.cuh; its map: columns, head-dim rows, KV heads; the swizzle of
// kValueSwizzleBytes): one box of that many columns by all of the tile's
// head-dim rows per column block of keys.
template <typename Traits>
__device__ __forceinline__ void load_values_transposed(const FwdParams& params, uint32_t dst, const CUtensorMap* map,
                                                       uint32_t full, int batch, int head_k, int n0) {
    mbarrier_arrive_expect_tx(full, Traits::kVBytes);
    const int column = value_key_start(params, batch) + n0;
#pragma unroll
    for (int cb = 0; cb < Traits::kColBlocksV; ++cb) {
        tma_load_4d(dst + cb * Traits::kVBlockBytes, map, full, column + cb * Traits::kValueSwizzleBytes, 0, head_k, 0);
    }
}

// FP8 with the values transposed in the kernel (Traits::kValuesInKernel): the
// producer warps that write a V^T stage from a tile of v as copied (keys as
// rows, in K's layout: raw), and the tile's keys from keys_left on as zeros (the
// next sequence's values, or whatever follows the tensor, may hold NaN bit
// patterns, and 0 * NaN would reach O). The V^T stage is what the transposing
// kernel's copy delivers (fp8_values.cuh): head-dim rows, the keys of each
// block of 32 in value_key's order, column blocks of kValueSwizzleBytes keys in
// that swizzle.
constexpr int kValueTransposeWarps = 3;  // producer warps 1-3
constexpr int kValueTransposeThreads = 32 * kValueTransposeWarps;

// A warp (0 .. kValueTransposeWarps - 1 of them) moves its share of the tile's
// units of 16 keys x 32 head-dim bytes: key groups g = kGroupsPerWarp w .. (so
// that the addresses of a unit are a lane's base plus what the unrolled loop
// knows at compile time). ldmatrix.trans reads a unit as four 8 x 8 matrices of
// byte pairs (keys 0-7 and 8-15 of head-dim bytes 0-15, then of bytes 16-31):
// lane (r, c) = (lane / 4, lane % 4) receives keys 2c and 2c + 1 of bytes 2r and
// 2r + 1 from each. Two byte permutes per pair of matrices give it the words of
// V^T rows 2r and 2r + 1 at k indices 4c .. 4c + 3, which hold keys 2c, 2c + 1,
// 8 + 2c, 9 + 2c: value_key's order, so no lane exchanges a byte. stmatrix
// writes them as four matrices of 8 V^T rows; the lanes of the upper 8 rows
// take their odd row's word first (the permutes' selectors are the lane's), so
// that a matrix's rows are 2i (i < 4) and 2i + 1 (i >= 4): eight rows of
// distinct swizzle phases, no bank conflict in either swizzle. kMasked: the
// tile reaches past the sequence, whose keys from keys_left on are written as
// zeros.
template <typename Traits, bool kMasked>
__device__ __forceinline__ void transpose_value_units(uint32_t raw, uint32_t vt, int keys_left, int warp) {
    constexpr int kKeyGroups = Traits::kBlockN / 16;
    constexpr int kGroupsPerWarp = (kKeyGroups + kValueTransposeWarps - 1) / kValueTransposeWarps;
    constexpr int kByteGroups = Traits::kTileColsV / 32;
    constexpr int kSwizzle = Traits::kValueSwizzleBytes;
    constexpr int kPhases = kSwizzle / 16;  // 16-byte chunks of a swizzled row
    constexpr int kUnitsInFlight = 4;       // loads issued together (their registers: 4 each)
    static_assert(Traits::kTileCols == Traits::kTileColsV && Traits::kBlockN % 32 == 0, "whole units");
    static_assert(kByteGroups % kUnitsInFlight == 0 && kSwizzle % 64 == 0, "whole rounds; 64 or 128 keys a block");
    // Derived from the lane here, each tile (opaque), not held across the producer's waits.
    const int lane = opaque(static_cast<int>(threadIdx.x % 32));
    const int m = lane / 8, i = lane % 8;  // the row lane gives the address of: matrix m, row i
    const int c = lane % 4;                // and its keys in the matrices it receives: 2c, 2c + 1
    const uint32_t first = lane >= 16 ? 0x7531u : 0x6420u, second = first ^ 0x1111u;  // its rows' selectors
    const int g0 = warp * kGroupsPerWarp;
    // Of the raw tile: key 16 g0 + 8 (m % 2) + i, chunk (2h + m / 2) ^ (key % 8) = 2h ^ t.
    const uint32_t src = raw + (16 * g0 + 8 * (m % 2) + i) * kSwizzleBytes;
    const int t = (m / 2) ^ i;
    // Of V^T: row 32h + 16 (m / 2) + 2i + ((m % 2) ^ (i / 4)), whose swizzle phase (64-byte rows:
    // (row / 2) % 4; 128-byte rows: row % 8) is the same for every h.
    const int row = 16 * (m / 2) + 2 * i + ((m % 2) ^ (i / 4));
    const uint32_t dst = vt + row * kSwizzle;
    const int phase = kSwizzle == 64 ? (row / 2) % kPhases : row % kPhases;
#pragma unroll
    for (int j = 0; j < kGroupsPerWarp; ++j) {
        const int g = g0 + j;  // keys 16g ..
        if (kKeyGroups % kValueTransposeWarps != 0 && g >= kKeyGroups) break;
        const int col = 16 * g;  // V^T's first k index of the unit
        uint32_t keep = 0xffffffffu;
        if constexpr (kMasked) {
            const int left = keys_left - col;
            keep = (2 * c < left ? 0xffu : 0u) | (2 * c + 1 < left ? 0xff00u : 0u) |
                   (8 + 2 * c < left ? 0xff0000u : 0u) | (9 + 2 * c < left ? 0xff000000u : 0u);
        }
        const uint32_t dst_g = dst + (col / kSwizzle) * Traits::kVBlockBytes + ((((col % kSwizzle) / 16) ^ phase) << 4);
#pragma unroll
        for (int h0 = 0; h0 < kByteGroups; h0 += kUnitsInFlight) {  // head-dim bytes 32h .. of units h0 ..
            // The loads first, then the stores: asm statements keep their order, so the loads'
            // latencies overlap only where they are issued together.
            uint32_t x[kUnitsInFlight][4];
#pragma unroll
            for (int e = 0; e < kUnitsInFlight; ++e) {
                const int h = h0 + e;
                ldmatrix_x4_trans(src + j * 16 * kSwizzleBytes + (h / 4) * Traits::kKVBlockBytes +
                                      (((2 * h) % 8 ^ t) << 4),
                                  x[e][0], x[e][1], x[e][2], x[e][3]);
            }
#pragma unroll
            for (int e = 0; e < kUnitsInFlight; ++e) {
                const int h = h0 + e;
                uint32_t w[4] = {__byte_perm(x[e][0], x[e][1], first), __byte_perm(x[e][0], x[e][1], second),
                                 __byte_perm(x[e][2], x[e][3], first), __byte_perm(x[e][2], x[e][3], second)};
                if constexpr (kMasked) {
#pragma unroll
                    for (int r = 0; r < 4; ++r) w[r] &= keep;
                }
                stmatrix_x4(dst_g + 32 * h * kSwizzle, w[0], w[1], w[2], w[3]);
            }
        }
    }
}

// The tile of keys_left keys of the sequence (all of it, or the last one walked, masked).
template <typename Traits>
__device__ __forceinline__ void transpose_value_tile(uint32_t raw, uint32_t vt, int keys_left, int warp) {
    if (keys_left >= Traits::kBlockN) {
        transpose_value_units<Traits, false>(raw, vt, keys_left, warp);
    } else {
        transpose_value_units<Traits, true>(raw, vt, keys_left, warp);
    }
}

// Writes a consumer warpgroup's normalised O (its fp32 accumulator, 64 rows x
// kTileColsV) as Element into its rows of the output tile (`group`: those of the
// first column block), in the 128-byte swizzle the bulk store reads: one
// stmatrix.x4 per pair of n8 blocks, its four 8 x 8 matrices rows 0-7 and 8-15
// of the warp's 16 under each block. Lane i addresses row (i / 8 % 2) * 8 + i % 8
// of n8 block 2p + i / 16; a row is 128 bytes, its 16-byte chunks permuted by
// XOR with the row's index within its 8-row atom (i % 8), so the eight rows of a
// matrix land in eight distinct chunks: no bank conflict.
template <typename Traits>
__device__ __forceinline__ void stage_o(const float (&o)[1][Traits::kNTilesO][4], uint32_t group, int warp, int lane) {
    using Element = typename Traits::Out;
    const int row = warp * 16 + (lane / 8 % 2) * 8 + lane % 8;  // of the warpgroup's 64
    const uint32_t row_addr = group + row * kSwizzleBytes;
    // Chunk of n8 block j = 2p + lane / 16 in its column block: j % 8 = 2 (p % 4) + lane / 16,
    // which XOR (lane % 8) is 2 (p % 4) XOR this (2 (p % 4) is even).
    const int chunk_xor = (lane / 16) ^ (lane % 8);
#pragma unroll
    for (int p = 0; p < Traits::kNTilesO / 2; ++p) {
        const uint32_t addr = row_addr + (p / 4) * Traits::kOBlockBytes + (((2 * (p % 4)) ^ chunk_xor) << 4);
        stmatrix_x4(addr, pack2<Element>(o[0][2 * p][0], o[0][2 * p][1]),
                    pack2<Element>(o[0][2 * p][2], o[0][2 * p][3]),
                    pack2<Element>(o[0][2 * p + 1][0], o[0][2 * p + 1][1]),
                    pack2<Element>(o[0][2 * p + 1][2], o[0][2 * p + 1][3]));
    }
}

// Where the producer warpgroup gathers a paged key (and value) tile from
// (KeyCopy::kGather*): its 128 threads copy the tile's rows in 16-byte chunks
// with cp.async into the layout the bulk tensor copy writes (the 128-byte
// swizzle: chunk c of row r of a column block lands at chunk c ^ (r % 8) of
// that row), so that the consumers' descriptors read it as they read a TMA
// tile. kLanes lanes copy a row (4, or 8: KeyCopy), lane l of them its
// chunks l, l + kLanes, ... of each column block, so that one copy of the
// row's lanes is kLanes x 16 contiguous bytes; a pass of the warpgroup covers
// 128 / kLanes rows, and the tile's kBlockN rows take kPasses passes (the last
// one partly when kBlockN is no multiple of that). A row's page is looked up
// once per tile, by one of the lanes that copy it, a tile ahead (look_up: the
// block-table read is in flight while the producer waits for its copies of the
// previous tile to land; resolve: the entry checked as checked_page does), and
// the row's K and V addresses go to shared memory (gather_rows), where its
// lanes read them, one shared load a row a pass: no register holds them across
// the producer's waits (it has kProducerRegs). Fewer lanes a row mean fewer
// passes, so fewer of those loads (each of which ptxas follows with padding
// before the first copy that uses it) for the same copies, but less of each
// 128-byte line a copy instruction: 4 lanes were faster than 8 at pages of 16
// on every row of the benchmark, 2 slower at d128 (NOTES.md). Lane l
// of a row looks up its passes l, l + kLanes, ..., so that the writer and the
// readers of an address are one warp: __syncwarp orders them. Rows past the
// sequence (only in the first tile walked) and columns past the head dim are
// zero-filled, never read: no page past the sequence's is looked up.
template <typename Traits, int kLanes>
struct KeyTileGather {
    static constexpr int kThreads = 128;
    static constexpr int kChunkBytes = 16;                             // one cp.async
    static constexpr int kChunkCols = kChunkBytes / 2;                 // 16-bit elements a chunk
    static constexpr int kElementBytes = kChunkBytes / kChunkCols;
    static constexpr int kChunksPerRow = kSwizzleBytes / kChunkBytes;  // of a column block's row
    static constexpr int kChunksPerLane = kChunksPerRow / kLanes;      // of a column block's row, a pass
    static constexpr int kAtomRows = kSwizzleAtomBytes / kSwizzleBytes;
    static constexpr int kRowsPerWarp = 32 / kLanes;                   // in one pass
    static constexpr int kRowsPerPass = kThreads / kLanes;
    static constexpr int kPasses = (Traits::kBlockN + kRowsPerPass - 1) / kRowsPerPass;
    static constexpr bool kPartialPass = Traits::kBlockN % kRowsPerPass != 0;
    static constexpr int kLookups = (kPasses + kLanes - 1) / kLanes;
    static_assert(kLanes == 8 || kLanes == 4, "lanes a row");
    static_assert(kRowsPerPass % kAtomRows == 0, "a thread's rows share their swizzle phase");
    static_assert(Traits::kGatherRowBytes == 2 * sizeof(uint64_t), "a row's K and V addresses");

    const FwdParams& params;
    uint32_t rows;  // gather_rows: [kBlockN] {K address, V address} of the tile's rows
    int batch, head_k, seqlen_k;
    int page[kLookups], entry[kLookups];  // look_up: the entries this lane read, and which

    __device__ __forceinline__ KeyTileGather(const FwdParams& params_, uint32_t rows_, int seqlen_k_, int batch_,
                                             int head_k_)
        : params(params_), rows(rows_), batch(batch_), head_k(head_k_), seqlen_k(seqlen_k_) {}

    // This thread's row of pass 0 (pass p: row + p * kRowsPerPass) and lane
    // among the row's. What is derived from the thread index is computed where
    // it is used (opaque) rather than held in a register across the loops.
    __device__ __forceinline__ static int thread() { return opaque(static_cast<int>(threadIdx.x)); }
    __device__ __forceinline__ static int row(int t) { return t / 32 * kRowsPerWarp + t % 32 / kLanes; }
    __device__ __forceinline__ static int lane_of_row(int t) { return t % kLanes; }

    // The pass of lookup i of thread t, the row of the tile it is for, and
    // whether the tile has that row and it is inside the sequence (n0: the
    // tile's first key).
    __device__ __forceinline__ static int lookup_pass(int t, int i) { return lane_of_row(t) + i * kLanes; }
    __device__ __forceinline__ static int lookup_row(int t, int i) { return row(t) + lookup_pass(t, i) * kRowsPerPass; }
    __device__ __forceinline__ bool looks_up(int t, int n0, int i) const {
        return lookup_pass(t, i) < kPasses && (!kPartialPass || lookup_row(t, i) < Traits::kBlockN) &&
               n0 + lookup_row(t, i) < seqlen_k;
    }

    // Reads the block-table entries of this lane's rows of the tile of keys
    // from n0 (keys are not negative: unsigned division).
    __device__ __forceinline__ void look_up(int n0) {
        const int* table = params.block_table + batch * params.block_table_batch_stride;
        const int t = thread();
#pragma unroll
        for (int i = 0; i < kLookups; ++i) {
            entry[i] = static_cast<unsigned>(n0 + lookup_row(t, i)) / static_cast<unsigned>(params.page_size);
            page[i] = looks_up(t, n0, i) ? table[entry[i]] : 0;
        }
    }

    // Checks the entries looked up for the tile of keys from n0, as
    // checked_page does, and stages the rows' K and V addresses; rows past the
    // sequence get page 0's first row, which is never read.
    __device__ __forceinline__ void resolve(int n0) {
        const int t = thread();
        __syncwarp();  // the row's lanes are done reading the previous tile's addresses
        // One lookup at a time (not unrolled), so that one lookup's temporaries are live at a time.
#pragma unroll 1
        for (int i = 0; i < kLookups; ++i) {
            if (lookup_pass(t, i) >= kPasses || (kPartialPass && lookup_row(t, i) >= Traits::kBlockN)) continue;
            int page_i = page[0], entry_i = entry[0];
#pragma unroll
            for (int l = 1; l < kLookups; ++l) {
                if (i == l) page_i = page[l], entry_i = entry[l];
            }
            const bool used = looks_up(t, n0, i);
            const int page_index = used ? checked_page_value(params, page_i, batch, entry_i) : 0;
            const int row_in_page = used ? n0 + lookup_row(t, i) - entry_i * params.page_size : 0;
            const int head = opaque(head_k);
            const int64_t k_offset = head * params.k_head_stride + page_index * params.k_batch_stride +
                                     row_in_page * params.k_row_stride;
            const int64_t v_offset = head * params.v_head_stride + page_index * params.v_batch_stride +
                                     row_in_page * params.v_row_stride;
            const char* k_row = static_cast<const char*>(params.k_ptr) + k_offset * kElementBytes;
            const char* v_row = static_cast<const char*>(params.v_ptr) + v_offset * kElementBytes;
            store_shared_u64x2(rows + lookup_row(t, i) * Traits::kGatherRowBytes, reinterpret_cast<uint64_t>(k_row),
                               reinterpret_cast<uint64_t>(v_row));
        }
        __syncwarp();  // the addresses are there for the row's lanes
    }

    // Issues the copies of the tile of keys from n0 (resolved) into a stage
    // (`stage`, K's or V's: kValues) and this thread's arrival on the stage's
    // `full` barrier once they (and its earlier copies) are complete: the
    // producer never waits for its own copies.
    template <bool kValues>
    __device__ __forceinline__ void copy(uint32_t stage, uint32_t full, int n0) const {
        const int t = thread();
        const int lane = lane_of_row(t);
        const uint32_t dst_row = stage + row(t) * kSwizzleBytes;
        const int swizzle = row(t) % kAtomRows;
        const int rows_left = seqlen_k - n0 - row(t);  // in the sequence from this thread's row of pass 0
        // Columns in the head from this lane's first chunk (zero-filled past it).
        const int cols_left = (kValues ? params.head_dim_v : params.head_dim) - lane * kChunkCols;
        const uint32_t src_of_row = rows + row(t) * Traits::kGatherRowBytes + (kValues ? sizeof(uint64_t) : 0);
#pragma unroll
        for (int p = 0; p < kPasses; ++p) {
            if (kPartialPass && p == kPasses - 1 && row(t) + p * kRowsPerPass >= Traits::kBlockN) break;
            const char* src = reinterpret_cast<const char*>(
                                  load_shared_u64(src_of_row + p * kRowsPerPass * Traits::kGatherRowBytes)) +
                              lane * kChunkBytes;
            const bool in_sequence = p * kRowsPerPass < rows_left;
#pragma unroll
            for (int j = 0; j < kChunksPerLane; ++j) {
                // Chunk c = j kLanes + lane of the row, at chunk c ^ swizzle of the stage's row.
                const uint32_t dst = dst_row + p * kRowsPerPass * kSwizzleBytes +
                                     (((j * kLanes + lane) ^ swizzle) * kChunkBytes);
#pragma unroll
                for (int cb = 0; cb < (kValues ? Traits::kColBlocksV : Traits::kColBlocks); ++cb) {
                    cp_async_16(dst + cb * Traits::kKVBlockBytes, src + cb * kSwizzleBytes + j * kLanes * kChunkBytes,
                                /*fill_zeros=*/!in_sequence ||
                                    cb * kSwizzleCols + j * kLanes * kChunkCols >= cols_left);
                }
            }
        }
        cp_async_arrive_noinc(full);
    }
};

// A call's tile counter for dynamic scheduling (FwdParams::fwd_counters, zero
// on entry): `next` hands out the query tiles past the first gridDim.x (which
// the blocks take by their index); each block, once it draws past the last
// tile, counts itself in `done`, and the last one zeroes both again.
struct WorkCounter {
    unsigned int next, done;
};
static_assert(sizeof(WorkCounter) == kWorkCounterInts * sizeof(unsigned int), "fwd_counters' length");

// The query tiles of a block, in turn: the producer draws them (statically,
// blockIdx.x + k gridDim.x, without a counter; else from the counter) and hands
// each to the consumers through a shared-memory slot with full/empty barriers.
// Draw k of every thread of the block is the same tile; a tile index past the
// list ends the block's work.
template <typename Traits>
struct WorkQueue {
    const SmemLayout<Traits>& layout;
    WorkCounter* counter;  // nullptr: static
    int num_work;

    // The producer's draw k (lane 0 draws; every lane of the warp gets it).
    // The grid's size is read where it is used (opaque), not held in a
    // register across the producer's loops (gathering, 128 threads keep their
    // state in kProducerRegs).
    __device__ __forceinline__ int draw(int k, int lane) const {
        int t = 0;
        if (lane == 0) {
            const int blocks = opaque(static_cast<int>(gridDim.x));
            if (k == 0) {
                t = blockIdx.x;
            } else if (counter == nullptr) {
                t = blockIdx.x + k * blocks;
            } else {
                t = blocks + atomicAdd(&counter->next, 1u);
                if (t >= num_work) {
                    __threadfence();  // this block's draws come before its count in done
                    if (atomicAdd(&counter->done, 1u) == blocks - 1) {
                        atomicExch(&counter->next, 0u);
                        atomicExch(&counter->done, 0u);
                    }
                }
            }
            const int slot = k % Traits::kWorkSlots;
            if (k >= Traits::kWorkSlots) mbarrier_wait(layout.work_empty(slot), ((k / Traits::kWorkSlots) & 1) ^ 1);
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(layout.work(slot)), "r"(t) : "memory");
            mbarrier_arrive(layout.work_full(slot));  // release: the store is seen by the waiters
        }
        return __shfl_sync(0xffffffffu, t, 0);
    }

    // The consumers' draw k (and, gathering paged keys, producer warps 1-3's):
    // wait for the producer's, read it, free the slot (every thread arrives for
    // its own read: racecheck follows that, not one arrival per warp after
    // __syncwarp; NOTES.md).
    __device__ __forceinline__ int take(int k) const {
        const int slot = k % Traits::kWorkSlots;
        mbarrier_wait(layout.work_full(slot), (k / Traits::kWorkSlots) & 1);
        int t;
        asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(t) : "r"(layout.work(slot)) : "memory");
        mbarrier_arrive(layout.work_empty(slot));
        return t;
    }
};

// The work of a block: query tile t of the list in schedule.h's order, heads
// taken in sections of `section` (batch, head) pairs (the launcher's: one
// without a mask that cuts keys, where every query tile takes as long as the
// others); with a causal mask or a window (Is_local) a head's bottom query
// tiles, which see the most keys, come first.
template <typename Traits, bool Is_local>
struct WorkTile {
    int m_block, head, batch;
    Sequence seq;
    Window window;
    KeyTileRange key_tiles;
    int num_tiles;  // key tiles to walk; 0 also when the query tile is past the sequence
    bool has_rows;  // the query tile starts inside its sequence (it writes out and lse)

    __device__ __forceinline__ WorkTile(const FwdParams& params, int t, int num_m_blocks, int section) {
        const TileOfHead th = tile_in_order(t, num_m_blocks, params.num_heads * params.batch, section);
        m_block = Is_local ? num_m_blocks - 1 - th.tile : th.tile;
        head = th.head % params.num_heads;
        batch = th.head / params.num_heads;
        seq = sequence_of<true>(params, batch);  // paged keys too (no cache here)
        const int m0 = m_block * Traits::kBlockM;
        has_rows = m0 < seq.seqlen_q;
        window = window_of(params, seq.seqlen_q, seq.seqlen_k);
        key_tiles = key_tile_range<Traits::kBlockM, Traits::kBlockN>(m0, seq.seqlen_q, window);
        num_tiles = has_rows ? key_tiles.n_end - key_tiles.n_begin : 0;
    }
};

// Producer thread 0: the Q tile of a work tile (the q_count-th with a key
// tile), once the consumers are done with the previous one's.
template <typename Traits, bool Is_local>
__device__ __forceinline__ void load_query_tile(const FwdParams& params, const SmemLayout<Traits>& layout,
                                                const CUtensorMap* tma_q, const WorkTile<Traits, Is_local>& work,
                                                int q_count) {
    if (q_count > 0) mbarrier_wait(layout.q_empty(), (q_count - 1) & 1);
    mbarrier_arrive_expect_tx(layout.q_full(), Traits::kQBytes);
    load_tile<Traits>(layout.q(), tma_q, layout.q_full(), work.seq.q_start + work.m_block * Traits::kBlockM,
                      work.head, params.cu_seqlens_q == nullptr ? work.batch : 0, Traits::kQBlockBytes);
}

// The producer warpgroup when it gathers paged keys (KeyCopy::kGather*, kLanes a row): warp
// 0 draws the work tiles (thread 0 also copies Q by TMA), warps 1-3 take each
// draw from the work slot as the consumers do, and all 128 threads copy K and
// V (KeyTileGather). A stage is full once the copies of every thread have
// landed (128 arrivals, each made by the hardware: cp_async_arrive_noinc), so
// the producer waits only for free stages, as the TMA producer does (an
// earlier version waited for its own copies of tile i - 1 before the stage
// waits of tile i, and signalled them: 3-8% slower, NOTES.md). The consumers
// fence the async proxy after their wait (issue_qk, issue_pv).
template <typename Traits, bool Is_local, int kLanes>
__device__ __forceinline__ void gather_tiles(const FwdParams& params, const SmemLayout<Traits>& layout,
                                             const WorkQueue<Traits>& queue, const CUtensorMap* tma_q,
                                             int num_m_blocks, int num_work, int section) {
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kStages = Traits::kStages;
    using Gather = KeyTileGather<Traits, kLanes>;
    const int lane = threadIdx.x % 32;
    // Warp-uniform to the compiler (through the shuffles), so that what is
    // derived from them can live in uniform registers: the producer has few
    // others (kProducerRegs).
    const bool draws = __shfl_sync(0xffffffffu, threadIdx.x / 32, 0) == 0;
    auto next_work = [&](int k) {
        return draws ? queue.draw(k, lane) : __shfl_sync(0xffffffffu, queue.take(k), 0);
    };
    int q_count = 0, tile_count = 0;
    for (int k = 0, t = next_work(0); t < num_work; t = next_work(++k)) {
        const WorkTile<Traits, Is_local> work(params, t, num_m_blocks, section);
        if (work.num_tiles == 0) continue;  // no key tile: no copy, Q included
        if (threadIdx.x == 0) load_query_tile(params, layout, tma_q, work, q_count);
        ++q_count;
        Gather gather(params, layout.gather_rows(), work.seq.seqlen_k, work.batch,
                      work.head / params.heads_per_kv_head);
        // Key tiles are walked from the last (n_end - 1) to the first (n_begin).
        const int n_begin = work.key_tiles.n_begin, n_last = work.key_tiles.n_end - 1;
        gather.look_up(n_last * kBlockN);
        for (int n_block = n_last; n_block >= n_begin; --n_block, ++tile_count) {
            const StageOf<Traits> s(tile_count);
            const int n0 = n_block * kBlockN;
            gather.resolve(n0);
            // A stage's first use needs no release; its u-th waits for release u - 1.
            if (tile_count >= kStages) mbarrier_wait(layout.k_empty(s.stage), s.phase ^ 1);
            gather.template copy</*kValues=*/false>(layout.k(s.stage), layout.k_full(s.stage), n0);
            if (tile_count >= kStages) mbarrier_wait(layout.v_empty(s.stage), s.phase ^ 1);
            if (Traits::kOInValues && n_block == n_last && q_count > 1) {
                mbarrier_wait(layout.o_free(), (q_count - 2) & 1);  // as the TMA producer's
            }
            gather.template copy</*kValues=*/true>(layout.v(s.stage), layout.v_full(s.stage), n0);
            // The next tile's entries, read while the producer waits for the next stage.
            if (n_block > n_begin) gather.look_up(n0 - kBlockN);
        }
    }
    cp_async_wait_all();  // no copy outlives its thread
}

// Producer warps 1-3 with FP8's values transposed in the kernel
// (Traits::kValuesInKernel): they take each work tile as the consumers do and
// walk its key tiles as the copying thread does; for each, once its V^T stage
// is free (and, kOInValues, the previous output tile read) and its v has
// landed, they write the stage (transpose_value_tile), make their writes
// visible to wgmma's reads and arrive on the stage's full barrier and on the
// raw stage's empty one: every thread for its own writes and reads.
template <typename Traits, bool Is_local>
__device__ __forceinline__ void transpose_value_tiles(const FwdParams& params, const SmemLayout<Traits>& layout,
                                                      const WorkQueue<Traits>& queue, int num_m_blocks,
                                                      int num_work, int section) {
    const int warp = __shfl_sync(0xffffffffu, threadIdx.x / 32, 0) - 1;
    int q_count = 0, tile_count = 0;
    for (int k = 0, t = queue.take(0); t < num_work; t = queue.take(++k)) {
        const WorkTile<Traits, Is_local> work(params, t, num_m_blocks, section);
        if (work.num_tiles == 0) continue;  // as the copying thread
        ++q_count;
        for (int i = 0; i < work.num_tiles; ++i, ++tile_count) {
            const StageOf<Traits> s(tile_count);
            const StageOf<Traits, Traits::kRawValueStages> raw(tile_count);
            const int n0 = (work.key_tiles.n_end - 1 - i) * Traits::kBlockN;
            if (tile_count >= Traits::kStages) mbarrier_wait(layout.v_empty(s.stage), s.phase ^ 1);
            if (Traits::kOInValues && i == 0 && q_count > 1) mbarrier_wait(layout.o_free(), (q_count - 2) & 1);
            mbarrier_wait(layout.raw_value_full(raw.stage), raw.phase);
            transpose_value_tile<Traits>(layout.raw_value(raw.stage), layout.v(s.stage), work.seq.seqlen_k - n0,
                                         warp);
            fence_proxy_async_shared();
            mbarrier_arrive(layout.v_full(s.stage));
            mbarrier_arrive(layout.raw_value_empty(raw.stage));
        }
    }
}

// Persistent blocks (at most one per tile) of one producer and
// kConsumerWarpgroups consumer warpgroups, drawing their query tiles from
// WorkQueue: statically when work_counter is nullptr, else dynamically.
// params.seqlen_q is the longest sequence's query count (varlen: max_seqlen_q).
// o_by_tma: out takes bulk stores through tma_o (the launcher's choice; only
// where Traits::kOThroughSmem).
// key_copy: how paged keys are copied (KeyCopy::kGather*: tma_k and tma_v are
// not used); contiguous keys take kTma. section: the (batch, head) pairs of a
// section of the tiles' order (WorkTile, schedule.h).
template <typename Traits, bool Is_local, bool Has_softcap>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    fwd_kernel(const __grid_constant__ FwdParams params, const __grid_constant__ CUtensorMap tma_q,
               const __grid_constant__ CUtensorMap tma_k, const __grid_constant__ CUtensorMap tma_v,
               const __grid_constant__ CUtensorMap tma_o, bool o_by_tma, WorkCounter* work_counter,
               KeyCopy key_copy, int section) {
    using Element = typename Traits::Element;
    using Out = typename Traits::Out;
    using Work = WorkTile<Traits, Is_local>;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kStages = Traits::kStages;

    extern __shared__ char smem[];
    const SmemLayout<Traits> layout(smem);
    const int num_m_blocks = (params.seqlen_q + kBlockM - 1) / kBlockM;
    const int num_work = num_m_blocks * params.num_heads * params.batch;
    const bool gather = key_copy != KeyCopy::kTma;

    if (threadIdx.x == 0) {
        mbarrier_init(layout.q_full(), 1);
        // One arrival per consumer warp, once its last Q K^T of a query tile is complete.
        mbarrier_init(layout.q_empty(), Traits::kConsumerWarpgroups * 4);
        // A stage's arrival: the producer thread's arrive.expect_tx (TMA), or
        // each producer thread's, made once its copies are complete (gathered).
        // FP8's V^T stages written in the kernel: each transposing thread's.
        const int full_arrivals = gather ? KeyTileGather<Traits, 4>::kThreads : 1;
        for (int stage = 0; stage < kStages; ++stage) {
            mbarrier_init(layout.k_full(stage), full_arrivals);
            mbarrier_init(layout.v_full(stage), Traits::kValuesInKernel ? kValueTransposeThreads : full_arrivals);
            // One arrival per consumer warp: each warp releases a stage once its
            // own wgmma reads of it are complete.
            mbarrier_init(layout.k_empty(stage), Traits::kConsumerWarpgroups * 4);
            mbarrier_init(layout.v_empty(stage), Traits::kConsumerWarpgroups * 4);
        }
        // Each consumer thread's take (and producer warps 1-3's, gathering or transposing values).
        const int takers = Traits::kConsumerWarpgroups * 128 + (gather ? KeyTileGather<Traits, 4>::kThreads - 32 : 0) +
                           (Traits::kValuesInKernel ? kValueTransposeThreads : 0);
        for (int slot = 0; slot < Traits::kWorkSlots; ++slot) {
            mbarrier_init(layout.work_full(slot), 1);  // the producer's draw
            mbarrier_init(layout.work_empty(slot), takers);
        }
        mbarrier_init(layout.o_free(), Traits::kConsumerWarpgroups);  // each warpgroup's O issuer
        for (int stage = 0; stage < Traits::kRawValueStages; ++stage) {
            mbarrier_init(layout.raw_value_full(stage), 1);  // the copying thread's arrive.expect_tx
            mbarrier_init(layout.raw_value_empty(stage), kValueTransposeThreads);
        }
        fence_barrier_init();
    }
    __syncthreads();  // the barriers exist before anyone waits on them; the last block-wide barrier
    const WorkQueue<Traits> queue{layout, work_counter, num_work};

    // Producer and consumers walk the same work tiles, and count the same
    // things: the query tiles with a key tile (q_count: Q's barrier phases) and
    // the key tiles (tile_count: the stages and their phases).
    const int warpgroup = threadIdx.x / 128;
    if (warpgroup == 0) {
        // Producer: thread 0 (warp 0 for paged keys, KeyTileSource); the rest
        // of the warpgroup gives its registers back and exits. Gathered paged
        // keys: the whole warpgroup (gather_tiles). A variable-length batch's
        // rows are packed: its tensor maps have one batch entry and the
        // sequence's rows start at q_start / k_start.
        release_registers<Traits::kProducerRegs>();
        if constexpr (!Traits::kFp8) {
            if (gather) {
                if (threadIdx.x == 0) prefetch_tensor_map(&tma_q);
                if (key_copy == KeyCopy::kGather8) {
                    gather_tiles<Traits, Is_local, 8>(params, layout, queue, &tma_q, num_m_blocks, num_work, section);
                } else {
                    gather_tiles<Traits, Is_local, 4>(params, layout, queue, &tma_q, num_m_blocks, num_work, section);
                }
                return;
            }
        }
        if constexpr (Traits::kValuesInKernel) {
            if (threadIdx.x >= 32) {
                transpose_value_tiles<Traits, Is_local>(params, layout, queue, num_m_blocks, num_work, section);
                return;
            }
        }
        if (threadIdx.x >= 32) return;  // warp 0 draws the work; its lane 0 alone copies but for pages
        const int lane = threadIdx.x;
        if (lane == 0) {
            prefetch_tensor_map(&tma_q);
            prefetch_tensor_map(&tma_k);
            prefetch_tensor_map(&tma_v);
        }
        int q_count = 0, tile_count = 0;
        for (int k = 0, t = queue.draw(0, lane); t < num_work; t = queue.draw(++k, lane)) {
            const Work work(params, t, num_m_blocks, section);
            if (work.num_tiles == 0) continue;  // no key tile: no copy, Q included
            const int head_k = work.head / params.heads_per_kv_head;
            if (lane == 0) load_query_tile(params, layout, &tma_q, work, q_count);
            ++q_count;
            const KeyTileSource<Traits> source(params, work.seq, work.batch, head_k, lane);
            for (int i = 0; i < work.num_tiles; ++i, ++tile_count) {
                const StageOf<Traits> s(tile_count);
                const auto box = source.box_of((work.key_tiles.n_end - 1 - i) * kBlockN);
                // A stage's first use needs no release; its u-th waits for release u - 1.
                if (tile_count >= kStages) mbarrier_wait(layout.k_empty(s.stage), s.phase ^ 1);
                source.load(layout.k(s.stage), &tma_k, layout.k_full(s.stage), box, Traits::kColBlocks);
                if constexpr (Traits::kValuesInKernel) {  // v as K is, for transpose_value_tiles
                    const StageOf<Traits, Traits::kRawValueStages> raw(tile_count);
                    if (tile_count >= Traits::kRawValueStages) {
                        mbarrier_wait(layout.raw_value_empty(raw.stage), raw.phase ^ 1);
                    }
                    source.load(layout.raw_value(raw.stage), &tma_v, layout.raw_value_full(raw.stage), box,
                                Traits::kColBlocks);
                    continue;
                }
                if (tile_count >= kStages) mbarrier_wait(layout.v_empty(s.stage), s.phase ^ 1);
                // The previous query tile's output tile, in the V stages, has been read.
                if (Traits::kOInValues && i == 0 && q_count > 1) mbarrier_wait(layout.o_free(), (q_count - 2) & 1);
                if constexpr (Traits::kFp8) {
                    if (lane == 0) {
                        load_values_transposed<Traits>(params, layout.v(s.stage), &tma_v, layout.v_full(s.stage),
                                                       work.batch, head_k, (work.key_tiles.n_end - 1 - i) * kBlockN);
                    }
                } else {
                    source.load(layout.v(s.stage), &tma_v, layout.v_full(s.stage), box, source.value_col_blocks());
                }
            }
        }
        return;
    }

    // Consumers.
    claim_registers<Traits::kConsumerRegs>();
    // Warp-uniform to the compiler (through the shuffle): Q's descriptor and
    // the barrier ids derived from it live in uniform registers, and no
    // R2UR moves them there before each wgmma.
    const int consumer = __shfl_sync(0xffffffffu, warpgroup - 1, 0);
    const int lane = threadIdx.x % 32;
    const int warp_in_group = (threadIdx.x / 32) % 4;
    const int warp_in_group_row0 = consumer * Traits::kWarpgroupRows + warp_in_group * 16;
    // The thread of each consumer warpgroup that issues its bulk stores of O and
    // waits for them (a bulk async-group belongs to the thread that commits it).
    const bool o_issuer = threadIdx.x % 128 == 0;
    const bool o_staged = Traits::kOThroughSmem && o_by_tma;
    if (o_staged && o_issuer) prefetch_tensor_map(&tma_o);

    // Q (K-major): this warpgroup's 64 rows of each column block. K (K-major)
    // and V (MN-major: keys are the K dimension, the head dim the N dimension,
    // 64 columns per column block) per stage.
    const uint64_t q_desc = smem_descriptor_sw128(layout.q() + consumer * Traits::kWarpgroupRows * kSwizzleBytes,
                                                  kUnusedLeadingBytes, kSwizzleAtomBytes);

    // Ping-pong: the warpgroups issue their GEMMs in turn, round robin, so
    // that the others' softmax runs while the tensor cores work on one's
    // GEMMs. Warpgroup c waits at barrier 1 + c before each issue and, once its
    // GEMMs are issued, lets the next one go (a barrier of two warpgroups: the
    // waiter and the one before it). The last warpgroup lets the first one
    // start; its last arrival is taken by the first warpgroup's last wait,
    // after the last work tile. Every warpgroup takes as many turns as the
    // others: they walk the same key tiles (idle_step: a turn, no GEMM).
    constexpr int kGroups = Traits::kConsumerWarpgroups;
    constexpr int kPingPongThreads = 2 * 128;
    constexpr int kTailBarrier = 1 + kGroups;  // after the ping-pong's 1 .. kGroups
    constexpr int kOBarrier = 2 + kGroups;     // + consumer: a warpgroup's own, around its output tile's writes
    auto before_issue = [&] { named_barrier_sync(1 + consumer, kPingPongThreads); };
    auto after_issue = [&] { named_barrier_arrive(1 + (consumer + 1) % kGroups, kPingPongThreads); };
    if (consumer == kGroups - 1) named_barrier_arrive(1, kPingPongThreads);

    const bool tail_is_memory =
        params.cu_seqlens_k != nullptr || params.seqused_k != nullptr || params.block_table != nullptr;
    // Packed query rows: the rows after a sequence are the next one's (or rows no
    // sequence owns), inside the tensor map of out, so a bulk store there would
    // not be clipped at the sequence's end.
    const bool rows_after_are_others = params.cu_seqlens_q != nullptr || params.seqused_q != nullptr;
    int q_count = 0, tile_count = 0;
    for (int k = 0, t = queue.take(0); t < num_work; t = queue.take(++k)) {
        const Work work(params, t, num_m_blocks, section);
        if (!work.has_rows) continue;
        const Sequence& seq = work.seq;
        const int num_tiles = work.num_tiles;
        const KeyTileRange& key_tiles = work.key_tiles;
        const int warp_row0 = work.m_block * kBlockM + warp_in_group_row0;  // this warp's first row

        float o[1][Traits::kNTilesO][4];
#pragma unroll
        for (int j = 0; j < Traits::kNTilesO; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[0][j][e] = 0.f;
        // FP8: p = exp2(s - m + 6) (OnlineSoftmax: kExpBias), the offset kept
        // while the max grows by at most 2 past it (kSlack), so p < 2^8, in
        // e4m3's range (448); 4 chains of each row's max and sum (kChains). The
        // scores' unit is the stored values', so the scale takes their descales
        // (those of the sequence and KV head).
        OnlineSoftmax<1, Traits::kFp8 ? 6 : 0, Traits::kFp8 ? 4 : 1, Traits::kFp8 ? 2 : 0> softmax;
        float scale_log2 = params.softmax_scale_log2;
        if constexpr (Traits::kFp8) {
            const int descale = work.batch * params.num_heads_k + work.head / params.heads_per_kv_head;
            if (params.q_descale != nullptr) scale_log2 *= params.q_descale[descale];
            if (params.k_descale != nullptr) scale_log2 *= params.k_descale[descale];
        } else if (params.learnable_sink != nullptr) {  // the sink joins each row as its first column
            const float sink_log2 = learnable_sink_log2_of</*May_pack=*/false>(params, work.head, 0);
            softmax.start_at_sink({sink_log2, sink_log2}, scale_log2, lane);
        }
        const ScoreExtras extras(params, work.batch, work.head, work.window.diagonal);

        if (num_tiles > 0) mbarrier_wait(layout.q_full(), q_count & 1);

        // The steps of one key tile, named.
        auto issue_qk = [&](float (&s_frag)[1][Traits::kNTilesS][4], const StageOf<Traits>& s) {  // S = Q K^T
            const uint64_t k_desc = smem_descriptor_sw128(layout.k(s.stage), kUnusedLeadingBytes, kSwizzleAtomBytes);
            mbarrier_wait(layout.k_full(s.stage), s.phase);
            if (gather) fence_proxy_async_shared();  // the producer's cp.async writes, for wgmma
            wgmma_fence();
#pragma unroll
            for (int k = 0; k < Traits::kKStepsQK; ++k) {
                // k16 (FP8: k32) step k: 32 bytes into a 128-byte row, column block k / 4.
                const uint32_t offset_q = (k / 4) * Traits::kQBlockBytes + (k % 4) * 32;
                const uint32_t offset_k = (k / 4) * Traits::kKVBlockBytes + (k % 4) * 32;
                Wgmma<kBlockN>::template ss<Element>(flat(s_frag), advance_descriptor(q_desc, offset_q),
                                                     advance_descriptor(k_desc, offset_k), /*scale_d=*/k > 0);
            }
            wgmma_commit();
        };
        uint32_t p[Traits::kKStepsPV][4];  // P of the last tile whose scores were exponentiated
        auto issue_pv = [&](const StageOf<Traits>& s) {  // O += P V
            // 16-bit: V read MN-major (column blocks of 64 head-dim columns
            // kKVBlockBytes apart); FP8: V^T, K-major as K is, in the 128- or
            // 64-byte swizzle (kValueSwizzleBytes).
            constexpr bool kValueSw64 = Traits::kFp8 && Traits::kValueSwizzleBytes == 64;
            const uint64_t v_desc =
                kValueSw64     ? smem_descriptor_sw64(layout.v(s.stage))
                : Traits::kFp8 ? smem_descriptor_sw128(layout.v(s.stage), kUnusedLeadingBytes, kSwizzleAtomBytes)
                               : smem_descriptor_sw128(layout.v(s.stage), Traits::kKVBlockBytes, kSwizzleAtomBytes);
            mbarrier_wait(layout.v_full(s.stage), s.phase);
            if (gather) fence_proxy_async_shared();
            wgmma_fence();
#pragma unroll
            for (int k = 0; k < Traits::kKStepsPV; ++k) {
                // 16-bit: k16 step k, 16 keys = 16 rows of 128 bytes further. FP8:
                // k32 step k, 32 keys = 32 bytes further in a row of a column block.
                constexpr int kStepsPerBlock = Traits::kValueSwizzleBytes / 32;
                const uint32_t offset = Traits::kFp8 ? (k / kStepsPerBlock) * Traits::kVBlockBytes +
                                                           (k % kStepsPerBlock) * 32
                                                     : k * 16 * kSwizzleBytes;
                Wgmma<Traits::kTileColsV>::template rs<Element>(flat(o), p[k], advance_descriptor(v_desc, offset),
                                                                /*scale_d=*/1);
            }
            wgmma_commit();
        };
        // The warp's reads of a stage (or of Q) are complete (after the
        // wgmma_wait of its GEMM): one arrival per warp lets the producer
        // refill it.
        auto release = [&](uint32_t empty) {
            if (lane == 0) mbarrier_arrive(empty);
        };
        auto scores = [&](float (&s_frag)[1][Traits::kNTilesS][4], int n_block, auto is_masked) {
            const int n0 = n_block * kBlockN;
            if constexpr (Has_softcap) apply_score_extras<false>(s_frag, extras, warp_row0, n0, lane);
            if constexpr (decltype(is_masked)::value) {
                apply_mask<Is_local>(s_frag, warp_row0, n0, work.window, lane);
            }
        };
        // P, re-packed from the accumulator into the A fragments of the k16
        // steps of P V: step k holds n8 blocks 2k and 2k + 1. FP8: k32 step k
        // holds n8 blocks 4k .. 4k + 3, each thread's values where they are,
        // which puts key value_key(kk) at k index kk (fp8_values.cuh: V^T's keys
        // are stored in that order).
        auto pack_p = [&](const float (&s_frag)[1][Traits::kNTilesS][4]) {
            if constexpr (Traits::kFp8) {
#pragma unroll
                for (int k = 0; k < Traits::kKStepsPV; ++k) {
#pragma unroll
                    for (int i = 0; i < 4; ++i) {  // rows r, r + 8 of blocks 4k, 4k + 1, then of 4k + 2, 4k + 3
                        const int j = 4 * k + 2 * (i / 2), e = 2 * (i % 2);
                        p[k][i] = pack4_e4m3(s_frag[0][j][e], s_frag[0][j][e + 1], s_frag[0][j + 1][e],
                                             s_frag[0][j + 1][e + 1]);
                    }
                }
            } else {
#pragma unroll
                for (int k = 0; k < Traits::kKStepsPV; ++k) {
                    p[k][0] = pack2<Element>(s_frag[0][2 * k][0], s_frag[0][2 * k][1]);
                    p[k][1] = pack2<Element>(s_frag[0][2 * k][2], s_frag[0][2 * k][3]);
                    p[k][2] = pack2<Element>(s_frag[0][2 * k + 1][0], s_frag[0][2 * k + 1][1]);
                    p[k][3] = pack2<Element>(s_frag[0][2 * k + 1][2], s_frag[0][2 * k + 1][3]);
                }
            }
        };

        // The first tile walked is the only one that can reach past the
        // sequence's last key. Past the tensor map's rows the copy engine fills
        // zeros; but the rows after a packed sequence (the next sequence's, or
        // what follows seqused_k, or a page's unused rows) are memory it copies
        // as is, or boxes it skips (stale), and a NaN or Inf there would turn
        // P's zeros into NaN in O += P V (0 * Inf). The consumer warpgroups
        // zero those rows of the stage together before any issues its P V:
        // uniform across the block, once per query tile.
        auto zero_tail_rows_of_v = [&](const StageOf<Traits>& s, int n_block) {
            const int first_row = seq.seqlen_k - n_block * kBlockN;  // of the tile
            // Gathered keys (KeyCopy::kGather*) arrive with those rows zero-filled already;
            // FP8's V^T with zero columns past each sequence (fp8_values.cuh).
            if (Traits::kFp8 || !tail_is_memory || gather || first_row >= kBlockN) return;
            constexpr int kChunksPerRow = kSwizzleBytes / 16;
            const int chunks = (kBlockN - first_row) * kChunksPerRow;
            mbarrier_wait(layout.v_full(s.stage), s.phase);
            const int thread = threadIdx.x - 128;
            for (int cb = 0; cb < Traits::kColBlocksV; ++cb) {
                const uint32_t block = layout.v(s.stage) + cb * Traits::kKVBlockBytes + first_row * kSwizzleBytes;
                for (int c = thread; c < chunks; c += Traits::kConsumerWarpgroups * 128) {
                    store_zero_16(block + 16 * c);
                }
            }
            fence_proxy_async_shared();
            named_barrier_sync(kTailBarrier, Traits::kConsumerWarpgroups * 128);
        };

        // Intra-warpgroup overlap: S_i = Q K_i^T and O += P_{i-1} V_{i-1} are
        // issued together; the softmax of tile i runs while the tensor cores
        // finish O, whose rescale by tile i's new row max waits for them. The
        // first tile (no P V yet) is peeled off, so that every issue of a wgmma
        // in the loop meets its wait on every path (ptxas serialises the wgmma
        // otherwise: C7514).
        // Three warpgroups with a causal mask or a window (d64) have too few
        // registers for the mask beside the last tile's P, which the GEMM in
        // flight reads (ptxas spilled in the key loop): their masked steps wait
        // for both GEMMs first (the diagonal's or the window edges' few tiles).
        // So do FP8's d256 (136 B of spills in its masked steps otherwise; 2
        // stores and 5 loads a masked step are left, none in the unmasked ones).
        constexpr bool kSerialMaskedSteps =
            Is_local && (Traits::kConsumerWarpgroups == 3 || (Traits::kFp8 && Traits::kHeadDim > 128));
        auto first_step = [&](int i, int n_block, auto is_masked) {
            const StageOf<Traits> s(tile_count + i);
            float s_frag[1][Traits::kNTilesS][4];
            before_issue();
            issue_qk(s_frag, s);
            after_issue();
            wgmma_wait<0>();
            pin_registers(flat(s_frag));
            release(layout.k_empty(s.stage));
            scores(s_frag, n_block, is_masked);
            softmax.fold_max(s_frag, scale_log2);  // O is still 0: nothing to rescale
            softmax.exponentiate(s_frag, scale_log2);
            pack_p(s_frag);
        };
        auto step = [&](int i, int n_block, auto is_masked) {
            const StageOf<Traits> s(tile_count + i), previous(tile_count + i - 1);
            float s_frag[1][Traits::kNTilesS][4];
            before_issue();
            issue_qk(s_frag, s);
            issue_pv(previous);
            after_issue();
            if constexpr (decltype(is_masked)::value && kSerialMaskedSteps) {
                // Both GEMMs complete before the mask: P of the last tile is free
                // under it.
                wgmma_wait<0>();
                pin_registers(flat(s_frag));
                pin_registers(flat(o));
                pin_registers(p);
                release(layout.k_empty(s.stage));
                release(layout.v_empty(previous.stage));
                scores(s_frag, n_block, is_masked);
                const auto correction = softmax.fold_max(s_frag, scale_log2);
                softmax.exponentiate(s_frag, scale_log2);
                softmax.rescale(o, correction);
                pack_p(s_frag);
                return;
            }
            wgmma_wait<1>();
            pin_registers(flat(s_frag));
            release(layout.k_empty(s.stage));
            scores(s_frag, n_block, is_masked);
            const auto correction = softmax.fold_max(s_frag, scale_log2);
            softmax.exponentiate(s_frag, scale_log2);
            wgmma_wait<0>();
            pin_registers(flat(o));
            pin_registers(p);
            release(layout.v_empty(previous.stage));
            if constexpr (Traits::kFp8) {
                // P first: its conversions then fill the issue slots between the
                // tail of the exponentials (one ex2 a warp every 8 cycles), where
                // after the rescale's warp-uniform branch they ran on their own
                // (NOTES.md, fifteenth session: +3% at d128).
                pack_p(s_frag);
                softmax.rescale(o, correction);
            } else {
                softmax.rescale(o, correction);
                pack_p(s_frag);
            }
        };

        // A step of a key tile that no row of this warpgroup sees (past its rows'
        // causal diagonal or window, or every row past the sequence: the
        // partial query tile's last warpgroups): no GEMM, only the pipeline's
        // counts, in the order the other warpgroups keep them (its ping-pong
        // turn, its release of each stage once the stage is full), in two
        // halves: the walk's first tile zeroes V's tail rows between them.
        auto idle_keys = [&](int i) {
            const StageOf<Traits> s(tile_count + i);
            before_issue();
            after_issue();
            mbarrier_wait(layout.k_full(s.stage), s.phase);
            release(layout.k_empty(s.stage));
        };
        auto idle_values = [&](int i) {
            const StageOf<Traits> s(tile_count + i);
            mbarrier_wait(layout.v_full(s.stage), s.phase);
            release(layout.v_empty(s.stage));
        };
        auto idle_step = [&](int i) {
            idle_keys(i);
            idle_values(i);
        };

        // The block walks key tiles [n_begin, n_end) from the last; this
        // warpgroup computes only those its 64 rows see, [mine.n_begin,
        // mine.n_end), and masks only those its rows see in part (mask.cuh:
        // rows_key_tiles): with a causal mask or a window the first and last
        // tiles of a 192- or 128-row block are often wholly past a warpgroup's
        // rows, and a 64-row range has fewer partial tiles than the block's.
        // Warp-uniform to the compiler (broadcast from lane 0), so that the
        // wgmma under it stays in code it knows every warp runs whole.
        KeyTileRange mine = rows_key_tiles<Traits::kWarpgroupRows, kBlockN>(
            key_tiles, work.m_block * kBlockM + consumer * Traits::kWarpgroupRows, seq.seqlen_q, work.window);
        mine.n_begin = __shfl_sync(0xffffffffu, mine.n_begin, 0);
        mine.n_end = __shfl_sync(0xffffffffu, mine.n_end, 0);
        mine.full_begin = __shfl_sync(0xffffffffu, mine.full_begin, 0);
        mine.full_end = __shfl_sync(0xffffffffu, mine.full_end, 0);
        // The first step of this warpgroup's own range, masked or not.
        auto first_own_step = [&](int i, int n_block) {
            if (n_block >= mine.full_end || n_block < mine.full_begin) {
                first_step(i, n_block, std::true_type{});
            } else {
                first_step(i, n_block, std::false_type{});
            }
        };
        if (num_tiles > 0) {
            int i = 0;
            int n_block = key_tiles.n_end - 1;
            // The walk's first tile (the block's last): this warpgroup's first step
            // where its rows see it, else an idle step, whose halves let every
            // warpgroup zero V's tail rows here, at one instruction: their barrier
            // is bar.sync, which all its threads must reach through the same one.
            const bool sees_first = n_block < mine.n_end;  // mine is empty or ends at the block's end
            if (sees_first) {
                first_own_step(i, n_block);
            } else {
                idle_keys(i);
            }
            zero_tail_rows_of_v(StageOf<Traits>(tile_count), n_block);
            if (!sees_first) idle_values(i);
            --n_block;
            ++i;
            for (; n_block >= mine.n_end; --n_block, ++i) idle_step(i);
            if (mine.n_begin < mine.n_end) {
                if (!sees_first) {
                    first_own_step(i, n_block);
                    --n_block;
                    ++i;
                }
                for (; n_block >= mine.full_end; --n_block, ++i) step(i, n_block, std::true_type{});
                for (; n_block >= mine.full_begin; --n_block, ++i) step(i, n_block, std::false_type{});
                for (; n_block >= mine.n_begin; --n_block, ++i) step(i, n_block, std::true_type{});
                // Every Q K^T of this query tile is complete: the producer may load the next Q.
                release(layout.q_empty());
                // The last tile's O += P V.
                const StageOf<Traits> last(tile_count + i - 1);
                before_issue();
                issue_pv(last);
                after_issue();
                wgmma_wait<0>();
                pin_registers(flat(o));
                release(layout.v_empty(last.stage));
            } else {  // no key for any row: the turn of the last P V, none issued
                release(layout.q_empty());
                before_issue();
                after_issue();
            }
            for (; n_block >= key_tiles.n_begin; --n_block, ++i) idle_step(i);
            ++q_count;
            tile_count += num_tiles;
        }

        // Epilogue: normalise, write this warpgroup's rows of out, then their LSE
        // (rows past the sequence and columns past the head dim stay unwritten).
        float lse[2];
        softmax.finalize(o, lse);
        if constexpr (Traits::kFp8) {  // v's descale, of the sequence and KV head
            if (params.v_descale != nullptr) {
                const float v_descale =
                    params.v_descale[work.batch * params.num_heads_k + work.head / params.heads_per_kv_head];
#pragma unroll
                for (int j = 0; j < Traits::kNTilesO; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) o[0][j][e] *= v_descale;
            }
        }
        const int group_row0 = work.m_block * kBlockM + consumer * Traits::kWarpgroupRows;
        const int group_rows = seq.seqlen_q - group_row0;  // > 0: the warpgroup has min(this, 64) rows to write
        // The bulk store clips a box only at the tensor map's edges: exact for a
        // padded batch, whose rows past a sequence's end are outside the map's
        // (they are the next batch entry's), and for a packed warpgroup whose 64
        // rows all lie inside its sequence. Its partial warpgroup, once per
        // sequence, stores from registers. The choice is the same in every lane;
        // broadcast from lane 0, it is one the compiler knows to be, so that the
        // warp-collective code under it (stmatrix, bar.sync) does not make it
        // compile the loop around it for divergent warps (no uniform datapath:
        // every wgmma descriptor through R2UR).
        // In the V stages (kOInValues) only after a key tile: the producer
        // counts the query tiles with one (o_free).
        const bool o_by_copy =
            Traits::kOThroughSmem && (!Traits::kOInValues || num_tiles > 0) &&
            __shfl_sync(0xffffffffu,
                        o_by_tma && (group_rows >= Traits::kWarpgroupRows || (group_rows > 0 && !rows_after_are_others)),
                        0);
        if constexpr (Traits::kOThroughSmem) {
            if (o_by_copy) {
                if constexpr (Traits::kOInValues) {
                    // Every P V of the query tile, both warpgroups', is complete
                    // (the last tile's V stage released by all of them): the V
                    // stages are free until the producer's next copy, which waits
                    // for o_free.
                    const StageOf<Traits> last(tile_count - 1);
                    mbarrier_wait(layout.v_empty(last.stage), last.phase);
                } else {
                    // The warpgroup's previous bulk store has read its rows of the tile
                    // (its issuer waits; the barrier tells the others) before they are
                    // written again.
                    if (o_issuer) bulk_wait_group_read<0>();
                }
                named_barrier_sync(kOBarrier + consumer, 128);
                stage_o<Traits>(o, layout.o_group(consumer), warp_in_group, lane);
                fence_proxy_async_shared();  // the stmatrix writes, visible to the copy engine
                named_barrier_sync(kOBarrier + consumer, 128);
                if (o_issuer) {
#pragma unroll
                    for (int cb = 0; cb < Traits::kColBlocksO; ++cb) {
                        if (cb * kSwizzleCols >= params.head_dim_v) break;  // a box wholly past out's columns
                        tma_store_4d(&tma_o, layout.o_group(consumer) + cb * Traits::kOBlockBytes, cb * kSwizzleCols,
                                     seq.q_start + group_row0, work.head,
                                     params.cu_seqlens_q == nullptr ? work.batch : 0);
                    }
                    bulk_commit_group();
                }
            }
        }
        Out* out = static_cast<Out*>(params.o_ptr) + work.batch * params.o_batch_stride +
                       work.head * params.o_head_stride + static_cast<int64_t>(seq.q_start) * params.o_row_stride;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = warp_row0 + half * 8 + lane / 4;
            if (row >= seq.seqlen_q) continue;
            if (lane % 4 == 0) {
                params.lse_ptr[work.batch * params.lse_batch_stride + work.head * params.lse_head_stride +
                               seq.q_start + row] = lse[half];
            }
            if (o_by_copy) continue;
            // From registers: each thread its pairs of output columns.
            Out* out_row = out + static_cast<int64_t>(row) * params.o_row_stride;
#pragma unroll
            for (int j = 0; j < Traits::kNTilesO; ++j) {
                const int col = j * 8 + (lane % 4) * 2;
                if (col < params.head_dim_v) {
                    *reinterpret_cast<uint32_t*>(out_row + col) =
                        pack2<Out>(o[0][j][2 * half], o[0][j][2 * half + 1]);
                }
            }
        }
        if constexpr (Traits::kOInValues) {
            // This warpgroup is done with the V stages (its bulk stores have read
            // its rows of the output tile, or it wrote none there): once both
            // are, the producer copies the next query tile's values.
            if (num_tiles > 0 && o_issuer) {
                if (o_by_copy) bulk_wait_group_read<0>();
                mbarrier_arrive(layout.o_free());
            }
        }
    }
    // The last bulk stores have read the output tile before the block's shared
    // memory goes, and are complete.
    if (o_staged && o_issuer) bulk_wait_group<0>();
    if (consumer == 0) before_issue();  // the second warpgroup's last arrival
}

}  // namespace flash::sm90
