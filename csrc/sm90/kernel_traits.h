// Tile shapes and the shared-memory layout of the sm90 forward kernel, derived
// from the head dim and the key tile and checked at compile time. Host code
// reads them too (serves(), the launcher), so nothing here is device-only.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

namespace flash::sm90 {

// Tiles live in shared memory in the layout the copy engine writes with the
// 128-byte swizzle and wgmma reads through its descriptors: a [rows, kHeadDim]
// tile is cut into column blocks of 64 elements (one 128-byte row each), every
// block [rows, 64] stored row after row, 8-row atoms of 1024 bytes.
constexpr int kSwizzleBytes = 128;
constexpr int kSwizzleCols = kSwizzleBytes / 2;  // 16-bit elements per swizzled row
constexpr int kSwizzleAtomBytes = 8 * kSwizzleBytes;

// The shared memory a block may take on sm_90 (227 KB).
constexpr int kMaxSmemPerBlock = 227 * 1024;

// The registers an SM's 64K give each of kThreads threads at entry (the cap of
// __launch_bounds__(kThreads, 1), rounded down to the allocation unit of 8):
// what setmaxnreg redistributes among the warpgroups of a block.
constexpr int registers_at_entry(int threads) { return 65536 / threads / 8 * 8; }

// The bytes of an element type; void stands for either 16-bit type where only
// the sizes matter (the checks below, host code that sizes shared memory).
template <typename T>
inline constexpr int kBytesOf = sizeof(T);
template <>
inline constexpr int kBytesOf<void> = 2;

// CTA: one producer warpgroup (one thread issues every bulk copy and the rest
// of it exits; or, gathering paged keys, all 128 threads copy) and
// kConsumerWarpgroups consumer warpgroups of 64 query rows each (the M of
// wgmma), which walk the same key tiles. kHeadDimV: V's (and O's) head dim,
// kHeadDim's or a narrower one (DeepSeek MLA: 192 for Q and K, 128 for V):
// V tiles and the P V GEMM are that wide. Element: q's, k's and v's type,
// 16-bit, or e4m3 for FP8 attention (kFp8), whose out is Out (16-bit).
template <int kHeadDim_, int kBlockN_, typename Element_, int kConsumerWarpgroups_ = 2, int kHeadDimV_ = kHeadDim_,
          typename Out_ = Element_>
struct FwdTraits {
    using Element = Element_;  // __half or __nv_bfloat16, or __nv_fp8_e4m3 (kFp8)
    using Out = Out_;          // out's: Element, or with FP8 __half or __nv_bfloat16
    static constexpr bool kFp8 = kBytesOf<Element> == 1;
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kHeadDimV = kHeadDimV_;
    static constexpr int kWarpgroupRows = 64;
    static constexpr int kConsumerWarpgroups = kConsumerWarpgroups_;
    static constexpr int kBlockM = kConsumerWarpgroups * kWarpgroupRows;  // query rows per block
    static constexpr int kBlockN = kBlockN_;                              // keys per main-loop step
    // K and V tiles in flight: 3 for FP8's 192-key tiles (d128), whose steps are short
    // enough that the consumers waited for K with 2 (NOTES.md, fifteenth session).
    static constexpr int kStages = kFp8 && kBlockN == 192 ? 3 : 2;
    static constexpr int kNThreads = 128 * (1 + kConsumerWarpgroups);
    // setmaxnreg: the producer keeps what its bookkeeping needs without a
    // spill (gathering, 128 threads hold a tile's lookups: 40; with three
    // consumer warpgroups 32, so that they get 160 each, below which d64's
    // wgmma are serialised, ptxas C7512), the consumers the rest of what the
    // block holds at entry (one block per SM), in the allocation unit of 8:
    // 232 each of two.
    // FP8 at d256 (never gathered: one copying thread) 24, which gives its
    // consumers 240: at 232 ptxas serialised their wgmma (C7512) and spilled
    // 172 B in the key loop; at 24 the producer's bookkeeping spills 40 B
    // (NOTES.md), outside the consumers' loop, and with a mask (Is_local) each
    // masked step still stores 2 and loads 5 words (the unmasked steps none).
    // FP8 at d128 64: its warps 1-3 transpose the value tiles (kValuesInKernel),
    // four units' loads in flight; at 40 and 56 they spilled 8-124 B, and its
    // consumers run 216 without a spill or a serialised wgmma (NOTES.md).
    static constexpr int kProducerRegs = kFp8 ? (kHeadDim > 128 ? 24 : 64) : kConsumerWarpgroups == 3 ? 32 : 40;
    static constexpr int kConsumerRegs =
        (kNThreads * registers_at_entry(kNThreads) - 128 * kProducerRegs) / (128 * kConsumerWarpgroups) / 8 * 8;

    // Elements of one swizzled row (128 bytes): 64 in 16 bits, 128 in 8; the K
    // of one wgmma (32 bytes of a row either way: k16, or k32 in 8 bits).
    static constexpr int kElementCols = kSwizzleBytes / kBytesOf<Element>;
    static constexpr int kKStep = 32 / kBytesOf<Element>;
    // Tiles are whole column blocks wide: head dim 96 is stored (and its P V
    // computed) 128 columns wide, the last 32 zeros from the copies' bounds,
    // since the swizzle atom of V, read MN-major, is 64 columns wide.
    static constexpr int kColBlocks = (kHeadDim + kElementCols - 1) / kElementCols;
    static constexpr int kTileCols = kColBlocks * kElementCols;
    // O (16-bit) in column blocks of 64; so are 16-bit V tiles. FP8 takes V
    // transposed (B of P V must be K-major in 8 bits): V^T tiles of kTileColsV
    // head-dim rows by kBlockN keys, in column blocks of 128 keys in the
    // 128-byte swizzle, or where the tile is no multiple of 128 keys (192) of 64
    // in the 64-byte one (d256 ran 5% slower on those than on 128, NOTES.md).
    static constexpr int kColBlocksO = (kHeadDimV + kSwizzleCols - 1) / kSwizzleCols;
    static constexpr int kTileColsV = kColBlocksO * kSwizzleCols;
    static constexpr int kValueSwizzleBytes = kFp8 && kBlockN % 128 != 0 ? 64 : kSwizzleBytes;  // V^T's rows
    static constexpr int kColBlocksV = kFp8 ? kBlockN / kValueSwizzleBytes : kColBlocksO;  // of a V (V^T) tile
    static constexpr int kKStepsQK = kHeadDim / kKStep;  // k16 (k32) steps of S = Q K^T
    static constexpr int kKStepsPV = kBlockN / kKStep;   // k16 (k32) steps of O += P V
    static constexpr int kNTilesS = kBlockN / 8;         // n8 blocks of a warp's S fragment
    static constexpr int kNTilesO = kTileColsV / 8;      // n8 blocks of a warp's O fragment

    // Bytes of one column block, and of a whole tile (what a tile's copies
    // deliver, out-of-bounds zeros included).
    static constexpr int kQBlockBytes = kBlockM * kSwizzleBytes;
    static constexpr int kKVBlockBytes = kBlockN * kSwizzleBytes;  // of K and of a 16-bit V
    static constexpr int kVBlockBytes = kFp8 ? kTileColsV * kValueSwizzleBytes : kKVBlockBytes;
    static constexpr int kQBytes = kColBlocks * kQBlockBytes;
    static constexpr int kKVBytes = kColBlocks * kKVBlockBytes;  // a K tile
    static constexpr int kVBytes = kColBlocksV * kVBlockBytes;
    // FP8 at d128 (kValuesInKernel): v arrives as K does, keys as rows (by the bulk tensor copy,
    // into kRawValueStages stages of K's layout), and producer warps 1-3 write each tile
    // transposed into its V^T stage (fwd_kernel.cuh: transpose_value_tiles). Elsewhere (d256,
    // whose producer has 24 registers) a kernel of its own transposes v before the call
    // (fp8_values.cuh).
    static constexpr bool kValuesInKernel = kFp8 && kHeadDim == 128;
    // One: two (the output tile then in the V^T stages) ran no faster (NOTES.md).
    static constexpr int kRawValueStages = kValuesInKernel ? 1 : 0;
    static constexpr int kRawValueBytes = kKVBytes;  // a tile of v as copied, in K's layout

    // O's way out of the block (issue 18). Where the output tile, [kBlockM, kTileCols] in Q's
    // layout, fits beside Q and the stages (kOStaged), each consumer warpgroup writes its
    // normalised rows into it (stmatrix, conflict-free in the 128-byte swizzle) and one of its
    // threads stores them with the bulk tensor copy, a box of kWarpgroupRows x 64 columns per
    // column block; the buffer is the warpgroup's own, so its epilogue still runs under the other
    // warpgroup's GEMMs. Elsewhere the tile takes the V stages (kOInValues, below; the table
    // under FwdConfig says which configs and why).
    static constexpr int kOBlockBytes = kBlockM * kSwizzleBytes;
    static constexpr int kOBytes = kColBlocksO * kOBlockBytes;
    static constexpr int kOGroupBoxBytes = kWarpgroupRows * kSwizzleBytes;  // a warpgroup's box of a column block

    // Q, then kStages K tiles, then kStages V tiles, then (kOStaged) the output tile, then the
    // mbarriers, the work slots and the addresses of the key rows being gathered (paged keys,
    // KeyCopy::kGather: a K and a V address per row of a tile); the base is aligned up to an atom
    // at run time (kSmemAlign spare bytes).
    static constexpr int kSmemQOffset = 0;
    static constexpr int kSmemKOffset = kSmemQOffset + kQBytes;
    static constexpr int kSmemVOffset = kSmemKOffset + kStages * kKVBytes;
    static constexpr int kSmemRawValueOffset = kSmemVOffset + kStages * kVBytes;
    static constexpr int kSmemOOffset = kSmemRawValueOffset + kRawValueStages * kRawValueBytes;
    // Q full and empty; K, V full and empty per stage; the work exchange's full and empty per
    // slot; O's reads of the V stages done (kOInValues); full and empty per raw value stage.
    static constexpr int kWorkSlots = 2;  // query tiles handed from the producer to the consumers
    static constexpr int kBarriers = 2 + 4 * kStages + 2 * kWorkSlots + 1 + 2 * kRawValueStages;
    static constexpr int kSmemAlign = kSwizzleAtomBytes;
    static constexpr int kGatherRowBytes = 16;  // a key row's K and V addresses
    // Past the tiles: the barriers, the work slots (rounded up to 16 bytes), the gathered rows'
    // addresses and the alignment's spare bytes.
    static constexpr int kSmemTailBytes =
        (8 * kBarriers + 4 * kWorkSlots + 15) / 16 * 16 + kBlockN * kGatherRowBytes + kSmemAlign;
    static constexpr bool kOStaged = kSmemOOffset + kOBytes + kSmemTailBytes <= kMaxSmemPerBlock;
    // Where it does not fit, the output tile takes the V stages' place (they are as large or
    // larger) once every P V of the query tile is complete, both warpgroups', and the producer
    // copies the next query tile's first V there only after the tile's bulk stores have read it
    // (o_free). From registers instead (4-byte stores of scattered rows), the epilogue took 12%
    // of the warps' time at d256 S 2048 causal (NOTES.md, sixteenth session).
    static constexpr bool kOInValues = !kOStaged && kStages * kVBytes >= kOBytes;
    static constexpr bool kOThroughSmem = kOStaged || kOInValues;
    static constexpr int kSmemBarrierOffset = kSmemOOffset + (kOStaged ? kOBytes : 0);
    static constexpr int kSmemWorkOffset = kSmemBarrierOffset + 8 * kBarriers;  // an int per work slot
    static constexpr int kSmemGatherOffset = (kSmemWorkOffset + 4 * kWorkSlots + 15) / 16 * 16;
    static constexpr int kSmemBytes = kSmemGatherOffset + kBlockN * kGatherRowBytes + kSmemAlign;

    static_assert(kHeadDim % 32 == 0 && kHeadDim <= 256, "head dims 64, 96, 128, 192, 256");
    static_assert(kHeadDimV % 32 == 0 && kHeadDimV <= kHeadDim, "V's head dim: Q's and K's, or narrower");
    static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "wgmma N and the k16 steps of P V");
    static_assert(!kFp8 || (kBlockN % kValueSwizzleBytes == 0 && kHeadDim % kElementCols == 0 &&
                            kHeadDimV == kHeadDim && kBytesOf<Out> == 2),
                  "FP8: whole column blocks of 64 keys (V^T) and of the head dim, one head dim, 16-bit out");
    static_assert(kQBlockBytes % kSwizzleAtomBytes == 0 && kKVBlockBytes % kSwizzleAtomBytes == 0 &&
                      kOGroupBoxBytes % kSwizzleAtomBytes == 0,
                  "every column block (and a warpgroup's box of O) starts on a swizzle atom");
    static_assert(kConsumerWarpgroups * 128 * kConsumerRegs + 128 * kProducerRegs <=
                      kNThreads * registers_at_entry(kNThreads),
                  "setmaxnreg: the warpgroups' registers must fit what the block holds at entry");
    static_assert(kSmemBytes <= kMaxSmemPerBlock, "shared memory over the sm_90 per-block limit");
};

// Keys per step for each compiled head dim: two stages of K and V tiles plus Q
// within 227 KB. Without a mask that cuts keys (Is_local), d128 takes 176 keys
// per step: fewer, longer steps for the same bytes of shared memory.
// d64 runs three consumer warpgroups (192 query rows a block): its softmax
// costs as much as its GEMMs, and a third warpgroup's GEMMs are one more place
// for the tensor cores to go while two exponentiate (and a K and V tile serves
// 1.5x the rows). Three warpgroups get 160 registers each (the producer 32).
// At that, the masked steps of a causal mask or a window spilled in the key
// loop (ptxas: 88-168 bytes) while they overlapped the last tile's P V, so
// there they wait for it first (fwd_kernel.cuh: kSerialMaskedSteps); what is
// left is 12 bytes stored once per query tile, outside the key loop.
// kHeadDimV: a narrower V (FwdTraits) where a config for it is listed.
template <int kHeadDim, bool Is_local, int kHeadDimV = kHeadDim> struct FwdConfig;
template <bool Is_local> struct FwdConfig<64, Is_local> {
    static constexpr int kBlockN = 128, kConsumerWarpgroups = 3;
};
template <bool Is_local> struct FwdConfig<96, Is_local> {
    static constexpr int kBlockN = 128, kConsumerWarpgroups = 2;
};
template <bool Is_local> struct FwdConfig<128, Is_local> {
    static constexpr int kBlockN = Is_local ? 128 : 176, kConsumerWarpgroups = 2;
};
template <bool Is_local> struct FwdConfig<192, Is_local> {
    static constexpr int kBlockN = Is_local ? 96 : 112, kConsumerWarpgroups = 2;
};
template <bool Is_local> struct FwdConfig<256, Is_local> {
    static constexpr int kBlockN = 80, kConsumerWarpgroups = 2;
};
// DeepSeek MLA (Q and K 192, V 128): the V stages take 2/3 of d192's, so
// non-local tiles take 128 keys (48 + 2 x 48 + 2 x 32 = 208 KB).
template <bool Is_local> struct FwdConfig<192, Is_local, 128> {
    static constexpr int kBlockN = Is_local ? 96 : 128, kConsumerWarpgroups = 2;
};

// FP8 (e4m3 q, k, v; Fp8FwdTraitsFor): head dims 128 and 256 (smaller ones
// padded up to them), two consumer warpgroups, key tiles of 192 at d128 without
// a mask that cuts keys, else 128 (whole column blocks of V^T's 64 keys): d128
// at 128 keys ran at 824 TFLOP/s, 42% of the tensor cores' FP8 rate, and
// FlashAttention-3 takes longer tiles for FP8 than for 16 bits (NOTES.md).
// 256 keys at d128 spilled 640 B and serialised the wgmma (C7512); d256 has the
// registers for 128 (its O takes 128 a thread).
template <int kHeadDim, bool Is_local>
struct Fp8FwdConfig {
    static_assert(kHeadDim == 128 || kHeadDim == 256, "FP8 head dims 128 and 256");
    static constexpr int kBlockN = kHeadDim == 128 && !Is_local ? 192 : 128, kConsumerWarpgroups = 2;
};
constexpr int fp8_head_dim(int head_dim) { return head_dim <= 128 ? 128 : head_dim <= 256 ? 256 : 0; }
template <int kHeadDim, typename Out, bool Is_local>
using Fp8FwdTraitsFor = FwdTraits<kHeadDim, Fp8FwdConfig<kHeadDim, Is_local>::kBlockN, __nv_fp8_e4m3,
                                  Fp8FwdConfig<kHeadDim, Is_local>::kConsumerWarpgroups, kHeadDim, Out>;

// The narrower V head dim compiled for a head dim, 0 where there is none
// (dispatch.cu runs a call whose V is at most that wide on it).
constexpr int narrow_head_dim_v(int head_dim) { return head_dim == 192 ? 128 : 0; }

template <int kHeadDim, typename Element, bool Is_local, int kHeadDimV = kHeadDim>
using FwdTraitsFor = FwdTraits<kHeadDim, FwdConfig<kHeadDim, Is_local, kHeadDimV>::kBlockN, Element,
                               FwdConfig<kHeadDim, Is_local, kHeadDimV>::kConsumerWarpgroups, kHeadDimV>;

// Where configs stage O (a buffer of their own, FwdTraits::kOStaged, or the V
// stages, kOInValues), in KB of
// the 227 a block may take: Q + two K and two V stages (+ the 1 KB alignment
// spare, the barriers and the gathered rows' addresses, 16 bytes a key of the
// tile), and the output tile it would add ("local": a causal
// mask or a window, Is_local).
//   d64  (both):        24 + 4 x 16 = 89, + 24 -> 113: staged (192 query rows)
//   d96  (both):        32 + 4 x 32 = 161, + 32 -> 193: staged (128 columns wide;
//                       the store clips them at the head dim)
//   d128 local (N 128): 32 + 4 x 32 = 161, + 32 -> 193: staged
//   d128 (N 176):       32 + 4 x 44 = 209, + 32 -> 241: in the V stages (88)
//   d192 local (N 96):  48 + 4 x 36 = 193, + 48 -> 241: in the V stages (72)
//   d192 (N 112):       48 + 4 x 42 = 217, + 48 -> 265: in the V stages (84)
//   d256 (N 80):        64 + 4 x 40 = 225, + 64 -> 289: in the V stages (80)
// Q is no place for it: it is the next query tile's as soon as both
// warpgroups' last S = Q K^T are complete (q_empty), so that its copy runs
// under this tile's last P V and epilogue. The V stages are free once both
// warpgroups' last P V are (the consumers wait for the last stage's release,
// v_empty) until the producer's next copy of values, which waits for o_free;
// the next tile's keys go on loading meanwhile. Against stores from registers
// (sixteenth session, same process): d192 and d256 S 2048 +4-15%, d128 S 2048
// +3%, d192 S 8192 +2-8%, d256 S 8192 -2% (non-causal; causal -1%).
static_assert(FwdTraitsFor<64, void, false>::kOStaged && FwdTraitsFor<64, void, true>::kOStaged &&
                  FwdTraitsFor<96, void, false>::kOStaged && FwdTraitsFor<96, void, true>::kOStaged &&
                  FwdTraitsFor<128, void, true>::kOStaged,
              "the configs the table above stages O for");
static_assert(FwdTraitsFor<128, void, false>::kOInValues && FwdTraitsFor<192, void, false>::kOInValues &&
                  FwdTraitsFor<192, void, true>::kOInValues && FwdTraitsFor<256, void, false>::kOInValues &&
                  FwdTraitsFor<256, void, true>::kOInValues,
              "the configs the table above stage O in the V stages");

// The zeroed counters a causal or windowed forward asks for (FwdParams::
// fwd_counters): its blocks' tile counter (fwd_kernel.cuh: WorkCounter).
constexpr int kWorkCounterInts = 2;

// Paged keys (block_table) by the bulk tensor copy: a key tile is copied in
// boxes of kv_box_rows rows, each inside one page, so that a box's rows are
// consecutive in memory: the largest common divisor of the page size and the
// tile height. A tile starts at a multiple of kBlockN, so every box starts at a
// multiple of the box height, which divides the page size. A box must be whole
// swizzle atoms (8 rows of 128 bytes), so that each lands on a 1024-byte
// boundary of the tile, as the swizzle and the wgmma descriptors assume:
// otherwise 0, and such pages (a size that is not a multiple of 8, e.g. 12
// against 96-key tiles) can only be gathered (KeyCopy::kGather).
constexpr int kv_box_rows(int page_size, int block_n) {
    int a = page_size, b = block_n;
    while (b != 0) {
        const int r = a % b;
        a = b;
        b = r;
    }
    return a % 8 == 0 ? a : 0;
}
static_assert(kv_box_rows(16, 128) == 16 && kv_box_rows(256, 128) == 128 && kv_box_rows(256, 80) == 16 &&
                  kv_box_rows(24, 96) == 24 && kv_box_rows(12, 96) == 0 && kv_box_rows(7, 128) == 0 &&
                  kv_box_rows(4, 64) == 0,
              "boxes of whole swizzle atoms, each inside one page");

// How the forward's producer fills a stage of paged keys and values
// (fwd_kernel.cuh): kTma, one thread issues a bulk tensor copy per box of
// kv_box_rows rows (KeyTileSource); kGather, the whole producer warpgroup
// copies the tile's rows in 16-byte chunks with cp.async, 4 lanes a row, each
// row's page looked up once per tile (KeyTileGather); kGather8, the same with
// 8 lanes a row (the earlier way, kept for A/B runs: 1-6% slower at pages of
// 16, NOTES.md). Contiguous keys always take kTma (one box per column block).
// Chosen per call by the host (dispatch.cu).
enum class KeyCopy : int { kTma = 0, kGather = 1, kGather8 = 2 };

// The automatic choice: the bulk tensor copy where a tile is one box per column
// block (pages whose size the tile height divides), gathered rows otherwise:
// many small boxes a tile, each behind a block-table read that the one copying
// thread waits for, left the consumers waiting for data (19-31% over contiguous
// keys at pages of 16, NOTES.md), and pages that are not whole swizzle atoms
// have no boxes at all.
constexpr bool gathers_keys(int page_size, int block_n) { return kv_box_rows(page_size, block_n) < block_n; }
static_assert(!gathers_keys(256, 128) && !gathers_keys(128, 128) && gathers_keys(16, 128) && gathers_keys(256, 176) &&
                  gathers_keys(12, 96) && gathers_keys(1, 64),
              "one box per column block, or gathered rows");

// The sm90 backward's main kernel (bwd_kernel.cuh): a block owns kBlockN keys of
// one KV head (64 per consumer warpgroup: the M of its S^T = K Q^T, dP^T = V dO^T,
// dV += P^T dO and dK += dS^T Q) and walks query tiles of kBlockM rows, two
// stages of Q and dO deep. dQ of a step, kBlockM x kHeadDim, is computed one
// of two ways:
//   a dQ owner (kBlockM 64 or 128): one consumer warpgroup computes all of it
//     as a single wgmma chain of N = 128, so that no warpgroup runs a narrow SS
//     GEMM for it: with kBlockM = 64 (d128's deterministic kernels) as dQ
//     itself (M = 64 queries, N = the head dim); with kHeadDim = 64 (d64) as
//     its transpose dQ^T = K^T dS^T (M = 64 head-dim columns, N = 128
//     queries); dS^T is stored with keys as rows (its MN-major operand).
//   split (kDqSplit: kBlockM = 80, d128): each consumer warpgroup computes
//     dQ^T = K^T dS for its half of the head dim (M = 64 columns, N = 80
//     queries), so that both do the same work and neither waits for the other
//     at the step's dS barrier; dS is stored with queries as rows (the K-major
//     B of that GEMM, stmatrix.trans). 80 queries rather than 64 put a quarter
//     more GEMM work behind each step's fixed costs (barriers, waits, the dQ
//     staging); 80 is what fits: 2 x 80 x 128 x 2 B of Q and dO per stage.
template <int kHeadDim_, int kBlockM_, typename Element_>
struct BwdTraits {
    using Element = Element_;  // __half or __nv_bfloat16
    static constexpr bool kSplit = false;  // (BwdSplitTraits)
    static constexpr bool kSlice = false;  // (BwdSliceTraits)
    static constexpr bool kDqInKernel = true;  // (BwdSliceTraits)
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kHeadDimV = kHeadDim;  // a narrower V runs padded to the head dim
    static constexpr int kBlockM = kBlockM_;  // queries per step
    static constexpr int kWarpgroupKeys = 64;
    static constexpr int kConsumerWarpgroups = 2;
    static constexpr int kBlockN = kConsumerWarpgroups * kWarpgroupKeys;  // keys per block
    static constexpr int kStages = 2;                                     // Q and dO tiles in flight
    static constexpr int kDoStages = 0;  // dO rides in Q's stages, on their barriers (BwdSliceTraits)
    static constexpr int kNThreads = 128 * (1 + kConsumerWarpgroups);
    static constexpr int kColBlocks = kHeadDim / kSwizzleCols;  // 64-column blocks of K, V, Q, dO
    static constexpr int kColBlocksV = kColBlocks;
    static constexpr int kTileCols = kColBlocks * kSwizzleCols;
    static constexpr int kKStepsD = kHeadDim / 16;     // k16 steps of S^T and dP^T (over the head dim)
    static constexpr int kKStepsM = kBlockM / 16;      // of dV and dK (over the step's queries)
    static constexpr int kKStepsN = kBlockN / 16;      // of dQ (over the block's keys)
    static constexpr int kNTilesS = kBlockM / 8;       // n8 blocks of a warp's S^T, dP^T fragment
    static constexpr int kNTilesD = kTileCols / 8;     // of its dK, dV fragment
    // What a thread hands on between the parts of a split item (parts.cuh): its dK and dV.
    static constexpr int kPartValues = 2 * kNTilesD * 4;
    static constexpr int kQueryBlocks = kBlockM / kSwizzleCols;  // 64-query column blocks of dS^T (owner)
    static constexpr bool kDqSplit = kBlockM % kSwizzleCols != 0;

    // dQ: the owner's accumulator is 64 x kDqN, dQ (rows: queries) or, when
    // the step has more queries than the head dim has columns, dQ^T (rows:
    // head-dim columns). It is staged in fp32 as the step's [kBlockM, kTileCols]
    // tile in kDqBoxes boxes of 32 columns (128-byte rows, the swizzle's width)
    // for the bulk reduce-add into dq_accum.
    // Split: each warpgroup's dQ^T, 64 x kBlockM, and its half of the tile's boxes.
    static constexpr bool kDqTransposed = kDqSplit || kBlockM > kTileCols;
    static constexpr int kDqN = kDqTransposed ? kBlockM : kTileCols;
    static constexpr int kNTilesDq = kDqN / 8;
    static constexpr int kDqRows = kBlockM;  // rows of a reduce box: the step's queries
    static constexpr int kDqBoxCols = kSwizzleBytes / 4;
    static constexpr int kDqBoxes = kTileCols / kDqBoxCols;
    static constexpr int kDqBoxBytes = kDqRows * kSwizzleBytes;
    static constexpr int kDqBoxesPerWarpgroup = kDqSplit ? kDqBoxes / kConsumerWarpgroups : kDqBoxes;
    // The smallest head dim a call runs this kernel at (dispatch.cu:
    // bwd_head_dim, 33..64 on d64, 65..128 on d128): only a box from that
    // column on can lie wholly past a call's head dim (dq_box_issued).
    static constexpr int kMinHeadDim = kHeadDim / 2 + 1;

    // setmaxnreg: the producer warp needs little; the consumers share the
    // rest. Accumulator registers per thread at each consumer's peak: both
    // hold dK and dV (kTileCols) and, in a step's scores, S^T and dP^T
    // (kBlockM); the owner, when it issues dQ behind {dV, dK}, holds dK, dV,
    // the P^T and dS^T A fragments (kBlockM / 2) and dQ (kDqN / 2): 224 at
    // d128 against 192, 192 against 192 at d64. The owner takes that
    // difference over an even split (d128: 256 and 224; d64: 240 each).
    // Split (both compute dQ^T, after dV completes: P^T's fragments free):
    // 128 + 80 in the scores, 128 + 20 + 40 at dQ^T; 240 each.
    static constexpr int kDqOwner = 0;  // the consumer warpgroup (0 or 1) that computes dQ
    static constexpr int kProducerRegs = 24;
    static constexpr int kKeyPeakRegs = kTileCols + kBlockM;
    static constexpr int kOwnerPeakRegs =
        kTileCols + kBlockM / 2 + kDqN / 2 > kKeyPeakRegs ? kTileCols + kBlockM / 2 + kDqN / 2 : kKeyPeakRegs;
    static constexpr int kConsumerRegsTotal = (1 + kConsumerWarpgroups) * registers_at_entry(kNThreads) - kProducerRegs;
    static constexpr int kKeyRegs = (kConsumerRegsTotal - (kOwnerPeakRegs - kKeyPeakRegs)) / 2 / 8 * 8;
    static constexpr int kDqOwnerRegs = kConsumerRegsTotal - kKeyRegs;  // the dQ owner's
    // Softcap (bwd_kernel.cuh: softcap_chain): where the pass that takes dS^T's
    // chain factor and P^T's exponents runs, at the end of a step's scores or
    // at the head of its gradients. The same arithmetic on the same live
    // registers either way; ptxas fits d64 (S^T and dP^T 64 registers each)
    // without spills only in the first place (104-164 B of spills in the
    // second) and d128's 64-query owner only in the second (8 B in the first:
    // a value the epilogue reads, kept across the loop); d128's 80-query split
    // only in the first (16-28 B in the second, where dQ^T's fragments add).
    static constexpr bool kSoftcapChainInScores = kBlockM != 64;
    // Deterministic kernels (bwd_kernel.cuh: finish_ds): whether dS^T =
    // P^T (dP^T - D) is completed at the end of a step's scores rather than at
    // the head of its gradients, where the default kernels complete it. At
    // d64 the head of the gradients leaves the deterministic key warpgroup
    // (240 registers) no margin: ptxas packs P^T for dV while dP^T, D and P^T
    // are live and spills 12 B there (4 B at the loop's entry with local
    // softcap); at the end of the scores, with no A fragment live, nothing.
    // At d128 the end of the scores serialises the wgmma (C7512), the head
    // of the gradients fits. The d128 split (kDqSplit, never deterministic)
    // completes dS^T at the end of the scores too, softcap aside
    // (bwd_consumer: kDsInScores): at the head of the gradients ptxas packs
    // P^T for dV there as well while S^T, dP^T and D are live beside dK and
    // dV, 232-235 of 240 registers, and spills 16-20 B (one store and load a
    // step); at the end of the scores nothing. Its softcap kernels already
    // run the chain there (kSoftcapChainInScores) and spill 40 B with dS^T
    // added, none without.
    static constexpr bool kDetDsInScores = kBlockM == 128;

    // Bytes of one column block and of a whole tile.
    static constexpr int kKVBlockBytes = kBlockN * kSwizzleBytes;  // K, V: kBlockN rows
    static constexpr int kKVBytes = kColBlocks * kKVBlockBytes;
    static constexpr int kVBytes = kKVBytes;
    static constexpr int kQBlockBytes = kBlockM * kSwizzleBytes;   // Q, dO: kBlockM rows
    static constexpr int kQBytes = kColBlocks * kQBlockBytes;
    static constexpr int kDoBytes = kQBytes;
    // dS^T: kBlockN key rows x 64 queries a block; split, dS: kBlockM query rows x 64 keys a block.
    static constexpr int kDsBlockBytes = (kDqSplit ? kBlockM : kBlockN) * kSwizzleBytes;
    static constexpr int kDsBytes = (kDqSplit ? kBlockN / kSwizzleCols : kQueryBlocks) * kDsBlockBytes;
    static constexpr int kDqBytes = kDqBoxes * kDqBoxBytes;        // the step's dQ tile, fp32

    // K, V, then kStages Q and dO tiles, two dS^T buffers (a step's and the one
    // before it, which the owner's dQ may still read), the dQ tile, the row
    // stats (LSE in base 2 and D per stage), then the mbarriers: K/V full, and
    // full, stats_full and empty per stage.
    static constexpr int kDsBuffers = 2;
    static constexpr int kSmemKOffset = 0;
    static constexpr int kSmemVOffset = kSmemKOffset + kKVBytes;
    static constexpr int kSmemQOffset = kSmemVOffset + kKVBytes;
    static constexpr int kSmemDoOffset = kSmemQOffset + kStages * kQBytes;
    static constexpr int kSmemDsOffset = kSmemDoOffset + kStages * kQBytes;
    static constexpr int kSmemDqOffset = kSmemDsOffset + kDsBuffers * kDsBytes;
    static constexpr int kSmemRowStatsOffset = kSmemDqOffset + kDqBytes;
    static constexpr int kRowStatsBytes = 2 * kBlockM * 4;  // lse_log2 and D of one stage
    static constexpr int kSmemBarrierOffset = kSmemRowStatsOffset + kStages * kRowStatsBytes;
    static constexpr int kBarriers = 1 + 3 * kStages;  // kv_full; per stage full (copies), stats_full, empty
    // Deterministic: the block's key tile, KV head and batch (bwd_kernel.cuh: BwdWork), 16 bytes.
    static constexpr int kSmemTileOffset = (kSmemBarrierOffset + 8 * kBarriers + 15) / 16 * 16;
    static constexpr int kSmemAlign = kSwizzleAtomBytes;
    static constexpr int kSmemBytes = kSmemTileOffset + 16 + kSmemAlign;

    static_assert(kHeadDim == 64 || kHeadDim == 128, "head dims 64 and 128 (33..128 run padded on them)");
    static_assert(kBlockM == 64 || kBlockM == 128 || (kBlockM == 80 && kHeadDim == 128),
                  "whole 64-query column blocks of dS^T (owner), or d128's split at 80 queries");
    static_assert((kDqSplit ? kTileCols / kConsumerWarpgroups : kDqTransposed ? kTileCols : kBlockM) == 64 &&
                      kDqN % 16 == 0 && kDqN <= 256,
                  "dQ (or dQ^T) is one warpgroup's M = 64 rows by a wgmma N");
    static_assert(kDqRows <= 256, "a reduce box is at most 256 rows");
    static_assert(kKVBlockBytes % kSwizzleAtomBytes == 0 && kQBlockBytes % kSwizzleAtomBytes == 0 &&
                      kDsBlockBytes % kSwizzleAtomBytes == 0 && kDqBoxBytes % kSwizzleAtomBytes == 0 &&
                      kSmemRowStatsOffset % kSwizzleAtomBytes == 0,
                  "every swizzled block starts on an atom");
    static_assert(kConsumerWarpgroups == 2 && (kDqOwner == 0 || kDqOwner == 1),
                  "one dQ owner and one other consumer warpgroup");
    static_assert(128 * (kProducerRegs + kDqOwnerRegs + kKeyRegs) <= kNThreads * registers_at_entry(kNThreads) &&
                      kDqOwnerRegs <= 256 && kDqOwnerRegs % 8 == 0,
                  "setmaxnreg: the warpgroups' registers must fit what the block holds at entry, 256 at most each");
    static_assert(kSmemBytes <= kMaxSmemPerBlock, "shared memory over the sm_90 per-block limit");
};

// The sm90 backward's main kernel at head dims 192 and 256 (bwd_kernel.cuh:
// bwd_split_consumer). There dK and dV of 64 keys take d/2 + dv/2 fp32
// registers a thread (192 and 256), which with the scores leave no room in
// one warpgroup; so a block owns 64 keys (kBlockN), and its two consumer
// warpgroups split the five GEMMs of a step of 64 queries between them:
//   the P warpgroup (0): S^T = K Q^T, P^T, dV += P^T dO, dQ's first columns;
//   the dS warpgroup (1): dP^T = V dO^T, dS^T = P^T (dP^T - D), dK += dS^T Q,
//     dQ's other columns.
// P^T crosses from the first to the second in fp32 through shared memory (with
// softcap, P^T times the cap's chain factor), dS^T back in 16 bits (the A
// operand of dQ = dS K, MN-major). dQ's column blocks are split so that the
// GEMM work of the two is balanced (the P warpgroup takes the larger share at
// an odd count: d192's 3 blocks), and each warpgroup adds its columns into
// dq_accum by its own bulk reduce-adds. kHeadDimV: V's (dO's, dV's) tile width,
// the head dim's or DeepSeek MLA's narrower 128 at 192.
template <int kHeadDim_, int kHeadDimV_, typename Element_>
struct BwdSplitTraits {
    using Element = Element_;
    static constexpr bool kSplit = true;
    static constexpr bool kSlice = false;
    static constexpr bool kDqInKernel = true;
    static constexpr bool kDqSplit = false;  // BwdTraits' d128 80-query dQ^T halves (and their writers)
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kHeadDimV = kHeadDimV_;
    static constexpr int kBlockM = 64;  // queries per step
    static constexpr int kBlockN = 64;  // keys per block: both warpgroups' wgmma M
    static constexpr int kConsumerWarpgroups = 2;
    static constexpr int kNThreads = 128 * (1 + kConsumerWarpgroups);
    static constexpr int kColBlocks = kHeadDim / kSwizzleCols;    // of K, Q
    static constexpr int kColBlocksV = kHeadDimV / kSwizzleCols;  // of V, dO
    static constexpr int kTileCols = kColBlocks * kSwizzleCols;
    static constexpr int kTileColsV = kColBlocksV * kSwizzleCols;
    static constexpr int kKStepsD = kHeadDim / 16;    // of S^T (over the head dim)
    static constexpr int kKStepsDv = kHeadDimV / 16;  // of dP^T (over V's)
    static constexpr int kKStepsM = kBlockM / 16;     // of dV, dK (over the step's queries)
    static constexpr int kKStepsN = kBlockN / 16;     // of dQ (over the block's keys)
    static constexpr int kNTilesS = kBlockM / 8;      // n8 blocks of S^T, dP^T
    // dQ: the P warpgroup's column blocks [0, kDqColBlocksP), the dS
    // warpgroup's the rest; GEMM columns of a step, S^T + dV + dQ against
    // dP^T + dK + dQ: 448 / 384 at (192, 128), 512 / 448 at 192, 512 / 512 at 256.
    static constexpr int kDqColBlocksP = (kColBlocks + 1) / 2;
    static constexpr int kDqBoxCols = kSwizzleBytes / 4;  // fp32 columns of a reduce box
    static constexpr int kDqBoxes = kTileCols / kDqBoxCols;
    static constexpr int kDqRows = kBlockM;
    static constexpr int kDqBoxBytes = kDqRows * kSwizzleBytes;
    // The smallest head dim a call runs this kernel at (dispatch.cu: bwd_head_dim).
    static constexpr int kMinHeadDim = kHeadDim - 63;
    static constexpr int kPartValues = 0;  // no split tail (schedule.h: TailSplit)

    // setmaxnreg: the producer warp 24, each consumer the rest (240). Peaks:
    // the P warpgroup dV (dv/2) + dQ (32 a column block) + P^T's A fragments
    // (16): 208 at d256; the dS warpgroup dK (d/2) + dQ + 16: 208 at d256.
    static constexpr int kProducerRegs = 24;
    static constexpr int kConsumerRegs =
        ((1 + kConsumerWarpgroups) * registers_at_entry(kNThreads) - kProducerRegs) / kConsumerWarpgroups / 8 * 8;

    static constexpr int kKVBlockBytes = kBlockN * kSwizzleBytes;
    static constexpr int kKVBytes = kColBlocks * kKVBlockBytes;  // K
    static constexpr int kVBytes = kColBlocksV * kKVBlockBytes;
    static constexpr int kQBlockBytes = kBlockM * kSwizzleBytes;
    static constexpr int kQBytes = kColBlocks * kQBlockBytes;
    static constexpr int kDoBytes = kColBlocksV * kQBlockBytes;
    static constexpr int kDsBlockBytes = kBlockN * kSwizzleBytes;  // dS^T: 64 keys x 64 queries
    static constexpr int kDsBytes = kDsBlockBytes;
    static constexpr int kDsBuffers = 1;  // (bwd_split_consumer: why one is enough)
    static constexpr int kXferBytes = kBlockN * kBlockM * 4;  // P^T in fp32, in the fragments' order
    static constexpr int kDqBytes = kDqBoxes * kDqBoxBytes;
    static constexpr int kRowStatsBytes = 2 * kBlockM * 4;
    static constexpr int kSmemAlign = kSwizzleAtomBytes;
    // K, V, then kStages Q and dO tiles, dS^T, P^T, the dQ tile, the row stats
    // per stage and the barriers (BwdTraits' order): two stages where they fit
    // (192), one at 256.
    static constexpr int kFixedBytes = kKVBytes + kVBytes + kDsBytes + kXferBytes + kDqBytes + kSmemAlign;
    static constexpr int kStageBytes = kQBytes + kDoBytes + kRowStatsBytes + 3 * 8;
    static constexpr int kStages = kFixedBytes + 2 * kStageBytes + 8 <= kMaxSmemPerBlock ? 2 : 1;
    static constexpr int kDoStages = 0;  // (BwdTraits)
    static constexpr int kSmemKOffset = 0;
    static constexpr int kSmemVOffset = kSmemKOffset + kKVBytes;
    static constexpr int kSmemQOffset = kSmemVOffset + kVBytes;
    static constexpr int kSmemDoOffset = kSmemQOffset + kStages * kQBytes;
    static constexpr int kSmemDsOffset = kSmemDoOffset + kStages * kDoBytes;
    static constexpr int kSmemXferOffset = kSmemDsOffset + kDsBytes;
    static constexpr int kSmemDqOffset = kSmemXferOffset + kXferBytes;
    static constexpr int kSmemRowStatsOffset = kSmemDqOffset + kDqBytes;
    static constexpr int kSmemBarrierOffset = kSmemRowStatsOffset + kStages * kRowStatsBytes;
    static constexpr int kBarriers = 1 + 3 * kStages;
    static constexpr int kSmemTileOffset = (kSmemBarrierOffset + 8 * kBarriers + 15) / 16 * 16;  // as BwdTraits'
    static constexpr int kSmemBytes = kSmemTileOffset + 16 + kSmemAlign;

    static_assert(kHeadDim == 192 || kHeadDim == 256, "head dims 192 and 256 (129..256 run padded on them)");
    static_assert(kHeadDimV % kSwizzleCols == 0 && kHeadDimV <= kHeadDim, "V's head dim: whole column blocks");
    static_assert(kKVBlockBytes % kSwizzleAtomBytes == 0 && kQBlockBytes % kSwizzleAtomBytes == 0 &&
                      kDsBytes % kSwizzleAtomBytes == 0 && kXferBytes % kSwizzleAtomBytes == 0 &&
                      kDqBoxBytes % kSwizzleAtomBytes == 0 && kSmemRowStatsOffset % kSwizzleAtomBytes == 0,
                  "every swizzled block starts on an atom");
    static_assert(128 * (kProducerRegs + 2 * kConsumerRegs) <= kNThreads * registers_at_entry(kNThreads) &&
                      kConsumerRegs <= 256 && kConsumerRegs % 8 == 0,
                  "setmaxnreg: the warpgroups' registers must fit what the block holds at entry");
    static_assert(kSmemBytes <= kMaxSmemPerBlock, "shared memory over the sm_90 per-block limit");
};

// The sm90 backward's dK/dV kernel at head dim 256 (bwd_kernel.cuh:
// bwd_slice_consumer): FlashAttention-3's arrangement for it less dQ, with the
// scores split by GEMM rather than by keys. A block owns 80 keys (kBlockN) and
// walks steps of 64 queries:
//   S = Q K^T by consumer warpgroup 0 and dP = dO V^T by warpgroup 1, each
//     over all 80 keys (wgmma N = 80) and 64 queries (M), so that a step reads
//     Q and dO once each; P and dS go to shared memory in 16 bits as
//     [key][query] tiles (one 128-byte row of 64 queries a key) that both
//     read, dS made by warpgroup 1 from the stored P;
//   dV^T += dO^T P, dK^T += Q^T dS: each warpgroup its 128 columns of the head
//     dim (two slices of M = 64), all 80 keys (N = 80): 160 fp32 registers.
// dQ has a kernel of its own over query tiles (BwdDqTraits), in both modes:
// there it is summed in registers and written once, where here each step's
// dQ would go out as 64 KB of fp32 adds (round 34: a third of the step), and
// the deterministic mode needs no order of adds (benchmarks/NOTES.md, round
// 36). Shared memory: K, V 40 KB each; two Q stages and one dO stage, 32 KB
// each (dO has its own ring: kDoStages); P and dS double-buffered, 10 KB each.
template <typename Element_>
struct BwdSliceTraits {
    using Element = Element_;
    static constexpr bool kSplit = false;
    static constexpr bool kSlice = true;
    static constexpr bool kDqSplit = false;
    static constexpr bool kDqInKernel = false;  // dQ by bwd_dq_kernel (BwdDqTraits)
    static constexpr int kHeadDim = 256;
    static constexpr int kHeadDimV = 256;
    static constexpr int kBlockM = 64;  // queries per step: wgmma M of S and dP
    static constexpr int kBlockN = 80;  // keys per block: N of dV^T and dK^T
    static constexpr int kConsumerWarpgroups = 2;
    static constexpr int kNThreads = 128 * (1 + kConsumerWarpgroups);
    static constexpr int kSliceCols = kSwizzleCols;                               // head-dim columns of a slice: 64
    static constexpr int kSlices = kHeadDim / kConsumerWarpgroups / kSliceCols;  // a warpgroup's: 2
    static constexpr int kColBlocks = kHeadDim / kSwizzleCols;
    static constexpr int kColBlocksV = kColBlocks;
    static constexpr int kTileCols = kHeadDim;
    static constexpr int kKStepsD = kHeadDim / 16;  // of S and dP (over the head dim)
    static constexpr int kKStepsM = kBlockM / 16;   // of dV^T and dK^T (over the step's queries)
    static constexpr int kNTilesS = kBlockN / 8;   // n8 blocks of a warp's S or dP
    static constexpr int kNTilesKV = kBlockN / 8;  // of a slice of dV^T, dK^T
    static constexpr int kMinHeadDim = kHeadDim - 63;
    static constexpr int kPartValues = 0;  // no split tail (schedule.h: TailSplit)

    // setmaxnreg: the producer warp 24, each consumer 240. Peak: dV^T and dK^T
    // (160), S or dP (40) while P or dS is made.
    static constexpr int kProducerRegs = 24;
    static constexpr int kConsumerRegs =
        ((1 + kConsumerWarpgroups) * registers_at_entry(kNThreads) - kProducerRegs) / kConsumerWarpgroups / 8 * 8;

    static constexpr int kStages = 2;    // Q tiles (and their LSE) in flight
    static constexpr int kDoStages = 1;  // dO tiles (and their D): a ring of their own
    static constexpr int kKVBlockBytes = kBlockN * kSwizzleBytes;
    static constexpr int kKVBytes = kColBlocks * kKVBlockBytes;
    static constexpr int kVBytes = kKVBytes;
    static constexpr int kQBlockBytes = kBlockM * kSwizzleBytes;
    static constexpr int kQBytes = kColBlocks * kQBlockBytes;
    static constexpr int kDoBytes = kQBytes;
    static constexpr int kPdsBytes = kBlockN * kSwizzleBytes;  // P or dS: 80 key rows x 64 queries
    static constexpr int kPdsBuffers = 2;
    static constexpr int kRowStatsBytes = 2 * kBlockM * 4;  // LSE of Q stage s and D of dO stage s share slot s
    static constexpr int kSmemAlign = kSwizzleAtomBytes;
    // K, V, kStages Q tiles, kDoStages dO tiles, P and dS (kPdsBuffers each,
    // alternating), the row stats, then the barriers: K/V full; full,
    // stats_full and empty per Q stage; the same per dO stage.
    static constexpr int kSmemKOffset = 0;
    static constexpr int kSmemVOffset = kSmemKOffset + kKVBytes;
    static constexpr int kSmemQOffset = kSmemVOffset + kVBytes;
    static constexpr int kSmemDoOffset = kSmemQOffset + kStages * kQBytes;
    static constexpr int kSmemPOffset = kSmemDoOffset + kDoStages * kDoBytes;
    static constexpr int kSmemDsOffset = kSmemPOffset + kPdsBuffers * kPdsBytes;
    static constexpr int kDsBytes = kPdsBytes;
    static constexpr int kSmemRowStatsOffset = kSmemDsOffset + kPdsBuffers * kPdsBytes;
    static constexpr int kSmemBarrierOffset = kSmemRowStatsOffset + kStages * kRowStatsBytes;
    static constexpr int kBarriers = 1 + 3 * kStages + 3 * kDoStages;
    static constexpr int kSmemBytes = kSmemBarrierOffset + 8 * kBarriers + kSmemAlign;

    static_assert(kBlockN % 16 == 0, "whole k16 steps of keys, n8 blocks in pairs");
    static_assert(kStages >= kDoStages, "D of dO stage s sits in row-stat slot s");
    static_assert(kKVBlockBytes % kSwizzleAtomBytes == 0 && kQBlockBytes % kSwizzleAtomBytes == 0 &&
                      kPdsBytes % kSwizzleAtomBytes == 0 && kSmemRowStatsOffset % kSwizzleAtomBytes == 0,
                  "every swizzled block starts on an atom");
    static_assert(128 * (kProducerRegs + 2 * kConsumerRegs) <= kNThreads * registers_at_entry(kNThreads) &&
                      kConsumerRegs <= 256 && kConsumerRegs % 8 == 0,
                  "setmaxnreg: the warpgroups' registers must fit what the block holds at entry");
    static_assert(kSmemBytes <= kMaxSmemPerBlock, "shared memory over the sm_90 per-block limit");
};

// The d256 backward's dQ kernel (bwd_dq_kernel.cuh): a block
// owns 128 queries of one head (each consumer warpgroup 64, as the forward's
// blocks do) and walks the key tiles they see, 64 keys a step, recomputing
// S = Q K^T and dP = dO V^T (from the saved LSE and D) to sum dQ += dS K in
// fp32 registers (128 a thread); dQ is written once, in the input dtype.
// Shared memory: Q and dO for the whole block (64 KB each), two K stages and
// one V stage (32 KB each): V is read by dP alone, early in a step, and is
// refilled while the step's dQ GEMM still reads K.
template <typename Element_>
struct BwdDqTraits {
    using Element = Element_;
    static constexpr int kHeadDim = 256;
    static constexpr int kConsumerWarpgroups = 2;
    static constexpr int kWarpgroupRows = 64;
    static constexpr int kBlockM = kConsumerWarpgroups * kWarpgroupRows;  // queries per block
    static constexpr int kBlockN = 64;                                    // keys per step
    static constexpr int kNThreads = 128 * (1 + kConsumerWarpgroups);
    static constexpr int kColBlocks = kHeadDim / kSwizzleCols;
    static constexpr int kKStepsD = kHeadDim / 16;  // of S and dP (over the head dim)
    static constexpr int kKStepsN = kBlockN / 16;   // of dQ (over the step's keys)
    static constexpr int kNTilesS = kBlockN / 8;    // n8 blocks of a warp's S and dP
    static constexpr int kNTilesDq = kHeadDim / 8;  // of its dQ
    static constexpr int kPartValues = kNTilesDq * 4;  // handed on between parts (parts.cuh): its dQ
    static constexpr int kMinHeadDim = kHeadDim - 63;
    static constexpr int kKStages = 2, kVStages = 1;

    // setmaxnreg: the producer warp 24, each consumer 240. Peak: dQ (128),
    // S and dP (64) while the last step's dS (16, packed) is read by its GEMM.
    static constexpr int kProducerRegs = 24;
    static constexpr int kConsumerRegs =
        ((1 + kConsumerWarpgroups) * registers_at_entry(kNThreads) - kProducerRegs) / kConsumerWarpgroups / 8 * 8;

    static constexpr int kQBlockBytes = kBlockM * kSwizzleBytes;  // Q, dO: kBlockM rows a column block
    static constexpr int kQBytes = kColBlocks * kQBlockBytes;
    static constexpr int kKVBlockBytes = kBlockN * kSwizzleBytes;
    static constexpr int kKVBytes = kColBlocks * kKVBlockBytes;
    static constexpr int kSmemAlign = kSwizzleAtomBytes;
    // Q, dO, the K stages, the V stage, the row stats (LSE in base 2, then
    // D, of the block's rows), then the barriers: Q and dO full, stats full;
    // full and empty per K stage and per V stage.
    static constexpr int kSmemQOffset = 0;
    static constexpr int kSmemDoOffset = kSmemQOffset + kQBytes;
    static constexpr int kSmemKOffset = kSmemDoOffset + kQBytes;
    static constexpr int kSmemVOffset = kSmemKOffset + kKStages * kKVBytes;
    static constexpr int kSmemRowStatsOffset = kSmemVOffset + kVStages * kKVBytes;
    static constexpr int kSmemBarrierOffset = kSmemRowStatsOffset + 2 * kBlockM * 4;
    static constexpr int kBarriers = 2 + 2 * kKStages + 2 * kVStages;
    static constexpr int kSmemBytes = kSmemBarrierOffset + 8 * kBarriers + kSmemAlign;

    static_assert(kQBlockBytes % kSwizzleAtomBytes == 0 && kKVBlockBytes % kSwizzleAtomBytes == 0 &&
                      (kWarpgroupRows * kSwizzleBytes) % kSwizzleAtomBytes == 0,
                  "every swizzled block (and each warpgroup's rows of Q and dO) starts on an atom");
    static_assert(kNTilesS % 2 == 0 && kNTilesDq % 2 == 0, "n8 blocks in pairs: k16 steps of dS, stmatrix x4");
    static_assert(128 * (kProducerRegs + 2 * kConsumerRegs) <= kNThreads * registers_at_entry(kNThreads) &&
                      kConsumerRegs <= 256 && kConsumerRegs % 8 == 0,
                  "setmaxnreg: the warpgroups' registers must fit what the block holds at entry");
    static_assert(kSmemBytes <= kMaxSmemPerBlock, "shared memory over the sm_90 per-block limit");
};

// The shared memory the backward of Traits takes: its main kernel's, or
// without dQ in it (d256), the larger of that and the dQ kernel's.
template <typename Traits>
constexpr int bwd_smem_bytes() {
    if constexpr (!Traits::kDqInKernel) {
        constexpr int kDq = BwdDqTraits<typename Traits::Element>::kSmemBytes;
        return Traits::kSmemBytes > kDq ? Traits::kSmemBytes : kDq;
    } else {
        return Traits::kSmemBytes;
    }
}

// The traits of each head dim the sm90 backward compiles: 64 and 128 on
// BwdTraits (their queries per step here; d128 deterministic keeps the dQ
// owner at 64, whose one dQ tile a step the dQ writer adds in order), 192 (and
// DeepSeek's 192 / 128) on BwdSplitTraits, 256 on BwdSliceTraits (without
// dQ, which BwdDqTraits' kernel computes); a call's head dim runs on the next
// one up (dispatch.cu: bwd_head_dim).
template <int kHeadDim, typename Element, int kHeadDimV, bool Is_deterministic>
struct BwdTraitsOf {
    using type = BwdSplitTraits<kHeadDim, kHeadDimV, Element>;
};
template <typename Element, int kHeadDimV, bool Is_deterministic>
struct BwdTraitsOf<64, Element, kHeadDimV, Is_deterministic> {
    using type = BwdTraits<64, 128, Element>;
};
template <typename Element, int kHeadDimV, bool Is_deterministic>
struct BwdTraitsOf<128, Element, kHeadDimV, Is_deterministic> {
    using type = BwdTraits<128, Is_deterministic ? 64 : 80, Element>;
};

template <typename Element, bool Is_deterministic>
struct BwdTraitsOf<256, Element, 256, Is_deterministic> {
    using type = BwdSliceTraits<Element>;
};

template <int kHeadDim, typename Element, int kHeadDimV = kHeadDim, bool Is_deterministic = false>
using BwdTraitsFor = typename BwdTraitsOf<kHeadDim, Element, kHeadDimV, Is_deterministic>::type;
static_assert(BwdTraitsFor<128, void, 128, true>::kDqOwnerRegs == 256 &&
                  BwdTraitsFor<128, void, 128, true>::kKeyRegs == 224 &&
                  BwdTraitsFor<128, void>::kDqOwnerRegs == 240 && BwdTraitsFor<128, void>::kKeyRegs == 240 &&
                  BwdTraitsFor<64, void>::kDqOwnerRegs == 240 && BwdTraitsFor<64, void>::kKeyRegs == 240,
              "the register split ptxas was checked with (no spills, no C75)");

}  // namespace flash::sm90
