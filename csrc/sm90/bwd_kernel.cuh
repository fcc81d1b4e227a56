// The sm90 backward's main kernel: one block per (key tile of kBlockN keys, KV
// head, batch), warp-specialised. It recomputes each tile's probabilities from
// Q, K and the forward's LSE and folds them into the gradients (sm80's
// bwd_kernel.cuh states the algebra):
//   S^T = K Q^T,  P^T = exp2(S^T * scale_log2 - lse_log2),  dV += P^T dO,
//   dP^T = V dO^T,  dS^T = P^T * (dP^T - D),  dK += dS^T Q,  dQ += dS K,
// with D = rowsum(dO * O) from the preprocess; dK takes the softmax scale at
// the end, dQ in the conversion after this kernel. With softcap (Has_softcap)
// the scores are the forward's, S^T = tanh(K Q^T * softcap_inner_scale) in the
// score unit of flash.h, and dS^T takes the cap's chain factor 1 - S^T^2, as
// in the sm80 backward.
//
//   producer warpgroup: one warp stays (two more as dQ writers where said
//     below). Lane 0 copies K and V once, then each
//     step's Q and dO tiles into kStages stages (TMA, 128-byte swizzle); the
//     32 lanes load the step's LSE (in base 2) and D into the stage's row-stat
//     slots. A stage's "full" mbarrier takes the copies' bytes, its
//     "stats_full" one the 32 lanes' arrivals, its "empty" one an arrival from
//     every consumer thread.
//   consumer warpgroups: 64 keys each (the M of wgmma). Per step: S^T and dP^T
//     (SS wgmma, both operands K-major); P^T and dS^T in registers, re-packed
//     into A fragments, so that dV and dK are RS wgmma reading dO and Q
//     MN-major (the transpose bit); dS^T to shared memory. After a barrier of
//     both warpgroups, one of them (the dQ owner, kernel_traits.h: BwdTraits)
//     computes the step's whole dQ = dS K from both dS^T halves as one SS
//     wgmma chain of N = 128 (dQ at d128, dQ^T = K^T dS^T at d64), stages it
//     in fp32 in shared memory, and one of its threads adds it into dq_accum
//     by a bulk reduce-add, waited for a step later. The other warpgroup goes
//     on to the next step's scores meanwhile; the owner takes more registers.
//     d128's 80-query steps split dQ instead (BwdTraits::kDqSplit): each
//     warpgroup computes dQ^T = K^T dS for its half of the head dim, in
//     FlashAttention-3's order: dV; dS^T stored; the barrier; dQ^T, then dK,
//     dQ^T staged while dK runs and handed to a dQ writer warp of the
//     producer warpgroup, one a warpgroup, which adds it (bwd_dq_half_writer);
//     the next S^T and dP^T together.
//
// At head dim 192 the two consumer warpgroups share one tile of 64 keys
// instead, each taking part of a step's five GEMMs (kernel_traits.h:
// BwdSplitTraits; bwd_split_consumer); the producer and everything below are
// the same. At 256 (both modes) a block owns 80 keys and computes dK and dV
// alone, one warpgroup S and the other dP, both dK and dV
// (kernel_traits.h: BwdSliceTraits; bwd_slice_consumer): dQ comes from a
// kernel of its own over query tiles (bwd_dq_kernel.cuh). There dO has a ring
// of its own (one stage beside Q's two: Traits::kDoStages), which the
// producer fills the same way.
//
// The steps are the query tiles that see a key of the block's tile
// (mask.cuh: query_tile_range), for every query head of the KV head's group:
// dK and dV of the group sum in registers.
//
// Variable-length batches (cu_seqlens_q/k, seqused_q/k, leftpad_k) run on the
// same blocks: the grid spans the longest sequence's key tiles, and a block
// whose tile starts past its sequence's keys has no step (no copy, no write).
// A sequence's rows are packed (its lengths, query tiles and causal diagonal
// its own: BwdWork), and the rows a tile reads past its sequence are zeroed in
// shared memory before any wgmma reads them (BwdWork: zeroes_query_rows).
//
// Deterministic (Is_deterministic): the adds into a dQ tile happen in a fixed
// order of key tiles, so that its fp32 sums round the same way on every run.
// Two more warps of the producer warpgroup, the dQ writers (even and odd
// steps), take over the add from the owner: the owner (the split kernel's two
// warpgroups, each its columns) stages each step's tile and hands it over
// through two named barriers; the step's writer waits for the tile's turn on
// its semaphore in global memory (one per batch, query head and query tile:
// how many key tiles have added), adds the tile, waits for the add to complete
// and counts it (bwd_dq_writer). The turn waited for costs the owner nothing
// while the writers are less than a step behind.
//
// A head dim below the kernel's (33..63 on d64, 65..127 on d128, 129..191 on
// d192, 193..255 on d256) runs padded:
// the copies read zeros past it (the tensor maps' inner extent is the call's
// head dim), so the padding adds nothing to the scores, and the padding
// columns of dK, dV and dQ, zeros, are not written (the epilogue's bound, the
// reduce-add's tensor map).
#pragma once

#include <cuda.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/flash.h"
#include "common/mask.cuh"
#include "common/ptx.cuh"
#include "common/softmax.cuh"
#include "sm90/kernel_traits.h"
#include "sm90/parts.cuh"
#include "sm90/pipeline.cuh"
#include "sm90/ptx.cuh"
#include "sm90/schedule.h"

namespace flash::sm90 {

// The shared-memory addresses of the backward block's tiles and barriers.
template <typename Traits>
struct BwdSmem {
    uint32_t base;  // aligned to a swizzle atom

    __device__ __forceinline__ explicit BwdSmem(const char* smem) {
        base = aligned_smem_base<Traits::kSmemAlign>(smem);
    }
    __device__ __forceinline__ uint32_t k() const { return base + Traits::kSmemKOffset; }
    __device__ __forceinline__ uint32_t v() const { return base + Traits::kSmemVOffset; }
    __device__ __forceinline__ uint32_t q(int stage) const { return base + Traits::kSmemQOffset + stage * Traits::kQBytes; }
    __device__ __forceinline__ uint32_t dout(int stage) const {
        return base + Traits::kSmemDoOffset + stage * Traits::kDoBytes;
    }
    __device__ __forceinline__ uint32_t ds(int buffer) const {
        return base + Traits::kSmemDsOffset + buffer * Traits::kDsBytes;
    }
    __device__ __forceinline__ uint32_t dq() const { return base + Traits::kSmemDqOffset; }
    // BwdSplitTraits: P^T's hand-over from the P warpgroup to the dS one.
    __device__ __forceinline__ uint32_t xfer() const { return base + Traits::kSmemXferOffset; }
    // float lse_log2[kBlockM], then float dsum[kBlockM], per stage.
    __device__ __forceinline__ uint32_t lse_log2(int stage) const {
        return base + Traits::kSmemRowStatsOffset + stage * Traits::kRowStatsBytes;
    }
    __device__ __forceinline__ uint32_t dsum(int stage) const { return lse_log2(stage) + Traits::kBlockM * 4; }
    __device__ __forceinline__ uint32_t barrier(int i) const { return base + Traits::kSmemBarrierOffset + 8 * i; }
    __device__ __forceinline__ uint32_t kv_full() const { return barrier(0); }
    __device__ __forceinline__ uint32_t full(int stage) const { return barrier(1 + stage); }
    __device__ __forceinline__ uint32_t empty(int stage) const { return barrier(1 + Traits::kStages + stage); }
    __device__ __forceinline__ uint32_t stats_full(int stage) const { return barrier(1 + 2 * Traits::kStages + stage); }
    // BwdSliceTraits: dO's own ring (Traits::kDoStages), the same three barriers
    // a stage (its D in row-stat slot `stage`), and P's buffers beside dS's.
    __device__ __forceinline__ uint32_t do_full(int stage) const { return barrier(1 + 3 * Traits::kStages + stage); }
    __device__ __forceinline__ uint32_t do_stats_full(int stage) const {
        return barrier(1 + 3 * Traits::kStages + Traits::kDoStages + stage);
    }
    __device__ __forceinline__ uint32_t do_empty(int stage) const {
        return barrier(1 + 3 * Traits::kStages + 2 * Traits::kDoStages + stage);
    }
    __device__ __forceinline__ uint32_t p(int buffer) const {
        return base + Traits::kSmemPOffset + buffer * Traits::kPdsBytes;
    }
    // Deterministic: the block's key tile and KV head (one 64-bit word), then
    // its batch, stored by thread 0 before the block-wide barrier (BwdWork).
    __device__ __forceinline__ uint32_t tile() const { return base + Traits::kSmemTileOffset; }
};

// The byte address of byte `byte_in_row` of row `row` of a block stored in the
// 128-byte swizzle (the layout TMA writes and wgmma reads, ptx.cuh): rows of
// 128 bytes whose 16-byte chunks are XOR-permuted by the row's place in its
// 8-row atom. `block` is atom-aligned.
__device__ __forceinline__ uint32_t swizzled_address(uint32_t block, int row, int byte_in_row) {
    return block + row * kSwizzleBytes + ((((byte_in_row >> 4) ^ (row & 7)) << 4) | (byte_in_row & 15));
}

// Zeroes rows [first_row, kRows) of the tiles a (kColBlocksA column blocks)
// and b (kColBlocksB <= kColBlocksA; 0: none), kRows rows a column block,
// block_bytes apart; `threads` threads from `thread`: whole 128-byte rows,
// which the swizzle only permutes within.
template <int kColBlocksA, int kColBlocksB, int kRows>
__device__ __forceinline__ void zero_tile_rows(uint32_t a, uint32_t b, int block_bytes, int first_row, int thread,
                                               int threads) {
    static_assert(kColBlocksB <= kColBlocksA, "b no wider than a");
    constexpr int kChunksPerRow = kSwizzleBytes / 16;
#pragma unroll 1
    for (int c = first_row * kChunksPerRow + thread; c < kRows * kChunksPerRow; c += threads) {
#pragma unroll
        for (int cb = 0; cb < kColBlocksA; ++cb) {
            store_zero_16(a + cb * block_bytes + 16 * c);
            if (cb < kColBlocksB) store_zero_16(b + cb * block_bytes + 16 * c);
        }
    }
}

// The same for a tile pair of Traits' widths: a K or Q (Traits::kColBlocks),
// b V or dO (Traits::kColBlocksV).
template <typename Traits, int kRows>
__device__ __forceinline__ void zero_rows(uint32_t a, uint32_t b, int block_bytes, int first_row, int thread,
                                          int threads) {
    zero_tile_rows<Traits::kColBlocks, Traits::kColBlocksV, kRows>(a, b, block_bytes, first_row, thread, threads);
}

// A score tile, one wgmma group: acc = A B^T for a warpgroup's 64 rows of A
// (a_desc) and kN rows of B (b_desc), both K-major over kKSteps k16 steps of
// their columns, stored in 64-column blocks kABlockBytes and kBBlockBytes
// apart: each kernel's S, dP or their transposes.
template <typename Element, int kN, int kKSteps, int kABlockBytes, int kBBlockBytes>
__device__ __forceinline__ void issue_scores_k_major(float (&acc)[1][kN / 8][4], uint64_t a_desc, uint64_t b_desc) {
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kKSteps; ++k) {
        // k16 step k: 32 bytes into a 128-byte row, column block k / 4.
        const uint32_t offset_a = (k / 4) * kABlockBytes + (k % 4) * 32;
        const uint32_t offset_b = (k / 4) * kBBlockBytes + (k % 4) * 32;
        Wgmma<kN>::template ss<Element>(flat(acc), advance_descriptor(a_desc, offset_a),
                                        advance_descriptor(b_desc, offset_b), /*scale_d=*/k > 0);
    }
    wgmma_commit();
}

// A transposed score tile: acc = X Y^T for a warpgroup's 64 rows of X (K or
// V: x_desc) and the stage's tile of Y (Q or dO at y_tile): S^T = K Q^T,
// dP^T = V dO^T.
template <typename Traits, int kKSteps>
__device__ __forceinline__ void issue_transposed_scores(float (&acc)[1][Traits::kNTilesS][4], uint64_t x_desc,
                                                        uint32_t y_tile) {
    const uint64_t y_desc = smem_descriptor_sw128(y_tile, kUnusedLeadingBytes, kSwizzleAtomBytes);
    x_desc = recompute_per_use(x_desc);
    issue_scores_k_major<typename Traits::Element, Traits::kBlockM, kKSteps, Traits::kKVBlockBytes,
                         Traits::kQBlockBytes>(acc, x_desc, y_desc);
}

// A warp's fragment of a transposed score tile (rows: keys, columns: queries)
// re-packed into the A fragments of the k16 steps over the queries: step k
// holds n8 blocks 2k and 2k + 1.
template <typename Element, int kKSteps>
__device__ __forceinline__ void pack_a_fragments(uint32_t (&a)[kKSteps][4], const float (&frag)[1][2 * kKSteps][4]) {
#pragma unroll
    for (int k = 0; k < kKSteps; ++k) {
        a[k][0] = pack2<Element>(frag[0][2 * k][0], frag[0][2 * k][1]);
        a[k][1] = pack2<Element>(frag[0][2 * k][2], frag[0][2 * k][3]);
        a[k][2] = pack2<Element>(frag[0][2 * k + 1][0], frag[0][2 * k + 1][1]);
        a[k][3] = pack2<Element>(frag[0][2 * k + 1][2], frag[0][2 * k + 1][3]);
    }
}

// dS^T's A fragments (pack_a_fragments) of a warp whose first key in the tile
// is warp_key0 into shared memory for dQ: rows are the tile's keys, 128-byte
// rows of 64 queries per column block (kDsBlockBytes apart; the layout wgmma
// reads MN-major). A fragment register holds the pair of queries
// (2 * (lane % 4)) + {0, 1} of n8 block j, for key row lane / 4 (+ 8).
template <typename Traits, int kKSteps>
__device__ __forceinline__ void store_ds_fragments(const uint32_t (&a)[kKSteps][4], uint32_t ds_smem, int warp_key0,
                                                   int lane) {
#pragma unroll
    for (int k = 0; k < kKSteps; ++k) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int key = warp_key0 + lane / 4 + (r % 2) * 8;
            const int query = (2 * k + r / 2) * 8 + (lane % 4) * 2;
            const uint32_t block = ds_smem + (query / kSwizzleCols) * Traits::kDsBlockBytes;
            store_shared_b32(swizzled_address(block, key, (query % kSwizzleCols) * 2), a[k][r]);
        }
    }
}

// The same fragments stored transposed (BwdTraits::kDqSplit): dS with the
// step's queries as rows, 128-byte rows of 64 keys per column block (the
// K-major B of dQ^T = K^T dS), the warp's 16 keys in its warpgroup's block.
// One stmatrix.trans a k16 step: matrix r of the x4 is register r, the keys
// lane / 4 + 8 (r % 2) by the queries 8 (r / 2) + 2 (lane % 4) + {0, 1} of
// the step; stored transposed, its rows are those 8 queries, each 16 bytes of
// 8 keys. Lane 8r + i gives the address of row i of matrix r.
template <typename Traits, int kKSteps>
__device__ __forceinline__ void store_ds_rows_of_queries(const uint32_t (&a)[kKSteps][4], uint32_t ds_block,
                                                         int warp_key_in_block, int lane) {
    const int r = lane / 8;
    const int key_byte = (warp_key_in_block + (r % 2) * 8) * 2;
#pragma unroll
    for (int k = 0; k < kKSteps; ++k) {
        const int query = k * 16 + (r / 2) * 8 + lane % 8;
        stmatrix_x4_trans(swizzled_address(ds_block, query, key_byte), a[k][0], a[k][1], a[k][2], a[k][3]);
    }
}

// A warpgroup's dQ accumulator (rows: the step's queries, kNTiles n8 blocks of
// columns from col0) into the staged dQ tile: kDqBoxes boxes of kDqBoxCols fp32
// columns, each in the 128-byte swizzle (the box the tensor map reduces). A
// thread's rows are 16 * warp + lane / 4 (+ 8), its columns j * 8 + 2 * (lane %
// 4) + {0, 1}, each pair stored together.
template <typename Traits, int kNTiles>
__device__ __forceinline__ void store_dq_rows(const float (&dq)[1][kNTiles][4], uint32_t tile, int col0,
                                              int warp_in_group, int lane) {
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = warp_in_group * 16 + lane / 4 + half * 8;
            const int col = col0 + j * 8 + (lane % 4) * 2;
            const uint32_t box = tile + (col / Traits::kDqBoxCols) * Traits::kDqBoxBytes;
            store_shared_f32x2(swizzled_address(box, row, (col % Traits::kDqBoxCols) * 4), dq[0][j][2 * half],
                               dq[0][j][2 * half + 1]);
        }
    }
}

// apply_mask_transposed (mask.cuh) on one warp's S^T fragment [1][kNTiles][4],
// first key key0 and first query query0, written as compares of a single
// key-minus-query difference against immediates: the same visibility with a
// few live registers instead of a bound per column (the d64 tile's 128 score
// registers leave no room for those).
template <bool Is_local, int kNTiles>
__device__ __forceinline__ void mask_transposed(float (&s)[1][kNTiles][4], int key0, int query0, const Window& window,
                                                int lane) {
    const int key = key0 + lane / 4;                    // of elements e = 0, 1; e = 2, 3: key + 8
    const int diff = key - (query0 + (lane % 4) * 2);   // key - query of element [j = 0][e = 0]
    const int from_begin = diff - window.begin_offset;  // visible iff >= 0 ...
    const int to_end = window.end_offset - diff;        // ... and > 0 (with the element's offset)
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int offset = (e / 2) * 8 - j * 8 - e % 2;  // the element's key - query, minus diff
            const bool hidden = key + (e / 2) * 8 >= window.seqlen_k ||
                                (Is_local && (from_begin + offset < 0 || to_end - offset <= 0));
            if (hidden) s[0][j][e] = -INFINITY;
        }
    }
}

// Deterministic: this block's (key tile, KV head, batch) in the grid's order
// (schedule.h: deterministic_tile), worked out once a block by thread 0 and
// kept in shared memory (BwdSmem::tile): the divisions then cost the roles
// neither time nor registers.
__device__ __forceinline__ KeyTileOfPair deterministic_tile_of_block(int run) {
    const int64_t block = blockIdx.x + static_cast<int64_t>(gridDim.x) *
                                           (blockIdx.y + static_cast<int64_t>(gridDim.y) * blockIdx.z);
    return deterministic_tile(block, gridDim.x, gridDim.y, gridDim.z, run);
}

// The work of a block: its key tile, and the steps (query head, query tile)
// that the producer and the consumers walk in the same order. A
// variable-length batch's rows are packed: its tensor maps have one batch
// entry, the sequence's rows start at q_start / k_start, and the lengths are
// the sequence's own (seqused_q/k and leftpad_k applied: mask.cuh,
// varlen_sequence_of), as are the query tiles and the causal diagonal.
// The default grid takes the (KV head, batch) pairs in turn, each pair's key
// tiles first to last; under a mask (Is_local) KV head after KV head, within a
// head key tile after key tile, the first (the longest) first, and within a
// key tile the batches (schedule.h: backward_grid); without a mask the grid's
// last items run in parts (schedule.h: TailSplit), each part a share of the
// item's query tiles for each of its query heads. Deterministic: the grid
// takes each (KV head, batch) pair's key tiles from the last to the first,
// the order of dQ's adds (bwd_dq_writer), in runs of params.det_run tiles
// across the pairs (schedule.h: deterministic_tile).
template <typename Traits, bool Is_local, bool Is_deterministic>
struct BwdWork {
    int n_block, head_k, batch;
    Sequence seq;
    Window window;
    QueryTileRange query_tiles;  // the block's (in the tail, its part's)
    int m_tiles;  // query tiles per query head
    int steps;    // m_tiles for each of the group's query heads; 0: dK = dV = 0

    // Where the block's place is worked out once, by thread 0 (store_place),
    // and kept in shared memory (BwdSmem::tile) for the roles to read: the
    // deterministic grid's order, and the unmasked grid's items and parts
    // (divisions of the block index; derived by each role and held across
    // the main loop, they put the d128 softcap kernels into 40 B of spills
    // there, 8 B this way). Elsewhere the block index is read where needed.
    static constexpr bool kPlaceInSmem = Is_deterministic || (!Is_local && Traits::kPartValues > 0);
    // The grid's key tiles (bwd_grids.h: the longest sequence's).
    __device__ __forceinline__ static int key_tiles(const BwdParams& params) {
        return (params.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
    }
    __device__ __forceinline__ static void store_place(const BwdParams& params, const BwdSmem<Traits>& layout) {
        if constexpr (Is_deterministic) {
            const KeyTileOfPair tile = deterministic_tile_of_block(params.det_run);
            store_shared_u64x2(layout.tile(),
                               static_cast<uint32_t>(tile.tile) | (static_cast<uint64_t>(tile.head) << 32),
                               static_cast<uint64_t>(tile.batch));
        } else if constexpr (kPlaceInSmem) {
            const TileOfGrid tile = backward_grid_tile<false>(key_tiles(params), params.num_heads_k, params.tail_first,
                                                              params.tail_parts, static_cast<int>(blockIdx.x));
            store_shared_u64x2(layout.tile(),
                               static_cast<uint32_t>(tile.tile) | (static_cast<uint64_t>(tile.head) << 32),
                               static_cast<uint32_t>(tile.batch) | (static_cast<uint64_t>(tile.part) << 32) |
                                   (static_cast<uint64_t>(tile.parts) << 48));
        }
    }

    __device__ __forceinline__ BwdWork(const BwdParams& params, const BwdSmem<Traits>& layout) {
        int part = 0, parts = 1;
        if constexpr (kPlaceInSmem) {
            const uint64_t tile_and_head = load_shared_u64(layout.tile());
            n_block = static_cast<int>(tile_and_head & 0xffffffffu);
            head_k = static_cast<int>(tile_and_head >> 32);
            const uint64_t batch_and_part = load_shared_u64(layout.tile() + 8);
            batch = static_cast<int>(batch_and_part & 0xffffffffu);
            if constexpr (!Is_deterministic) {
                part = static_cast<int>((batch_and_part >> 32) & 0xffffu);
                parts = static_cast<int>(batch_and_part >> 48);
            }
        } else {
            const TileOfGrid block = backward_grid_tile<Is_local>(  // schedule.h
                key_tiles(params), params.num_heads_k, params.tail_first, params.tail_parts,
                static_cast<int>(blockIdx.x));
            n_block = block.tile;
            head_k = block.head;
            batch = block.batch;
            if constexpr (!Is_local) part = block.part, parts = block.parts;
        }
        seq = sequence_of<false>(params, batch);
        window = window_of(params, seq.seqlen_q, seq.seqlen_k);
        const int n0 = n_block * Traits::kBlockN;
        query_tiles = n0 < seq.seqlen_k ? query_tile_range<Traits::kBlockM, Traits::kBlockN>(n0, seq.seqlen_q, window)
                                        : QueryTileRange{0, 0};
        const StepsOfPart share = steps_of_part(query_tiles.m_end - query_tiles.m_begin, part, parts);
        query_tiles = {query_tiles.m_begin + share.begin, query_tiles.m_begin + share.end};
        m_tiles = query_tiles.m_end - query_tiles.m_begin;
        steps = params.heads_per_kv_head * m_tiles;
    }
    __device__ __forceinline__ int head_of(const BwdParams& params, int t) const {
        return head_k * params.heads_per_kv_head + t / m_tiles;
    }
    __device__ __forceinline__ int m0_of(int t) const { return (query_tiles.m_begin + t % m_tiles) * Traits::kBlockM; }
    // The block's place in the grid derived again after the main loop,
    // rather than held across it: without a mask (not deterministic) its
    // item and part, divisions of the block index; the other grids' places
    // read the block index (or shared memory) again at no cost.
    __device__ __forceinline__ TileOfGrid place_again(const BwdParams& params) const {
        if constexpr (!Is_local && !Is_deterministic) {
            return backward_grid_tile<false>(key_tiles(params), params.num_heads_k, params.tail_first,
                                             params.tail_parts,
                                             opaque(static_cast<int>(blockIdx.x)));  // not CSE'd with the first
        } else {
            return {n_block, head_k, batch, 0, 1, 0};
        }
    }
    // The batch coordinate in the tensor maps of q, dout and dq_accum (q_batch)
    // and of k and v (k_batch): 0 for packed rows. These and the tests below
    // read params where used (a constant load), holding no register across
    // the main loop.
    __device__ __forceinline__ int q_batch(const BwdParams& params) const {
        return params.cu_seqlens_q == nullptr ? batch : 0;
    }
    __device__ __forceinline__ int k_batch(const BwdParams& params) const {
        return params.cu_seqlens_k == nullptr ? batch : 0;
    }
    // Rows past a packed sequence are the next sequence's or rows no sequence
    // uses (past seqused_q/k, past cu_seqlens[-1]), which may hold anything
    // (NaN, Inf), where the padded layout has the tensor map's zeros. A P^T or
    // dS^T of 0 does not cancel them in dV += P^T dO, dK += dS^T Q or dQ = dS K
    // (0 * NaN is NaN), so a tile that reaches past its packed sequence has
    // those rows zeroed in shared memory before any wgmma reads it: step t's
    // Q and dO tiles (by the producer), the block's K and V tiles (by the
    // consumers). Their S^T and dP^T are then 0, P^T is 0 (keys: masked;
    // queries: lse_log2 = +inf), dS^T = P^T (dP^T - D) is 0, and so are the
    // rows of the dQ tile past the sequence, which the bulk reduce adds into
    // the next sequence's rows of dq_accum (an add of zeros: harmless).
    __device__ __forceinline__ bool zeroes_query_rows(const BwdParams& params, int t) const {
        return params.cu_seqlens_q != nullptr && m0_of(t) + Traits::kBlockM > seq.seqlen_q;
    }
    __device__ __forceinline__ bool zeroes_key_rows(const BwdParams& params) const {
        return params.cu_seqlens_k != nullptr && (n_block + 1) * Traits::kBlockN > seq.seqlen_k;
    }
};

// The consumers' named barrier of the key rows zeroed below (0 is
// __syncthreads'; the consumers' own take 1-4 and 6-8).
constexpr int kKeyRowsBarrier = 5;

// Every consumer thread of the block, before its first wgmma: the block's K
// and V tiles have landed and, where they reach past a packed sequence
// (BwdWork::zeroes_key_rows, uniform across the consumers), their rows there
// are zeroed by the consumers together.
template <typename Traits, typename Work>
__device__ __forceinline__ void wait_key_tiles(const BwdParams& params, const BwdSmem<Traits>& layout,
                                               const Work& work, int n0) {
    constexpr int kConsumerThreads = Traits::kConsumerWarpgroups * 128;
    mbarrier_wait(layout.kv_full(), 0);
    if (work.zeroes_key_rows(params)) {
        zero_rows<Traits, Traits::kBlockN>(layout.k(), layout.v(), Traits::kKVBlockBytes, work.seq.seqlen_k - n0,
                                           threadIdx.x - 128, kConsumerThreads);
        fence_proxy_async_shared();  // the zeros are read by wgmma (async proxy) after the barrier
        named_barrier_sync_unaligned(kKeyRowsBarrier, kConsumerThreads);
    }
}

// Whether dQ's reduce box b (kDqBoxCols columns from b * kDqBoxCols) is
// issued: the copy engine adds nothing outside dq_accum (columns past the
// head dim, rows past the sequence), and a box wholly past the call's head
// dim (d65..96 on the d128 kernel) is not issued at all. A box that starts
// below kMinHeadDim holds a column of every call: no test in the code (b is a
// constant of the unrolled loop).
template <typename Traits>
__device__ __forceinline__ bool dq_box_issued(int b, int head_dim) {
    return b * Traits::kDqBoxCols < Traits::kMinHeadDim || b * Traits::kDqBoxCols < head_dim;
}

// Adds the staged dQ boxes [first, end) (those dq_box_issued takes) of the
// query rows from `row` (dq_accum's row, of sequence `batch`, head `head`) to
// dq_accum with bulk tensor reduce-adds from `staged` (the dQ stage), and
// commits them as one bulk group; the caller waits for the group's reads of
// the stage (bulk_wait_group_read) before the stage is written again.
template <typename Traits>
__device__ __forceinline__ void reduce_dq_boxes(const CUtensorMap* map, uint32_t staged, int first, int end,
                                                int head_dim, int row, int head, int batch) {
#pragma unroll
    for (int b = first; b < end; ++b) {
        if (!dq_box_issued<Traits>(b, head_dim)) break;
        tma_reduce_add_4d(map, staged + b * Traits::kDqBoxBytes, b * Traits::kDqBoxCols, row, head, batch);
    }
    bulk_commit_group();
}

// Named barriers of the dQ hand-off between the threads that stage a tile and
// the dQ writer warp that adds it (0 is __syncthreads', 1, 2, 5 and 6 are
// bwd_consumer's and bwd_split_consumer's), two pairs: dq_full_barrier(i),
// the tile is staged; dq_empty_barrier(i), its writer's add has read it (the
// tile may be restaged). Deterministic (bwd_dq_writer): the owner's 128
// threads (split kernel: both consumer warpgroups' 256, each its own columns)
// and two writers, pair i = step t's parity: a writer's arrival can never
// complete the other writer's step. The d128 80-query kernel's default mode
// (BwdTraits::kDqSplit, bwd_dq_half_writer): consumer warpgroup i's 128
// threads and writer i, pair i, for its half of the head dim.
__device__ __forceinline__ int dq_full_barrier(int t) { return t % 2 == 0 ? 3 : 7; }
__device__ __forceinline__ int dq_empty_barrier(int t) { return t % 2 == 0 ? 4 : 8; }
template <typename Traits>
constexpr int dq_handoff_threads() {
    return (Traits::kSplit ? Traits::kConsumerWarpgroups : 1) * 128 + 32;
}

// The deterministic backward's dQ writers: two warps, `writer` 0 taking the
// block's even steps and 1 its odd ones, lane 0 issuing. A writer's step is a
// chain: wait for the tile's turn, add the staged tile, release the stage
// once read, wait for the add to complete, count it. With one writer the
// chain of one step ran before the next step's could start, and the
// consumers, which restage the tile only once the writer has read it, waited
// for it (round 23: deterministic d192 1.15-1.4x the default mode's time);
// with two, one writer's wait for completion and count overlap the other's
// wait for its turn and its add. The adds into one query tile still come in
// one fixed order (the steps of a block are distinct tiles).
// The key tiles that see a query tile add their dQ into it from the last to the
// first (BwdWork: the grid's order): under a causal mask a larger key tile
// reaches each of its query tiles after fewer steps (its first query tile
// comes later), so that this order keeps blocks that run at the same pace
// from waiting for each other; without a mask every key tile reaches a query
// tile at the same step, and any order chains them alike: a run of the grid
// (BwdWork) bounds how many of them start together.
// A block's turn is its rank in that order among the key tiles that see the
// query tile (mask.cuh: key_tile_range, which names exactly the key tiles
// whose query_tile_range holds it): the count its semaphore must reach.
//
// Memory ordering, from one block's add to the next one's: the add completes
// (bulk wait_group without .read: its writes are done; the PTX ISA follows the
// completion of a bulk copy with an implicit generic-async proxy fence, so
// they are visible to the issuing thread) before the release-add on the
// semaphore; the next block's acquire-load that reads the count makes them
// visible to its issuing thread, whose async-proxy fence orders them before its
// own bulk add. The last key tile resets the semaphore to zero instead (no
// block waits on it any more; the next call is ordered after this kernel).
//
// No deadlock: a block waits only for blocks of its (KV head, batch) with
// larger key tiles, which have smaller linear block indices (schedule.h:
// deterministic_tile; tests/test_build.py checks it). CUDA dispatches the blocks
// of a grid in increasing linear index in practice (it does not promise it;
// FlashAttention-3's deterministic backward relies on the same), so every
// block waited for is running or done; the block of the last key tile that
// sees a query tile waits for none, and by induction every wait ends.
template <typename Traits, bool Is_local>
__device__ __forceinline__ void bwd_dq_writer(const BwdParams& params, const BwdSmem<Traits>& layout,
                                              const CUtensorMap* tma_dq_accum, int writer) {
    constexpr int kBlockM = Traits::kBlockM;
    const BwdWork<Traits, Is_local, /*Is_deterministic=*/true> work(params, layout);
    if (work.steps == 0) return;
    const bool issuer = threadIdx.x % 32 == 0;
    const int m_blocks = (params.seqlen_q + kBlockM - 1) / kBlockM;  // the semaphores' last dimension
    const int first_head = work.head_of(params, 0);
    const int end_head = first_head + params.heads_per_kv_head;
    // The steps in the consumers' order (BwdWork): query heads, then query
    // tiles; this writer's every other one.
    int t = 0;
    for (int head = first_head; head < end_head; ++head) {
        int* semaphores = params.dq_semaphore + (static_cast<int64_t>(work.batch) * params.num_heads + head) * m_blocks;
        for (int m_block = work.query_tiles.m_begin; m_block < work.query_tiles.m_end; ++m_block, ++t) {
            if (t % 2 != writer) continue;
            const KeyTileRange adders =
                key_tile_range<kBlockM, Traits::kBlockN>(m_block * kBlockM, work.seq.seqlen_q, work.window);
            // The turn first, while the owner still computes the tile.
            if (issuer) {
                wait_until_equal(semaphores + m_block, adders.n_end - 1 - work.n_block);
                fence_proxy_async_global();
            }
            named_barrier_sync(dq_full_barrier(t), dq_handoff_threads<Traits>());
            if (issuer) {
                reduce_dq_boxes<Traits>(tma_dq_accum, layout.dq(), 0, Traits::kDqBoxes, params.head_dim,
                                        work.seq.q_start + m_block * kBlockM, head, work.q_batch(params));
                bulk_wait_group_read<0>();
            }
            // No arrival after the last step: the owner stages no tile after it.
            if (t + 1 < work.steps) named_barrier_arrive(dq_empty_barrier(t), dq_handoff_threads<Traits>());
            if (issuer) {
                bulk_wait_group<0>();
                if (work.n_block == adders.n_begin) {
                    store_relaxed(semaphores + m_block, 0);
                } else {
                    red_release_add(semaphores + m_block, 1);
                }
            }
        }
    }
}

// The d128 80-query kernel's dQ writers (BwdTraits::kDqSplit, default mode):
// writer `half` adds consumer warpgroup `half`'s columns of each step's dQ,
// lane 0 issuing, and hands the staging area back once the add has read it.
// The warpgroup only arrives on its pair's full barrier after staging, and
// waits on the empty one before it stages the next step (a step later: the
// read is long done by then). In place of the warpgroup's own issue, which
// held all its 128 threads at a barrier until the last store had landed and
// put the issuing thread's waits in the step (NOTES.md, twenty-fifth session).
template <typename Traits, bool Is_local>
__device__ __forceinline__ void bwd_dq_half_writer(const BwdParams& params, const BwdSmem<Traits>& layout,
                                                   const CUtensorMap* tma_dq_accum, int half) {
    static_assert(Traits::kDqSplit && Traits::kDqBoxesPerWarpgroup * Traits::kConsumerWarpgroups == Traits::kDqBoxes,
                  "each consumer warpgroup stages its own boxes of the step's dQ tile");
    const BwdWork<Traits, Is_local, /*Is_deterministic=*/false> work(params, layout);
    if (work.steps == 0) return;
    const bool issuer = threadIdx.x % 32 == 0;
    const int first_box = half * Traits::kDqBoxesPerWarpgroup;
    for (int t = 0; t < work.steps; ++t) {
        named_barrier_sync(dq_full_barrier(half), dq_handoff_threads<Traits>());
        if (issuer) {
            reduce_dq_boxes<Traits>(tma_dq_accum, layout.dq(), first_box, first_box + Traits::kDqBoxesPerWarpgroup,
                                    params.head_dim, work.seq.q_start + work.m0_of(t), work.head_of(params, t),
                                    work.q_batch(params));
            bulk_wait_group_read<0>();
        }
        // No arrival after the last step: the warpgroup stages no tile after it.
        if (t + 1 < work.steps) named_barrier_arrive(dq_empty_barrier(half), dq_handoff_threads<Traits>());
    }
    // The last adds are complete before the block (and its shared memory) is gone.
    if (issuer) bulk_wait_group<0>();
}

// A consumer warpgroup's whole work: its 64 keys' S^T, dP^T, dV and dK over
// every step and, for a warpgroup that computes dQ (kOwnsDq: the dQ owner, or
// both under BwdTraits::kDqSplit), each step's whole dQ = dS K from both
// warpgroups' dS^T (split: dQ^T = K^T dS for its half of the head dim), which
// it stages in fp32 and adds into dq_accum by the copy engine (deterministic:
// hands to the dQ writer). Its place among the consumers (kConsumer: its keys
// in the block's tile, its half of dQ) is a compile-time constant: the
// descriptors and addresses derived from it are then warp-uniform, and can
// live in uniform registers.
template <typename Traits, bool Is_local, bool Has_softcap, bool Is_deterministic, int kConsumer>
__device__ __forceinline__ void bwd_consumer(const BwdParams& params, const BwdSmem<Traits>& layout,
                                             const CUtensorMap* tma_dq_accum) {
    using Element = typename Traits::Element;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int consumer = kConsumer;
    constexpr bool kOwnsDq = Traits::kDqSplit || kConsumer == Traits::kDqOwner;
    static_assert(!(Traits::kDqSplit && Is_deterministic), "one dQ tile a step for the dQ writer (BwdTraitsOf)");

    const BwdWork<Traits, Is_local, Is_deterministic> work(params, layout);
    const int n0 = work.n_block * kBlockN;
    const int thread_in_group = threadIdx.x % 128;
    const int lane = threadIdx.x % 32;
    const int warp_in_group = thread_in_group / 32;
    const int warp_key0 = consumer * Traits::kWarpgroupKeys + warp_in_group * 16;  // this warp's first key in the tile
    // Named barriers: 0 is __syncthreads'. kDsBarrier: both consumer
    // warpgroups' dS^T are in shared memory (the owner's dQ reads both; the
    // other warpgroup's next dS^T store waits for the owner's dQ of two steps
    // ago through it). kDqBarrier: the owner's dQ tile is staged for its bulk
    // reduce (default mode; deterministic, and split, the dQ writers' hand-off,
    // dq_full_barrier and dq_empty_barrier, instead); 5 is wait_key_tiles'.
    constexpr int kDsBarrier = 1;
    constexpr int kDqBarrier = consumer == 0 ? 2 : 6;
    constexpr int kConsumerThreads = Traits::kConsumerWarpgroups * 128;
    // Where dS^T is completed: the head of the gradients, or the end of the
    // scores (kernel_traits.h: kDetDsInScores; kDqSplit without softcap).
    constexpr bool kDsInScores = (Is_deterministic && Traits::kDetDsInScores) || (Traits::kDqSplit && !Has_softcap);

    float dk[1][Traits::kNTilesD][4];
    float dv[1][Traits::kNTilesD][4];
#pragma unroll
    for (int j = 0; j < Traits::kNTilesD; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) dk[0][j][e] = dv[0][j][e] = 0.f;

    // Descriptors that do not move with the stage. S^T and dP^T: this
    // warpgroup's 64 rows of K and V (K-major). dQ: all of K read MN-major
    // (keys are the K dimension), its 64-column blocks kKVBlockBytes apart.
    const uint64_t k_desc = smem_descriptor_sw128(layout.k() + consumer * Traits::kWarpgroupKeys * kSwizzleBytes,
                                                  kUnusedLeadingBytes, kSwizzleAtomBytes);
    const uint64_t v_desc = smem_descriptor_sw128(layout.v() + consumer * Traits::kWarpgroupKeys * kSwizzleBytes,
                                                  kUnusedLeadingBytes, kSwizzleAtomBytes);
    // Split: this warpgroup's 64-column block of K, the A of dQ^T = K^T dS.
    const uint64_t k_mn_desc = smem_descriptor_sw128(
        layout.k() + (Traits::kDqSplit ? consumer * Traits::kKVBlockBytes : 0), Traits::kKVBlockBytes,
        kSwizzleAtomBytes);

    // The steps of one query tile, named.
    // S^T = K Q^T or dP^T = V dO^T for this warpgroup's 64 keys, over the head dim.
    auto issue_scores = [&](float (&acc)[1][Traits::kNTilesS][4], uint64_t x_desc, uint32_t y_tile) {
        issue_transposed_scores<Traits, Traits::kKStepsD>(acc, x_desc, y_tile);
    };
    // P^T or dS^T re-packed into A fragments (pack_a_fragments).
    auto pack = [&](uint32_t (&a)[Traits::kKStepsM][4], const float (&frag)[1][Traits::kNTilesS][4]) {
        pack_a_fragments<Element>(a, frag);
    };
    // dS^T into shared memory for dQ (store_ds_fragments); split, dS with
    // queries as rows into this warpgroup's block (store_ds_rows_of_queries).
    auto store_ds = [&](const uint32_t (&a)[Traits::kKStepsM][4], uint32_t ds_smem) {
        if constexpr (Traits::kDqSplit) {
            store_ds_rows_of_queries<Traits>(a, ds_smem + consumer * Traits::kDsBlockBytes, warp_in_group * 16, lane);
        } else {
            store_ds_fragments<Traits>(a, ds_smem, warp_key0, lane);
        }
    };
    // The step's dQ, one wgmma group over the block's 128 keys, both operands
    // MN-major: dQ = dS K (A: dS^T read transposed, B: K read transposed) or,
    // with more queries than head-dim columns, dQ^T = K^T dS^T (A: K, B: dS^T),
    // so that N is 128 either way. Split: dQ^T = K^T dS for this warpgroup's
    // 64 columns of the head dim (A: its block of K read transposed, B: dS
    // K-major, 32 bytes into its 128-byte rows a k16 step, a column block of
    // keys every 4), N = kBlockM.
    auto issue_dq = [&](float (&dq)[1][Traits::kNTilesDq][4], uint32_t ds_smem) {
        if constexpr (Traits::kDqSplit) {
            const uint64_t ds_desc = smem_descriptor_sw128(ds_smem, kUnusedLeadingBytes, kSwizzleAtomBytes);
            const uint64_t k_mn = recompute_per_use(k_mn_desc);
            wgmma_fence();
#pragma unroll
            for (int k = 0; k < Traits::kKStepsN; ++k) {
                const uint32_t offset_ds = (k / 4) * Traits::kDsBlockBytes + (k % 4) * 32;
                Wgmma<Traits::kDqN>::template ss<Element, 1, 0>(flat(dq), advance_descriptor(k_mn, k * 16 * kSwizzleBytes),
                                                               advance_descriptor(ds_desc, offset_ds),
                                                               /*scale_d=*/k > 0);
            }
            wgmma_commit();
            return;
        }
        const uint64_t ds_mn_desc = smem_descriptor_sw128(ds_smem, Traits::kDsBlockBytes, kSwizzleAtomBytes);
        const uint64_t k_mn = recompute_per_use(k_mn_desc);
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < Traits::kKStepsN; ++k) {
            const uint64_t ds_k = advance_descriptor(ds_mn_desc, k * 16 * kSwizzleBytes);
            const uint64_t k_k = advance_descriptor(k_mn, k * 16 * kSwizzleBytes);
            const uint64_t a_k = Traits::kDqTransposed ? k_k : ds_k;
            const uint64_t b_k = Traits::kDqTransposed ? ds_k : k_k;
            Wgmma<Traits::kDqN>::template ss<Element, 1, 1>(flat(dq), a_k, b_k, /*scale_d=*/k > 0);
        }
        wgmma_commit();
    };
    // The dQ tile into shared memory as the step's [kBlockM, kTileCols] rows
    // (store_dq_rows); for dQ^T the other way round, each element alone (its
    // pair lies in two rows of the tile).
    auto store_dq = [&](const float (&dq)[1][Traits::kNTilesDq][4]) {
        const uint32_t tile = layout.dq();
        if constexpr (Traits::kDqSplit) {
            // Row (query) j * 8 + 2 (lane % 4) + e of the boxes of column
            // (head dim) consumer * 64 + 16 warp + lane / 4 + 8 half: the swizzle
            // phase does not move with j, so that four addresses, computed here
            // from an opaque thread index (not held across the main loop), serve
            // all 40 stores with immediate offsets of 8 rows.
            const int thread = opaque(thread_in_group);
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int col = consumer * 64 + (thread / 32) * 16 + (thread % 32) / 4 + half * 8;
                const uint32_t box = tile + (col / Traits::kDqBoxCols) * Traits::kDqBoxBytes;
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const uint32_t base = swizzled_address(box, (thread % 4) * 2 + e, (col % Traits::kDqBoxCols) * 4);
#pragma unroll
                    for (int j = 0; j < Traits::kNTilesDq; ++j) {
                        store_shared_f32(base + j * 8 * kSwizzleBytes, dq[0][j][2 * half + e]);
                    }
                }
            }
        } else if constexpr (Traits::kDqTransposed) {
#pragma unroll
            for (int j = 0; j < Traits::kNTilesDq; ++j) {
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const int acc_row = warp_in_group * 16 + lane / 4 + half * 8;
                    const int acc_col = j * 8 + (lane % 4) * 2;
                    const uint32_t box = tile + (acc_row / Traits::kDqBoxCols) * Traits::kDqBoxBytes;
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        store_shared_f32(swizzled_address(box, acc_col + e, (acc_row % Traits::kDqBoxCols) * 4),
                                         dq[0][j][2 * half + e]);
                    }
                }
            }
        } else {
            store_dq_rows<Traits>(dq, tile, 0, warp_in_group, lane);
        }
    };
    // Softcap: the scores in the score unit, tanh(q.k * softcap_inner_scale),
    // as the forward caps them (extras.cuh: apply_score_extras).
    auto cap_scores = [&](float (&s)[1][Traits::kNTilesS][4]) {
#pragma unroll
        for (int j = 0; j < Traits::kNTilesS; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[0][j][e] = tanhf(s[0][j][e] * params.softcap_inner_scale);
    };
    // Softcap, once dP^T is complete: dP^T - D times the cap's 1 - tanh^2
    // (sm80's chain factor, taken before P^T rather than after it), and the
    // capped scores turned into P^T's exponents, s * scale_log2 - lse_log2,
    // both in place: a score's exponential and its factor are never live
    // together, nor is a second fragment (kBlockM / 2 registers a thread).
    // gradients() finishes with p = exp2 and dS^T *= p. A masked score is
    // -inf: its exponent -inf (p = 0) and its factor, -inf unclamped (0 * -inf
    // = NaN), 0; every other |tanh| <= 1 leaves the clamp exact.
    auto softcap_chain = [&](int stage, float (&s)[1][Traits::kNTilesS][4], float (&dp)[1][Traits::kNTilesS][4]) {
        const uint32_t dsum_row = layout.dsum(stage) + 8 * (lane % 4);
        const uint32_t lse_row = layout.lse_log2(stage) + 8 * (lane % 4);
#pragma unroll
        for (int j = 0; j < Traits::kNTilesS; ++j) {
            const float2 d = load_shared_f32x2(dsum_row + 32 * j);
            const float2 lse = load_shared_f32x2(lse_row + 32 * j);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float capped = s[0][j][e];
                dp[0][j][e] = (dp[0][j][e] - (e % 2 ? d.y : d.x)) * fmaxf(fmaf(-capped, capped, 1.f), 0.f);
                s[0][j][e] = fmaf(capped, params.softmax_scale_log2, -(e % 2 ? lse.y : lse.x));
            }
        }
    };
    // dS^T = P^T * (dP^T - D), in place of dP^T, and P^T in place of S^T
    // (softcap: from the exponents softcap_chain left in S^T, and dS^T = P^T
    // times what it left in dP^T).
    auto finish_ds = [&](int stage, float (&s)[1][Traits::kNTilesS][4], float (&dp)[1][Traits::kNTilesS][4]) {
        if constexpr (Has_softcap) {
#pragma unroll
            for (int i = 0; i < Traits::kNTilesS * 4; ++i) {
                flat(s)[i] = exp2_approx(flat(s)[i]);
                flat(dp)[i] *= flat(s)[i];
            }
        } else {
            const uint32_t dsum_row = layout.dsum(stage) + 8 * (lane % 4);
#pragma unroll
            for (int j = 0; j < Traits::kNTilesS; ++j) {
                const float2 d = load_shared_f32x2(dsum_row + 32 * j);
#pragma unroll
                for (int e = 0; e < 4; ++e) dp[0][j][e] = s[0][j][e] * (dp[0][j][e] - (e % 2 ? d.y : d.x));
            }
        }
    };
    // Every thread arrives for its own reads of the stage (the row stats by
    // plain loads; its warp's wgmma reads are complete by then). One arrival
    // per warp after __syncwarp orders the lanes' reads as well under the PTX
    // memory model, but compute-sanitizer's racecheck does not follow that
    // chain and reports each later store of the producer as a hazard (NOTES.md).
    auto release = [&](uint32_t empty) { mbarrier_arrive(empty); };

    // Step t's P^T and dP^T, entered with its S^T and dP^T in flight (the only
    // wgmma groups pending) and left with both complete, no wgmma pending
    // (kDsInScores: dS^T complete in place of dP^T).
    auto scores = [&](int t, float (&s)[1][Traits::kNTilesS][4], float (&dp)[1][Traits::kNTilesS][4]) {
        const StageOf<Traits> st(t);
        const int m0 = work.m0_of(t);
        // P^T = exp2(S^T * scale_log2 - lse_log2) while dP^T runs. Masked only
        // where some query of the tile misses some key (the causal diagonal,
        // window edges, the sequence's last key tile): the mask's keys and the
        // keys past the sequence (whose zero rows would score 0, and exp2(0 -
        // lse) can overflow 16 bits) are hidden; queries past it have lse_log2
        // = +inf, so p = 0. The branch holds element-wise work on completed
        // registers only, no wgmma issue or wait. A thread's columns are the
        // queries j * 8 + 2 * (lane % 4) + {0, 1}. Softcap: the scores are
        // capped before the mask (as in the forward) and left capped while
        // dP^T runs (softcap_chain takes P^T from them later, with dS^T's
        // chain factor).
        wgmma_wait<1>();
        pin_registers(flat(s));
        if constexpr (Has_softcap) cap_scores(s);
        mbarrier_wait(layout.stats_full(st.stage), st.phase);
        if (!tile_is_full<kBlockM, kBlockN>(m0, n0, work.seq.seqlen_q, work.window)) {
            mask_transposed<Is_local>(s, n0 + warp_key0, m0, work.window, lane);
        }
        if constexpr (!Has_softcap) {
            const uint32_t lse_row = layout.lse_log2(st.stage) + 8 * (lane % 4);
#pragma unroll
            for (int j = 0; j < Traits::kNTilesS; ++j) {
                const float2 lse = load_shared_f32x2(lse_row + 32 * j);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    s[0][j][e] = exp2_approx(fmaf(s[0][j][e], params.softmax_scale_log2, -(e % 2 ? lse.y : lse.x)));
                }
            }
        }
        wgmma_wait<0>();
        pin_registers(flat(dp));
        if constexpr (Has_softcap && Traits::kSoftcapChainInScores) softcap_chain(st.stage, s, dp);
        if constexpr (kDsInScores) finish_ds(st.stage, s, dp);
    };

    // dK += dS^T Q for step t (queries are the K dimension: Q read MN-major).
    auto issue_dk = [&](int t, uint32_t (&ds_frag)[Traits::kKStepsM][4]) {
        const uint64_t q_mn_desc = recompute_per_use(
            smem_descriptor_sw128(layout.q(StageOf<Traits>(t).stage), Traits::kQBlockBytes, kSwizzleAtomBytes));
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < Traits::kKStepsM; ++k) {
            Wgmma<Traits::kTileCols>::template rs<Element>(
                flat(dk), ds_frag[k], advance_descriptor(q_mn_desc, k * 16 * kSwizzleBytes), /*scale_d=*/1);
        }
        wgmma_commit();
    };

    // Step t from its P^T and dP^T up to {dV, dK} and the dS barrier, entered
    // with no wgmma pending and left with {dV, dK} in flight (the owner issues
    // dQ behind them; split: dV alone, dK follows dQ^T). The A fragments are
    // the caller's: they must stay unchanged until {dV, dK} completes.
    auto gradients = [&](int t, float (&s)[1][Traits::kNTilesS][4], float (&dp)[1][Traits::kNTilesS][4],
                         uint32_t (&p_frag)[Traits::kKStepsM][4], uint32_t (&ds_frag)[Traits::kKStepsM][4]) {
        const StageOf<Traits> st(t);
        const uint32_t ds_smem = layout.ds(t % Traits::kDsBuffers);
        // dS^T (finish_ds, unless the scores completed it: kDsInScores); then
        // P^T and dS^T are re-packed for dV and dK (P^T only now: its fp32
        // values and its fragments are not live together).
        if constexpr (Has_softcap && !Traits::kSoftcapChainInScores) softcap_chain(st.stage, s, dp);
        if constexpr (!kDsInScores) finish_ds(st.stage, s, dp);
        pack(p_frag, s);
        pack(ds_frag, dp);

        // dV += P^T dO, then dK += dS^T Q (queries are the K dimension: dO and
        // Q read MN-major, 16 rows per k16 step). dS^T goes to shared memory
        // while dV runs, before dK is issued: the registers of an A fragment
        // may not be read while a wgmma that takes them is in flight.
        const uint64_t do_mn_desc = recompute_per_use(
            smem_descriptor_sw128(layout.dout(st.stage), Traits::kQBlockBytes, kSwizzleAtomBytes));
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < Traits::kKStepsM; ++k) {
            Wgmma<Traits::kTileCols>::template rs<Element>(
                flat(dv), p_frag[k], advance_descriptor(do_mn_desc, k * 16 * kSwizzleBytes), /*scale_d=*/1);
        }
        // Split: dV is a group of its own, so that P^T's fragments are free
        // (dV complete) before dQ^T's accumulators are taken: dK, dV, dS^T's
        // fragments and dQ^T are 188 registers, with P^T's too 208, which
        // leaves ptxas too few of the 240 to keep the wgmma asynchronous (C7512).
        // Committed before the issuer's bulk wait below: behind that branch,
        // ptxas closes the group with an empty wgmma of its own (an HGMMA
        // 64x8x16 on RZ and a warpgroup.arrive a step, C7519).
        if constexpr (Traits::kDqSplit) wgmma_commit();
        // The owner's previous dQ reduce has read the staged tile (its issuer
        // waits before the barrier that all the warpgroup passes before
        // restaging it). dS^T is written where the dQ GEMM of two steps ago
        // read: the owner waited for it before the previous step's barrier.
        // Deterministic: the owner issues no bulk copy, so this wait returns
        // at once, and reduce_dq waits for the dQ writer's read instead; the
        // wait stays because ptxas, without this branch, spills the d64
        // owner (20 bytes).
        if constexpr (kOwnsDq && !Traits::kDqSplit) {  // split: the dQ writer's hand-off (reduce_dq)
            if (thread_in_group == 0) bulk_wait_group_read<0>();
        }
        store_ds(ds_frag, ds_smem);
        if constexpr (!Traits::kDqSplit) issue_dk(t, ds_frag);  // split: after dQ^T (step_gradients)
        fence_proxy_async_shared();  // the stores are read by wgmma (async proxy) after the barrier
        named_barrier_sync_unaligned(kDsBarrier, kConsumerThreads);
    };

    // dV and dK of step t are complete: the stage's Q and dO (and its row
    // stats, read above) are free, and so are the fragments.
    auto gradients_done = [&](int t, uint32_t (&p_frag)[Traits::kKStepsM][4], uint32_t (&ds_frag)[Traits::kKStepsM][4]) {
        pin_registers(flat(dv));
        pin_registers(flat(dk));
        pin_registers(p_frag);
        pin_registers(ds_frag);
        release(layout.empty(StageOf<Traits>(t).stage));
    };

    // Step t's dQ into dq_accum, once its GEMM is complete: the owner stages
    // the tile (store_dq) and one thread adds it by the copy engine
    // (deterministic: the dQ writer adds it, once the previous tile is read).
    // Split: this warpgroup's half, added by its dQ writer (bwd_dq_half_writer).
    auto reduce_dq = [&](int t, float (&dq)[1][Traits::kNTilesDq][4]) {
        pin_registers(flat(dq));
        if constexpr (Is_deterministic) {
            if (t > 0) named_barrier_sync(dq_empty_barrier(t - 1), dq_handoff_threads<Traits>());
        } else if constexpr (Traits::kDqSplit) {
            if (t > 0) named_barrier_sync(dq_empty_barrier(consumer), dq_handoff_threads<Traits>());
        }
        store_dq(dq);
        fence_proxy_async_shared();  // the stores are read by the bulk reduce (async proxy)
        if constexpr (Is_deterministic) {
            named_barrier_arrive(dq_full_barrier(t), dq_handoff_threads<Traits>());
            return;
        } else if constexpr (Traits::kDqSplit) {
            named_barrier_arrive(dq_full_barrier(consumer), dq_handoff_threads<Traits>());
            return;
        }
        named_barrier_sync(kDqBarrier, 128);
        if (thread_in_group == 0) {
            reduce_dq_boxes<Traits>(tma_dq_accum, layout.dq(), 0, Traits::kDqBoxesPerWarpgroup, params.head_dim,
                                    work.seq.q_start + work.m0_of(t), work.head_of(params, t), work.q_batch(params));
        }
    };

    // Step t's Q and dO tiles are in shared memory: the copies have landed
    // and, for packed rows, the producer's zeros past the sequence too
    // (BwdWork), which it stores before its arrival on stats_full. Every
    // packed step waits for stats_full, not just those it zeroes: the test
    // stays a constant's (no division by m_tiles before the issue), and the
    // row stats are stored a stage ahead.
    auto wait_tiles = [&](int t) {
        const StageOf<Traits> st(t);
        mbarrier_wait(layout.full(st.stage), st.phase);
        if (params.cu_seqlens_q != nullptr) mbarrier_wait(layout.stats_full(st.stage), st.phase);
    };

    // Software pipeline across steps, per warpgroup: the owner's dQ GEMM goes
    // in behind {dV, dK}, so that its tensor cores have queued work while it
    // waits for them and releases the stage; the next step's S^T and dP^T go in
    // once the registers of this step's are free: after {dV, dK} (the other
    // warpgroup), after dQ is staged (the owner; split: both, after dQ^T is
    // staged and dK complete). Earlier, dK, dV, the A fragments or dQ, and S^T
    // do not fit together (ptxas serialises the wgmma at d128: C7512; spills
    // at d64). The two warpgroups overlap each other instead: while the owner
    // runs dQ and stages it, the other computes the next step's scores. The
    // loop turns where nothing is in flight (the next step's P^T and dP^T
    // complete): with wgmma groups pending across the back edge, ptxas
    // serialises them (C7514). The first step's scores and the last step's
    // gradients (no next scores) are peeled, so every wgmma issued meets its
    // wait on every path.
    if (work.steps > 0) {
        float s[1][Traits::kNTilesS][4];   // S^T, then P^T
        float dp[1][Traits::kNTilesS][4];  // dP^T, then dS^T
        float dq[1][Traits::kNTilesDq][4];  // the owner's dQ (or dQ^T); unused by the other
        wait_key_tiles(params, layout, work, n0);
        wait_tiles(0);
        issue_scores(s, k_desc, layout.q(0));
        issue_scores(dp, v_desc, layout.dout(0));
        scores(0, s, dp);
        // Step t from P^T and dP^T to {dV, dK} complete (the stage released)
        // and, for the owner, its dQ GEMM in flight. Split: dQ^T goes in as
        // soon as dV is complete (P^T's fragments free: dK, dV, dS^T's
        // fragments and dQ^T are 188 registers), dK behind it, and dQ^T is
        // staged while dK runs (an RS GEMM, which reads half the shared memory
        // an SS one does: the stores wait less); then both are complete.
        auto step_gradients = [&](int t) {
            uint32_t p_frag[Traits::kKStepsM][4];
            uint32_t ds_frag[Traits::kKStepsM][4];
            gradients(t, s, dp, p_frag, ds_frag);
            if constexpr (Traits::kDqSplit) {
                wgmma_wait<0>();  // dV
                pin_registers(p_frag);
                issue_dq(dq, layout.ds(t % Traits::kDsBuffers));
                issue_dk(t, ds_frag);
                wgmma_wait<1>();  // dQ^T; dK runs on
                reduce_dq(t, dq);
                wgmma_wait<0>();  // dK
            } else if constexpr (kOwnsDq) {
                issue_dq(dq, layout.ds(t % Traits::kDsBuffers));
                wgmma_wait<1>();  // {dV, dK}; dQ runs on
            } else {
                wgmma_wait<0>();
            }
            gradients_done(t, p_frag, ds_frag);
        };
        for (int t = 0; t + 1 < work.steps; ++t) {
            const StageOf<Traits> next(t + 1);
            step_gradients(t);
            wait_tiles(t + 1);
            if constexpr (!Traits::kDqSplit && kOwnsDq) {
                wgmma_wait<0>();
                reduce_dq(t, dq);
            }
            issue_scores(s, k_desc, layout.q(next.stage));
            issue_scores(dp, v_desc, layout.dout(next.stage));
            scores(t + 1, s, dp);
        }
        step_gradients(work.steps - 1);
        if constexpr (!Traits::kDqSplit && kOwnsDq) {  // split: the dQ writers add and wait
            wgmma_wait<0>();
            reduce_dq(work.steps - 1, dq);
            // The last reduce is complete before the block (and its shared
            // memory) is gone (deterministic: the writer waits for its own).
            if (!Is_deterministic && thread_in_group == 0) bulk_wait_group<0>();
        }
    }

    // A part of a split item (schedule.h: TailSplit) hands its dK and dV on
    // (parts.cuh); the last part writes the item's.
    const TileOfGrid block = work.place_again(params);
    if constexpr (!Is_local && !Is_deterministic) {
        if (block.parts > 1) {
            constexpr int kPartBarrier = 9 + consumer;  // this warpgroup's own
            const PartHandOn<Traits::kPartValues> hand_on(params, block.slot, block.part, block.parts, consumer,
                                                          Traits::kConsumerWarpgroups);
            hand_on.wait();
            hand_on.add(flat(dk), 0);
            hand_on.add(flat(dv), Traits::kNTilesD * 4);
            if (!hand_on.last()) {
                hand_on.store(flat(dk), 0);
                hand_on.store(flat(dv), Traits::kNTilesD * 4);
                hand_on.count(kPartBarrier);
                return;
            }
            hand_on.reset(kPartBarrier);
        }
    }

    // Epilogue: dK takes the softmax scale; each thread writes its pairs of
    // columns of its two key rows (rows past the sequence, columns past the
    // head dim stay unwritten).
    Element* dk_out = static_cast<Element*>(params.dk_ptr) + block.batch * params.dk_batch_stride +
                      block.head * params.dk_head_stride;
    Element* dv_out = static_cast<Element*>(params.dv_ptr) + block.batch * params.dv_batch_stride +
                      block.head * params.dv_head_stride;
    // This thread's first key in the tile, recomputed from the thread index
    // here rather than held across the main loop.
    const int epilogue_thread = opaque(static_cast<int>(threadIdx.x)) % 128;
    const int epilogue_key0 =
        consumer * Traits::kWarpgroupKeys + epilogue_thread / 32 * 16 + epilogue_thread % 32 / 4;
    // Softcap: the sequence (its k_start and seqlen_k: for packed rows, loads
    // of cu_seqlens_k, seqused_k, leftpad_k) and the thread's column pair are
    // derived again here too. Held across the main loop, they tip the d128
    // key warpgroup (224 registers) into spills in the last step's softcap
    // pass (ptxas: 8-12 B). Without softcap they stay held: no spill, and no
    // second read of the sequence's bounds.
    const Sequence seq = Has_softcap ? sequence_of<false>(params, opaque(block.batch)) : work.seq;
    const int column_lane = Has_softcap ? epilogue_thread : lane;  // the pair is (column_lane % 4) * 2 + {0, 1}
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int key = n0 + epilogue_key0 + half * 8;
        if (key >= seq.seqlen_k) continue;
        Element* dk_row = dk_out + static_cast<int64_t>(seq.k_start + key) * params.dk_row_stride;
        Element* dv_row = dv_out + static_cast<int64_t>(seq.k_start + key) * params.dv_row_stride;
#pragma unroll
        for (int j = 0; j < Traits::kNTilesD; ++j) {
            const int col = j * 8 + (column_lane % 4) * 2;
            if (col < params.head_dim) {
                *reinterpret_cast<uint32_t*>(dk_row + col) =
                    pack2<Element>(dk[0][j][2 * half] * params.softmax_scale, dk[0][j][2 * half + 1] * params.softmax_scale);
            }
            if (col < params.head_dim_v) {
                *reinterpret_cast<uint32_t*>(dv_row + col) = pack2<Element>(dv[0][j][2 * half], dv[0][j][2 * half + 1]);
            }
        }
    }
}

// A consumer warpgroup of the split backward (kernel_traits.h: BwdSplitTraits),
// both over the block's 64 keys as wgmma rows. kRole 0, the P warpgroup: S^T =
// K Q^T, P^T (masked, capped), handed to the other warpgroup in fp32 through
// shared memory, dV += P^T dO from its registers, dQ's first column blocks.
// kRole 1, the dS warpgroup: dP^T = V dO^T (while the other computes S^T),
// dS^T = P^T (dP^T - D) from the hand-over, to shared memory in 16 bits, dK +=
// dS^T Q from its registers, dQ's other column blocks. Each step, in order:
//   P: S^T | P^T, hand-over (kPFullBarrier) | dV issued | kDsFullBarrier | dQ
//   dS: dP^T | wait for P^T | dS^T stored, dK issued | kDsFullBarrier | dQ
// then each waits for its GEMMs, releases the stage, stages its dQ columns in
// fp32 and adds them into dq_accum by its own bulk reduce-adds (deterministic:
// hands the tile, both warpgroups' columns, to the dQ writer, bwd_dq_writer).
// One hand-over buffer and one dS^T buffer are enough: the P warpgroup
// overwrites P^T only after the dS barrier of the step before, which the dS
// warpgroup reaches once it has read it; the dS warpgroup overwrites dS^T only
// after the next hand-over, which the P warpgroup makes once its dQ GEMM of
// the step before (the last reader besides the dS warpgroup's own, waited
// for) is complete.
template <typename Traits, bool Is_local, bool Has_softcap, bool Is_deterministic, int kRole>
__device__ __forceinline__ void bwd_split_consumer(const BwdParams& params, const BwdSmem<Traits>& layout,
                                                   const CUtensorMap* tma_dq_accum) {
    using Element = typename Traits::Element;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kNTilesS = Traits::kNTilesS;
    constexpr bool kP = kRole == 0;
    // This warpgroup's gradient, dV or dK: 64 keys x its tile's columns.
    constexpr int kGradCols = kP ? Traits::kTileColsV : Traits::kTileCols;
    // Its columns of dQ: [kDqCol0, kDqCol0 + kDqCols).
    constexpr int kDqCol0 = kP ? 0 : Traits::kDqColBlocksP * kSwizzleCols;
    constexpr int kDqCols = (kP ? Traits::kDqColBlocksP : Traits::kColBlocks - Traits::kDqColBlocksP) * kSwizzleCols;
    // Named barriers (0 is __syncthreads'): P^T handed over (P arrives, dS
    // waits); dS^T stored (both wait); this warpgroup's dQ columns staged
    // (deterministic: the dQ writers' hand-off, dq_full_barrier and
    // dq_empty_barrier, in their place); 5 is wait_key_tiles'.
    constexpr int kPFullBarrier = 1;
    constexpr int kDsFullBarrier = 2;
    constexpr int kDqStagedBarrier = 3 + kRole;
    constexpr int kConsumerThreads = Traits::kConsumerWarpgroups * 128;

    const BwdWork<Traits, Is_local, Is_deterministic> work(params, layout);
    const int n0 = work.n_block * kBlockN;
    const int thread_in_group = threadIdx.x % 128;
    const int lane = threadIdx.x % 32;
    const int warp_in_group = thread_in_group / 32;
    const int warp_key0 = warp_in_group * 16;  // this warp's first key in the tile

    float grad[1][kGradCols / 8][4];
#pragma unroll
    for (int i = 0; i < kGradCols / 2; ++i) flat(grad)[i] = 0.f;

    // S^T or dP^T: all 64 rows of K or V, K-major. dQ: dS^T and K's column
    // blocks from kDqCol0, both MN-major (keys are the K dimension).
    const uint64_t x_desc =
        smem_descriptor_sw128(kP ? layout.k() : layout.v(), kUnusedLeadingBytes, kSwizzleAtomBytes);
    const uint64_t k_mn_desc = smem_descriptor_sw128(layout.k() + kDqCol0 / kSwizzleCols * Traits::kKVBlockBytes,
                                                     Traits::kKVBlockBytes, kSwizzleAtomBytes);
    const uint64_t ds_mn_desc = smem_descriptor_sw128(layout.ds(0), Traits::kDsBlockBytes, kSwizzleAtomBytes);
    // A thread's slot in the hand-over: float4 i of thread r at (i * 128 + r) * 16.
    const uint32_t xfer = layout.xfer() + thread_in_group * 16;

    // Step t's S^T = K Q^T over the head dim, or dP^T = V dO^T over V's, issued
    // once its Q and dO tiles are in shared memory (and, for packed rows, the
    // producer's zeros past the sequence: BwdWork).
    auto issue_scores = [&](int t, float (&s)[1][kNTilesS][4]) {
        const StageOf<Traits> st(t);
        mbarrier_wait(layout.full(st.stage), st.phase);
        if (params.cu_seqlens_q != nullptr) mbarrier_wait(layout.stats_full(st.stage), st.phase);
        issue_transposed_scores<Traits, kP ? Traits::kKStepsD : Traits::kKStepsDv>(
            s, x_desc, kP ? layout.q(st.stage) : layout.dout(st.stage));
    };

    // Step t, all of it: the GEMMs issued in the step are complete at its end.
    // (Issuing the next step's S^T or dP^T behind dQ, to run while dQ is
    // staged, made d192 16% slower: NOTES.md.)
    auto step = [&](int t) {
        const StageOf<Traits> st(t);
        const int m0 = work.m0_of(t);
        float s[1][kNTilesS][4];
        issue_scores(t, s);
        mbarrier_wait(layout.stats_full(st.stage), st.phase);
        wgmma_wait<0>();
        pin_registers(flat(s));

        uint32_t frag[Traits::kKStepsM][4];  // P^T's or dS^T's A fragments
        if constexpr (kP) {
            // P^T = exp2(S^T * scale_log2 - lse_log2), masked as bwd_consumer's
            // scores (softcap: capped first, and handed over times the cap's
            // chain factor 1 - S^T^2, 0 where masked).
            if constexpr (Has_softcap) {
#pragma unroll
                for (int i = 0; i < kNTilesS * 4; ++i) flat(s)[i] = tanhf(flat(s)[i] * params.softcap_inner_scale);
            }
            if (!tile_is_full<kBlockM, kBlockN>(m0, n0, work.seq.seqlen_q, work.window)) {
                mask_transposed<Is_local>(s, n0 + warp_key0, m0, work.window, lane);
            }
            const uint32_t lse_row = layout.lse_log2(st.stage) + 8 * (lane % 4);
#pragma unroll
            for (int j = 0; j < kNTilesS; ++j) {
                const float2 lse = load_shared_f32x2(lse_row + 32 * j);
                float handed[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float score = s[0][j][e];
                    s[0][j][e] = exp2_approx(fmaf(score, params.softmax_scale_log2, -(e % 2 ? lse.y : lse.x)));
                    handed[e] = Has_softcap ? s[0][j][e] * fmaxf(fmaf(-score, score, 1.f), 0.f) : s[0][j][e];
                }
                store_shared_f32x4(xfer + j * 128 * 16, handed[0], handed[1], handed[2], handed[3]);
            }
            named_barrier_arrive(kPFullBarrier, kConsumerThreads);
            pack_a_fragments<Element>(frag, s);
        } else {
            // dS^T = P^T (dP^T - D) (softcap: times the chain factor the hand-over carries).
            const uint32_t dsum_row = layout.dsum(st.stage) + 8 * (lane % 4);
            named_barrier_sync_unaligned(kPFullBarrier, kConsumerThreads);
#pragma unroll
            for (int j = 0; j < kNTilesS; ++j) {
                const float2 d = load_shared_f32x2(dsum_row + 32 * j);
                const float4 p = load_shared_f32x4(xfer + j * 128 * 16);
                s[0][j][0] = p.x * (s[0][j][0] - d.x);
                s[0][j][1] = p.y * (s[0][j][1] - d.y);
                s[0][j][2] = p.z * (s[0][j][2] - d.x);
                s[0][j][3] = p.w * (s[0][j][3] - d.y);
            }
            pack_a_fragments<Element>(frag, s);
            store_ds_fragments<Traits>(frag, layout.ds(0), warp_key0, lane);
            fence_proxy_async_shared();  // the stores are read by wgmma (async proxy) after the barrier
        }
        // dV += P^T dO or dK += dS^T Q (queries are the K dimension: dO and Q read MN-major).
        {
            const uint64_t b_mn_desc = recompute_per_use(smem_descriptor_sw128(
                kP ? layout.dout(st.stage) : layout.q(st.stage), Traits::kQBlockBytes, kSwizzleAtomBytes));
            wgmma_fence();
#pragma unroll
            for (int k = 0; k < Traits::kKStepsM; ++k) {
                Wgmma<kGradCols>::template rs<Element>(flat(grad), frag[k],
                                                       advance_descriptor(b_mn_desc, k * 16 * kSwizzleBytes), 1);
            }
            wgmma_commit();
        }
        // The previous step's reduce has read this warpgroup's staged dQ
        // columns before they are restaged (its issuer waits; the barrier
        // holds the rest of the warpgroup; deterministic: the writer's
        // dq_empty_barrier, below).
        if (!Is_deterministic && thread_in_group == 0) bulk_wait_group_read<0>();
        named_barrier_sync_unaligned(kDsFullBarrier, kConsumerThreads);  // the roles reach it by their own instructions

        // dQ = dS K over the block's keys, this warpgroup's columns.
        float dq[1][kDqCols / 8][4];
        {
            const uint64_t ds_mn = recompute_per_use(ds_mn_desc);
            const uint64_t k_mn = recompute_per_use(k_mn_desc);
            wgmma_fence();
#pragma unroll
            for (int k = 0; k < Traits::kKStepsN; ++k) {
                Wgmma<kDqCols>::template ss<Element, 1, 1>(flat(dq), advance_descriptor(ds_mn, k * 16 * kSwizzleBytes),
                                                        advance_descriptor(k_mn, k * 16 * kSwizzleBytes),
                                                        /*scale_d=*/k > 0);
            }
            wgmma_commit();
        }
        wgmma_wait<0>();
        pin_registers(frag);
        pin_registers(flat(grad));
        pin_registers(flat(dq));
        mbarrier_arrive(layout.empty(st.stage));  // this thread's reads of the stage are complete

        // Deterministic: the writer adds the whole tile, both warpgroups'
        // columns, in its turn (bwd_dq_writer), once its add of the previous
        // step's has read it.
        if constexpr (Is_deterministic) {
            if (t > 0) named_barrier_sync_unaligned(dq_empty_barrier(t - 1), dq_handoff_threads<Traits>());
        }
        store_dq_rows<Traits>(dq, layout.dq(), kDqCol0, warp_in_group, lane);
        fence_proxy_async_shared();  // the stores are read by the bulk reduce (async proxy)
        if constexpr (Is_deterministic) {
            named_barrier_arrive(dq_full_barrier(t), dq_handoff_threads<Traits>());
            return;
        }
        named_barrier_sync(kDqStagedBarrier, 128);
        if (thread_in_group == 0) {
            reduce_dq_boxes<Traits>(tma_dq_accum, layout.dq(), kDqCol0 / Traits::kDqBoxCols,
                                    (kDqCol0 + kDqCols) / Traits::kDqBoxCols, params.head_dim, work.seq.q_start + m0,
                                    work.head_of(params, t), work.q_batch(params));
        }
    };

    if (work.steps > 0) {
        wait_key_tiles(params, layout, work, n0);
#pragma unroll 1
        for (int t = 0; t < work.steps; ++t) step(t);
        // The last reduce is complete before the block (and its shared memory)
        // is gone (deterministic: the writer waits for its own).
        if (!Is_deterministic && thread_in_group == 0) bulk_wait_group<0>();
    }

    // Epilogue: dV, or dK times the softmax scale; each thread writes its
    // pairs of columns of its two key rows (rows past the sequence, columns
    // past the head dim stay unwritten).
    const int64_t batch_offset = kP ? work.batch * params.dv_batch_stride : work.batch * params.dk_batch_stride;
    const int64_t head_offset = kP ? work.head_k * params.dv_head_stride : work.head_k * params.dk_head_stride;
    Element* out = static_cast<Element*>(kP ? params.dv_ptr : params.dk_ptr) + batch_offset + head_offset;
    const int64_t row_stride = kP ? params.dv_row_stride : params.dk_row_stride;
    const int cols = kP ? params.head_dim_v : params.head_dim;
    const float scale = kP ? 1.f : params.softmax_scale;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int key = n0 + warp_key0 + lane / 4 + half * 8;
        if (key >= work.seq.seqlen_k) continue;
        Element* row = out + static_cast<int64_t>(work.seq.k_start + key) * row_stride;
#pragma unroll
        for (int j = 0; j < kGradCols / 8; ++j) {
            const int col = j * 8 + (lane % 4) * 2;
            if (col < cols) {
                *reinterpret_cast<uint32_t*>(row + col) =
                    pack2<Element>(grad[0][j][2 * half] * scale, grad[0][j][2 * half + 1] * scale);
            }
        }
    }
}

// P and dS on score fragments whose rows are queries ([1][kNTiles][4], two
// rows a thread, whose LSE in base 2 and D are lse[2] and dsum[2]), as the
// d256 kernels hold S and dP (bwd_slice_consumer, bwd_dq_kernel.cuh). In
// order: cap_rows (softcap: S = tanh(S * inner scale), before the mask), the
// mask, exponentiate_rows (P = exp2(S * scale_log2 - lse) in place of S;
// with softcap P is made with dS instead), then ds_rows: dS = P (dP - D) in
// place of dP, with softcap times the cap's chain factor 1 - tanh^2 and P
// from the capped score. p_of and cap_chain are the per-element arithmetic.
__device__ __forceinline__ float p_of(float score, const BwdParams& params, float lse) {
    return exp2_approx(fmaf(score, params.softmax_scale_log2, -lse));
}
// 1 - tanh^2 of a capped score: 0 where masked (-inf).
__device__ __forceinline__ float cap_chain(float capped) { return fmaxf(fmaf(-capped, capped, 1.f), 0.f); }

template <bool Has_softcap, int kNTiles>
__device__ __forceinline__ void cap_rows(float (&s)[1][kNTiles][4], const BwdParams& params) {
    if constexpr (Has_softcap) {
#pragma unroll
        for (int r = 0; r < kNTiles * 4; ++r) flat(s)[r] = tanhf(flat(s)[r] * params.softcap_inner_scale);
    }
}

template <bool Has_softcap, int kNTiles>
__device__ __forceinline__ void exponentiate_rows(float (&s)[1][kNTiles][4], const BwdParams& params,
                                                  const float (&lse)[2]) {
    if constexpr (!Has_softcap) {
#pragma unroll
        for (int j = 0; j < kNTiles; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[0][j][e] = p_of(s[0][j][e], params, lse[e / 2]);
    }
}

template <bool Has_softcap, int kNTiles>
__device__ __forceinline__ void ds_rows(const float (&s)[1][kNTiles][4], float (&dp)[1][kNTiles][4],
                                        const BwdParams& params, const float (&lse)[2], const float (&dsum)[2]) {
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            if constexpr (Has_softcap) {
                const float capped = s[0][j][e];
                dp[0][j][e] = p_of(capped, params, lse[e / 2]) * (dp[0][j][e] - dsum[e / 2]) * cap_chain(capped);
            } else {
                dp[0][j][e] = s[0][j][e] * (dp[0][j][e] - dsum[e / 2]);
            }
        }
    }
}

// A consumer warpgroup of the d256 dK/dV kernel (kernel_traits.h:
// BwdSliceTraits): warpgroup kWarpgroup of two. Per step of 64 queries:
//   warpgroup 0, the P warpgroup: S = Q K^T over the block's 80 keys (N = 80,
//     over the head dim), P = exp2(S * scale_log2 - lse_log2) (masked, capped
//     as bwd_consumer's), stored in 16 bits into this step's P tile; with
//     softcap also P times the cap's chain factor, into its dS tile;
//   warpgroup 1, the dS warpgroup: dP = dO V^T over the 80 keys, issued
//     only once S is (barrier kSBarrier), so that S runs first on the tensor
//     cores and P is made while dP runs (round 37: 5% off the kernel's time
//     under a causal mask, 1-3% without); once P is stored (kPBarrier),
//     dS = P (dP - D) from the stored P (with softcap: from P times the
//     chain factor, replaced in place by dS);
//   both, for each of their two 64-column slices i of the head dim:
//     dV^T_i += dO_i^T P once P is stored, dK^T_i += Q_i^T dS once dS is
//     (barrier kDsBarrier). Each warpgroup releases dO as soon as its dV^T
//     is complete (the next step's dP waits for the copy), Q once its dK^T
//     is.
// So each step reads Q and dO once as an A operand, where two warpgroups of
// N = 40 each read both (round 36's Nsight Compute: those reads were 55% of
// the kernel's shared-memory wavefronts). P and dS are [key][query] tiles
// (one 128-byte row of 64 queries a key, stmatrix.trans, read back by
// ldmatrix.trans in the same fragment layout), and the dS warpgroup issues its
// dV^T GEMMs before it computes dS. dQ is bwd_dq_kernel.cuh's. P and dS
// alternate between two buffers: step t + 1's P is stored after step t's dS
// barrier, step t + 1's dS after step t + 1's P barrier, into the buffers
// step t - 1 read, and each warpgroup completes all of a step's GEMMs (and
// its reads of P) before it reaches the next step's dS barrier.
// The P warpgroup works a step ahead: in step t it issues step t + 1's S
// behind both warpgroups' dV^T (kDvBarrier: the dS warpgroup's are issued),
// so that the tensor cores run it while dS is made, and it makes step t + 1's
// P while dK^T runs, where S, then P, ran alone between one step's dK^T and
// the next step's dV^T (round 42: with the producer's row stats read a step
// ahead, 8-10% off the kernel).
template <typename Traits, bool Is_local, bool Has_softcap, int kWarpgroup>
__device__ __forceinline__ void bwd_slice_consumer(const BwdParams& params, const BwdSmem<Traits>& layout) {
    using Element = typename Traits::Element;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kNTilesS = Traits::kNTilesS;
    constexpr int kNTilesKV = Traits::kNTilesKV;
    constexpr int kSlices = Traits::kSlices;
    constexpr int kColBlock0 = kWarpgroup * kSlices;  // this warpgroup's first 64-column block of dV, dK
    // Named barriers of both warpgroups (5 is wait_key_tiles'): the step's P
    // is stored (1; the epilogue's too), its dS is stored (2), its S is
    // issued (3), the dS warpgroup's dV^T is issued (4).
    constexpr int kPBarrier = 1;
    constexpr int kDsBarrier = 2;
    constexpr int kSBarrier = 3;
    constexpr int kDvBarrier = 4;
    constexpr int kConsumerThreads = Traits::kConsumerWarpgroups * 128;
    static_assert(kNTilesS % 2 == 0, "n8 blocks of keys in pairs: stmatrix and ldmatrix x4");

    const BwdWork<Traits, Is_local, /*Is_deterministic=*/false> work(params, layout);
    const int n0 = work.n_block * kBlockN;
    const int thread_in_group = threadIdx.x % 128;
    const int lane = threadIdx.x % 32;
    const int warp_row0 = thread_in_group / 32 * 16;  // this warp's first query of S and dP

    // dV^T and dK^T: slice i holds head-dim columns (kColBlock0 + i) * 64 +
    // the accumulator rows, keys as its columns.
    float dv[kSlices][1][kNTilesKV][4];
    float dk[kSlices][1][kNTilesKV][4];
#pragma unroll
    for (int i = 0; i < kSlices; ++i)
#pragma unroll
        for (int r = 0; r < kNTilesKV * 4; ++r) flat(dv[i])[r] = flat(dk[i])[r] = 0.f;

    // S = Q K^T or dP = dO V^T: A the step's Q or dO tile (K-major), B all
    // 80 rows of K or V (K-major), over the head dim.
    auto issue_scores = [&](float (&acc)[1][kNTilesS][4], uint32_t a_tile, uint32_t b_tile) {
        const uint64_t a_desc = smem_descriptor_sw128(a_tile, kUnusedLeadingBytes, kSwizzleAtomBytes);
        const uint64_t b_desc =
            recompute_per_use(smem_descriptor_sw128(b_tile, kUnusedLeadingBytes, kSwizzleAtomBytes));
        issue_scores_k_major<Element, kBlockN, Traits::kKStepsD, Traits::kQBlockBytes, Traits::kKVBlockBytes>(
            acc, a_desc, b_desc);
    };
    // The [key][query] tile at `tile` (128-byte rows of 64 queries, swizzled)
    // and a warp's 16 queries x 80 keys of a fragment: n8 blocks j and j + 1
    // are four 8 x 8 matrices (matrix r: block j + r / 2, queries 8 (r % 2)
    // .. of the warp) in stmatrix's and ldmatrix's layout; transposed, row i
    // of a matrix is key 8 (j + r / 2) + i with its 8 queries (16 bytes), and
    // lane 8r + i gives the address of matrix r's row i.
    auto pair_address = [&](uint32_t tile, int j) {
        const int r = lane / 8;
        return swizzled_address(tile, (j + r / 2) * 8 + lane % 8, (warp_row0 + (r % 2) * 8) * 2);
    };
    // Blocks j and j + 1 of v, rounded to 16 bits, stored transposed.
    auto store_pair = [&](uint32_t tile, int j, const float (&v)[2][4]) {
        stmatrix_x4_trans(pair_address(tile, j), pack2<Element>(v[0][0], v[0][1]), pack2<Element>(v[0][2], v[0][3]),
                          pack2<Element>(v[1][0], v[1][1]), pack2<Element>(v[1][2], v[1][3]));
    };
    // Slice i of dV^T += dO^T P or dK^T += Q^T dS: A the slice's column block
    // of dO or Q, read MN-major (its 64 columns are M, the queries K: 16 rows
    // a k16 step); B the P or dS tile, K-major (N: the 80 keys; K: the
    // queries, 32 bytes a k16 step).
    auto issue_kv_slice = [&](float (&acc)[1][kNTilesKV][4], uint32_t x_tile, uint32_t y_tile, int i) {
        const uint64_t a_desc = recompute_per_use(smem_descriptor_sw128(
            x_tile + (kColBlock0 + i) * Traits::kQBlockBytes, Traits::kQBlockBytes, kSwizzleAtomBytes));
        const uint64_t b_desc = smem_descriptor_sw128(y_tile, kUnusedLeadingBytes, kSwizzleAtomBytes);
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < Traits::kKStepsM; ++k) {
            Wgmma<kBlockN>::template ss<Element, /*kTransA=*/1, 0>(
                flat(acc), advance_descriptor(a_desc, k * 16 * kSwizzleBytes), advance_descriptor(b_desc, k * 32),
                /*scale_d=*/1);
        }
        wgmma_commit();
    };
    // The producer's copies of the step's Q or dO tile (full) have landed, and
    // with packed rows its zeros past the sequence too (stored before its
    // stats arrivals: BwdWork); with them the tile's LSE or D (stats).
    auto wait_q = [&](const StageOf<Traits>& sq) {
        mbarrier_wait(layout.full(sq.stage), sq.phase);
        if (params.cu_seqlens_q != nullptr) mbarrier_wait(layout.stats_full(sq.stage), sq.phase);
    };
    auto wait_dout = [&](const StageOf<Traits, Traits::kDoStages>& sd) {
        mbarrier_wait(layout.do_full(sd.stage), sd.phase);
        if (params.cu_seqlens_q != nullptr) mbarrier_wait(layout.do_stats_full(sd.stage), sd.phase);
    };
    // The P warpgroup's S of step t (issued, with the dS warpgroup told at
    // kSBarrier), and its rows' LSE read while S runs.
    float x[1][kNTilesS][4];  // P warpgroup: S, then P, across steps; dS warpgroup: dP, then dS
    float lse[2];
    auto issue_s = [&](int t) {
        const StageOf<Traits> sq(t);
        wait_q(sq);
        issue_scores(x, layout.q(sq.stage), layout.k());
        named_barrier_arrive(kSBarrier, kConsumerThreads);
        mbarrier_wait(layout.stats_full(sq.stage), sq.phase);
        const uint32_t lse_row = layout.lse_log2(sq.stage) + 4 * (warp_row0 + lane / 4);
        lse[0] = load_shared_f32(lse_row);
        lse[1] = load_shared_f32(lse_row + 32);
    };
    // The P warpgroup's P of step t from its complete S (x) and LSE, stored
    // into the step's P tile (with softcap P times the cap's chain factor
    // into its dS tile too).
    auto make_p = [&](int t) {
        const int m0 = work.m0_of(t);
        const uint32_t p_tile = layout.p(t % Traits::kPdsBuffers);
        const uint32_t ds_tile = layout.ds(t % Traits::kPdsBuffers);
        // Masked where some query of the tile misses some key (bwd_consumer's
        // scores say which and why; the keys past the sequence too), capped
        // first with softcap.
        cap_rows<Has_softcap>(x, params);
        if (!tile_is_full<kBlockM, kBlockN>(m0, n0, work.seq.seqlen_q, work.window)) {
            apply_mask<Is_local>(x, m0 + warp_row0, n0, work.window, lane);
        }
#pragma unroll
        for (int j = 0; j < kNTilesS; j += 2) {
            float p[2][4], chained[2][4];
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    p[h][e] = p_of(x[0][j + h][e], params, lse[e / 2]);
                    if constexpr (Has_softcap) chained[h][e] = p[h][e] * cap_chain(x[0][j + h][e]);
                }
            store_pair(p_tile, j, p);
            if constexpr (Has_softcap) store_pair(ds_tile, j, chained);
        }
        fence_proxy_async_shared();  // the stores are read by wgmma (async proxy) after the barrier
    };
    if (work.steps > 0) {
        wait_key_tiles(params, layout, work, n0);
        if constexpr (kWarpgroup == 0) {
            issue_s(0);
            wgmma_wait<0>();
            pin_registers(flat(x));
            make_p(0);
        }
        // Step t; kAhead: not the last, so the P warpgroup issues the next
        // step's S and makes its P within this one. Two bodies rather than a
        // runtime test: around a GEMM issued under one test and waited for
        // under another, ptxas serialises every wgmma of the kernel (C7514).
        auto step = [&](int t, auto ahead) {
            constexpr bool kAhead = decltype(ahead)::value;
            const StageOf<Traits> sq(t);                     // Q's ring
            const StageOf<Traits, Traits::kDoStages> sd(t);  // dO's
            const uint32_t p_tile = layout.p(t % Traits::kPdsBuffers);
            const uint32_t ds_tile = layout.ds(t % Traits::kPdsBuffers);
            const uint32_t dout = layout.dout(sd.stage);
            const uint32_t q = layout.q(sq.stage);
            if constexpr (kWarpgroup == 0) {
                // P of step t is stored (made in the step before, or above).
                named_barrier_sync_unaligned(kPBarrier, kConsumerThreads);  // the warpgroups are compiled apart
                wait_dout(sd);
                issue_kv_slice(dv[0], dout, p_tile, 0);
                issue_kv_slice(dv[1], dout, p_tile, 1);
                // dO released as soon as dV^T is complete: the next step's dP
                // waits for its copy (~1350 clocks, round 41's trace). Then
                // the next step's S, behind both warpgroups' dV^T, to run
                // while dS is made, where the tensor cores waited for dS. It
                // completes within this step (below): a GEMM in flight across
                // the loop's back edge makes ptxas serialise every wgmma of
                // the kernel (round 37: C7515, 40% slower).
                wgmma_wait<0>();
                mbarrier_arrive(layout.do_empty(sd.stage));  // this thread's reads of the dO stage (and its D) are complete
                if constexpr (kAhead) {
                    named_barrier_sync_unaligned(kDvBarrier, kConsumerThreads);
                    issue_s(t + 1);
                }
            } else {
                named_barrier_sync_unaligned(kSBarrier, kConsumerThreads);  // S ahead of dP on the tensor cores
                wait_dout(sd);
                issue_scores(x, dout, layout.v());
                mbarrier_wait(layout.do_stats_full(sd.stage), sd.phase);
                const uint32_t dsum_row = layout.dsum(sd.stage) + 4 * (warp_row0 + lane / 4);
                const float dsum[2] = {load_shared_f32(dsum_row), load_shared_f32(dsum_row + 32)};
                wgmma_wait<0>();
                pin_registers(flat(x));
                named_barrier_sync_unaligned(kPBarrier, kConsumerThreads);
                issue_kv_slice(dv[0], dout, p_tile, 0);
                issue_kv_slice(dv[1], dout, p_tile, 1);
                if constexpr (kAhead) named_barrier_arrive(kDvBarrier, kConsumerThreads);
                // dS while dV^T runs: P (with softcap P times the chain
                // factor, where dS then goes) read back in this thread's
                // fragment positions.
                // All of P is loaded before any dS is stored: the loads and
                // stores are ordered asm, so a load after a store would wait
                // for the previous load's result and the arithmetic on it,
                // one shared-memory latency a pair (round 41's trace: the
                // dS phase took ~950 clocks, longer than the dV^T it hides
                // behind).
                const uint32_t from = Has_softcap ? ds_tile : p_tile;
                uint32_t packed[kNTilesS / 2][4];
#pragma unroll
                for (int j = 0; j < kNTilesS; j += 2) {
                    ldmatrix_x4_trans(pair_address(from, j), packed[j / 2][0], packed[j / 2][1], packed[j / 2][2],
                                      packed[j / 2][3]);
                }
#pragma unroll
                for (int j = 0; j < kNTilesS; j += 2) {
                    float ds[2][4];
#pragma unroll
                    for (int h = 0; h < 2; ++h)
#pragma unroll
                        for (int e = 0; e < 4; e += 2) {
                            const float2 p = unpack2<Element>(packed[j / 2][2 * h + e / 2]);
                            ds[h][e] = p.x * (x[0][j + h][e] - dsum[e / 2]);
                            ds[h][e + 1] = p.y * (x[0][j + h][e + 1] - dsum[e / 2]);
                        }
                    store_pair(ds_tile, j, ds);
                }
                fence_proxy_async_shared();
                wgmma_wait<0>();  // dV^T (complete before dS, which takes longer): dO is released
                mbarrier_arrive(layout.do_empty(sd.stage));
                wait_q(sq);
            }
            named_barrier_sync_unaligned(kDsBarrier, kConsumerThreads);
            issue_kv_slice(dk[0], q, ds_tile, 0);
            issue_kv_slice(dk[1], q, ds_tile, 1);
            // The P warpgroup makes the next step's P while dK^T runs (its S
            // was issued ahead of dK^T): P, the longest link of the step's
            // chain, no longer runs alone. Its tiles are the other buffers
            // (above).
            if constexpr (kWarpgroup == 0 && kAhead) {
                wgmma_wait<2>();  // S, not dK^T
                pin_registers(flat(x));
                make_p(t + 1);
            }
            wgmma_wait<0>();
#pragma unroll
            for (int i = 0; i < kSlices; ++i) {
                pin_registers(flat(dv[i]));
                pin_registers(flat(dk[i]));
            }
            mbarrier_arrive(layout.empty(sq.stage));  // this thread's reads of the Q stage (and its LSE) are complete
        };
#pragma unroll 1
        for (int t = 0; t + 1 < work.steps; ++t) step(t, std::true_type{});
        step(work.steps - 1, std::false_type{});
    }

    // Epilogue: dV and dK (times the softmax scale) staged as [key][column]
    // tiles where the Q and dO stages were (K's layout: 64-column blocks of
    // 128-byte swizzled rows) by stmatrix.trans from their transposes, then
    // copied out a 16-byte chunk a thread, a warp a whole 512-byte row; keys
    // past the sequence and columns past the head dims are not written. The
    // barrier before: both warpgroups' GEMMs are complete (the stages are
    // free); after: both tiles are staged.
    static_assert(2 * Traits::kKVBytes <= Traits::kStages * Traits::kQBytes + Traits::kDoStages * Traits::kDoBytes,
                  "dV and dK staged where Q and dO were");
    const uint32_t dv_stage = layout.q(0);
    const uint32_t dk_stage = layout.q(0) + Traits::kKVBytes;
    named_barrier_sync_unaligned(kPBarrier, kConsumerThreads);
    {
        const int r = lane / 8;
        const int col_byte = (warp_row0 + (r % 2) * 8) * 2;
#pragma unroll
        for (int i = 0; i < kSlices; ++i) {
            const uint32_t block = (kColBlock0 + i) * Traits::kKVBlockBytes;
#pragma unroll
            for (int j = 0; j < kNTilesKV; j += 2) {
                const int key = (j + r / 2) * 8 + lane % 8;
                stmatrix_x4_trans(swizzled_address(dv_stage + block, key, col_byte),
                                  pack2<Element>(dv[i][0][j][0], dv[i][0][j][1]),
                                  pack2<Element>(dv[i][0][j][2], dv[i][0][j][3]),
                                  pack2<Element>(dv[i][0][j + 1][0], dv[i][0][j + 1][1]),
                                  pack2<Element>(dv[i][0][j + 1][2], dv[i][0][j + 1][3]));
                const float scale = params.softmax_scale;
                stmatrix_x4_trans(swizzled_address(dk_stage + block, key, col_byte),
                                  pack2<Element>(dk[i][0][j][0] * scale, dk[i][0][j][1] * scale),
                                  pack2<Element>(dk[i][0][j][2] * scale, dk[i][0][j][3] * scale),
                                  pack2<Element>(dk[i][0][j + 1][0] * scale, dk[i][0][j + 1][1] * scale),
                                  pack2<Element>(dk[i][0][j + 1][2] * scale, dk[i][0][j + 1][3] * scale));
            }
        }
    }
    named_barrier_sync_unaligned(kPBarrier, kConsumerThreads);
    static_assert(kNTilesKV % 2 == 0, "n8 blocks of keys in pairs (x4)");
    const int64_t dv_offset = work.batch * params.dv_batch_stride + work.head_k * params.dv_head_stride;
    const int64_t dk_offset = work.batch * params.dk_batch_stride + work.head_k * params.dk_head_stride;
    Element* const dv_out = static_cast<Element*>(params.dv_ptr) + dv_offset;
    Element* const dk_out = static_cast<Element*>(params.dk_ptr) + dk_offset;
    constexpr int kChunksPerRow = Traits::kHeadDim / 8;  // 16-byte chunks of a key row
    for (int c = threadIdx.x - 128; c < kBlockN * kChunksPerRow; c += kConsumerThreads) {
        const int key = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
        if (n0 + key >= work.seq.seqlen_k) break;  // the rows go in order: the rest are past it too
        const uint32_t at = swizzled_address((col / kSwizzleCols) * Traits::kKVBlockBytes, key, (col % kSwizzleCols) * 2);
        const int64_t row = work.seq.k_start + n0 + key;
        if (col < params.head_dim_v) {
            *reinterpret_cast<float4*>(dv_out + row * params.dv_row_stride + col) = load_shared_f32x4(dv_stage + at);
        }
        if (col < params.head_dim) {
            *reinterpret_cast<float4*>(dk_out + row * params.dk_row_stride + col) = load_shared_f32x4(dk_stage + at);
        }
    }
}

template <typename Traits, bool Is_local, bool Has_softcap, bool Is_deterministic>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    bwd_kernel(const __grid_constant__ BwdParams params, const __grid_constant__ CUtensorMap tma_q,
               const __grid_constant__ CUtensorMap tma_k, const __grid_constant__ CUtensorMap tma_v,
               const __grid_constant__ CUtensorMap tma_do, const __grid_constant__ CUtensorMap tma_dq_accum) {
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kStages = Traits::kStages;

    extern __shared__ char smem[];
    const BwdSmem<Traits> layout(smem);
    // Without dQ (d256) the dQ kernel comes next and reads nothing this one
    // writes: it may start on the SMs of this grid's last wave.
    if constexpr (!Traits::kDqInKernel) launch_dependents();

    if (threadIdx.x == 0) {
        mbarrier_init(layout.kv_full(), 1);  // the producer's arrive.expect_tx
        for (int stage = 0; stage < kStages; ++stage) {
            mbarrier_init(layout.full(stage), 1);         // lane 0's arrive.expect_tx: Q and dO's bytes
            mbarrier_init(layout.stats_full(stage), 32);  // every producer lane, once its row stats are stored
            // One arrival per consumer thread, once its reads of the stage (the
            // wgmma of dV and dK, the row stats) are complete.
            mbarrier_init(layout.empty(stage), Traits::kConsumerWarpgroups * 128);
        }
        for (int stage = 0; stage < Traits::kDoStages; ++stage) {  // dO's own ring (BwdSliceTraits), alike
            mbarrier_init(layout.do_full(stage), 1);
            mbarrier_init(layout.do_stats_full(stage), 32);
            mbarrier_init(layout.do_empty(stage), Traits::kConsumerWarpgroups * 128);
        }
        fence_barrier_init();
        BwdWork<Traits, Is_local, Is_deterministic>::store_place(params, layout);
    }
    __syncthreads();  // the barriers and the tile exist before anyone reads them; the last block-wide barrier

    const int warpgroup = threadIdx.x / 128;
    if (warpgroup == 0) {
        // Producer: warp 0 stays (and, deterministic or the d128 80-query
        // kernel, warps 1 and 2: the dQ writers), the rest of the warpgroup
        // exits. Nothing is copied for a block without steps (its consumers
        // write zeros and exit: no copy may land in a block that is gone).
        release_registers<Traits::kProducerRegs>();
        if constexpr (Is_deterministic) {
            // The warp index broadcast from lane 0: ptxas then sees a
            // warp-uniform branch and keeps both roles' work in uniform
            // registers (on threadIdx.x itself it spills at 24 registers).
            const int warp = __shfl_sync(0xffffffff, threadIdx.x / 32, 0);
            if (warp == 1 || warp == 2) {
                bwd_dq_writer<Traits, Is_local>(params, layout, &tma_dq_accum, warp - 1);
                return;
            }
        } else if constexpr (Traits::kDqSplit) {  // the d128 80-query kernel: a dQ writer a consumer warpgroup
            const int warp = __shfl_sync(0xffffffff, threadIdx.x / 32, 0);
            if (warp == 1 || warp == 2) {
                bwd_dq_half_writer<Traits, Is_local>(params, layout, &tma_dq_accum, warp - 1);
                return;
            }
        }
        // Each role derives its work after setmaxnreg: a value live across it is kept in local memory.
        const BwdWork<Traits, Is_local, Is_deterministic> work(params, layout);
        const int n0 = work.n_block * kBlockN;
        if (threadIdx.x >= 32 || work.steps == 0) return;
        const int lane = threadIdx.x;
        if (lane == 0) {
            prefetch_tensor_map(&tma_q);
            prefetch_tensor_map(&tma_do);
            mbarrier_arrive_expect_tx(layout.kv_full(), Traits::kKVBytes + Traits::kVBytes);
            load_tile<Traits>(layout.k(), &tma_k, layout.kv_full(), work.seq.k_start + n0, work.head_k,
                              work.k_batch(params), Traits::kKVBlockBytes);
            load_tile<Traits, Traits::kColBlocksV>(layout.v(), &tma_v, layout.kv_full(), work.seq.k_start + n0,
                                                   work.head_k, work.k_batch(params), Traits::kKVBlockBytes);
        }
        // A step's row stats (LSE, D; rows past the sequence: LSE -inf, so
        // p = 0, and D 0) are read from global memory a step ahead, into
        // registers: a read takes ~1500 clocks under the kernel's load, and
        // issued where they are stored it held back the copies behind it
        // (round 42's trace: d256's dO copy, which the next dP waits for).
        constexpr int kRowsPerLane = (kBlockM + 31) / 32;
        struct RowStats {
            float lse[kRowsPerLane], dsum[kRowsPerLane];
        };
        auto read_stats = [&](int t) {
            RowStats rows;
            const int m0 = work.m0_of(t);
            const int64_t stats = work.batch * params.lse_batch_stride +
                                  work.head_of(params, t) * params.lse_head_stride + work.seq.q_start + m0;
#pragma unroll
            for (int i = 0; i < kRowsPerLane; ++i) {
                const int r = lane + 32 * i;
                const bool valid = r < kBlockM && m0 + r < work.seq.seqlen_q;
                rows.lse[i] = valid ? params.lse_ptr[stats + r] : -INFINITY;
                rows.dsum[i] = valid ? params.dsum_ptr[stats + r] : 0.f;
            }
            return rows;
        };
        RowStats next_rows = read_stats(0);
        for (int t = 0; t < work.steps; ++t) {
            const StageOf<Traits> s(t);
            const int head = work.head_of(params, t);
            const int m0 = work.m0_of(t);
            const RowStats rows = next_rows;
            if (t + 1 < work.steps) next_rows = read_stats(t + 1);
            // A stage's first use needs no release; its u-th waits for release u - 1.
            if (t >= kStages) mbarrier_wait(layout.empty(s.stage), s.phase ^ 1);
            // Q and dO first (their own barrier, completed by the copies' bytes),
            // then the row stats (rows past the sequence get lse_log2 = +inf, so
            // p = 0, and D = 0) on a barrier of thread arrivals only: each lane's
            // arrival releases its own stores (and, for a tile that reaches past
            // a packed sequence, the zeros of its rows there, BwdWork: the
            // consumers wait for stats_full before their wgmma read that tile).
            // dO rides in Q's stage unless it has a ring of its own (kDoStages: below).
            constexpr bool kDoWithQ = Traits::kDoStages == 0;
            if (lane == 0) {
                mbarrier_arrive_expect_tx(layout.full(s.stage), Traits::kQBytes + (kDoWithQ ? Traits::kDoBytes : 0));
                load_tile<Traits>(layout.q(s.stage), &tma_q, layout.full(s.stage), work.seq.q_start + m0, head,
                                  work.q_batch(params), Traits::kQBlockBytes);
                if constexpr (kDoWithQ) {
                    load_tile<Traits, Traits::kColBlocksV>(layout.dout(s.stage), &tma_do, layout.full(s.stage),
                                                           work.seq.q_start + m0, head, work.q_batch(params),
                                                           Traits::kQBlockBytes);
                }
            }
#pragma unroll
            for (int i = 0; i < kRowsPerLane; ++i) {
                const int r = lane + 32 * i;
                if (r >= kBlockM) break;
                store_shared_f32(layout.lse_log2(s.stage) + 4 * r, lse_to_log2(rows.lse[i]));
                if constexpr (kDoWithQ) store_shared_f32(layout.dsum(s.stage) + 4 * r, rows.dsum[i]);
            }
            if (work.zeroes_query_rows(params, t)) {
                mbarrier_wait(layout.full(s.stage), s.phase);  // the copies' rows are there to overwrite
                const int first_row = work.seq.seqlen_q - m0;
                if constexpr (kDoWithQ) {
                    zero_rows<Traits, kBlockM>(layout.q(s.stage), layout.dout(s.stage), Traits::kQBlockBytes,
                                               first_row, lane, 32);
                } else {
                    zero_tile_rows<Traits::kColBlocks, 0, kBlockM>(layout.q(s.stage), 0, Traits::kQBlockBytes,
                                                                   first_row, lane, 32);
                }
                fence_proxy_async_shared();  // the zeros are read by wgmma (async proxy) after the arrival
            }
            mbarrier_arrive(layout.stats_full(s.stage));
            if constexpr (!kDoWithQ) {
                // dO and D of step t in dO's ring, the same way: a stage
                // waits for its release (do_empty), the copy completes
                // do_full, the lanes' D (and zeros) do_stats_full.
                const StageOf<Traits, Traits::kDoStages> d(t);
                if (t >= Traits::kDoStages) mbarrier_wait(layout.do_empty(d.stage), d.phase ^ 1);
                if (lane == 0) {
                    mbarrier_arrive_expect_tx(layout.do_full(d.stage), Traits::kDoBytes);
                    load_tile<Traits, Traits::kColBlocksV>(layout.dout(d.stage), &tma_do, layout.do_full(d.stage),
                                                           work.seq.q_start + m0, head, work.q_batch(params),
                                                           Traits::kQBlockBytes);
                }
#pragma unroll
                for (int i = 0; i < kRowsPerLane; ++i) {
                    const int r = lane + 32 * i;
                    if (r >= kBlockM) break;
                    store_shared_f32(layout.dsum(d.stage) + 4 * r, rows.dsum[i]);
                }
                if (work.zeroes_query_rows(params, t)) {
                    mbarrier_wait(layout.do_full(d.stage), d.phase);
                    zero_tile_rows<Traits::kColBlocksV, 0, kBlockM>(layout.dout(d.stage), 0, Traits::kQBlockBytes,
                                                                    work.seq.seqlen_q - m0, lane, 32);
                    fence_proxy_async_shared();
                }
                mbarrier_arrive(layout.do_stats_full(d.stage));
            }
        }
        return;
    }

    if constexpr (Traits::kSlice) {
        claim_registers<Traits::kConsumerRegs>();
        if (warpgroup == 1) {
            bwd_slice_consumer<Traits, Is_local, Has_softcap, /*kWarpgroup=*/0>(params, layout);
        } else {
            bwd_slice_consumer<Traits, Is_local, Has_softcap, /*kWarpgroup=*/1>(params, layout);
        }
    } else if constexpr (Traits::kSplit) {
        claim_registers<Traits::kConsumerRegs>();
        if (warpgroup == 1) {
            bwd_split_consumer<Traits, Is_local, Has_softcap, Is_deterministic, /*kRole=*/0>(params, layout,
                                                                                          &tma_dq_accum);
        } else {
            bwd_split_consumer<Traits, Is_local, Has_softcap, Is_deterministic, /*kRole=*/1>(params, layout,
                                                                                          &tma_dq_accum);
        }
    } else if (warpgroup - 1 == Traits::kDqOwner) {
        // Consumers: warpgroup 1 + kDqOwner owns dQ and takes the registers
        // for it (split: both compute half of it, with the same registers).
        claim_registers<Traits::kDqOwnerRegs>();
        bwd_consumer<Traits, Is_local, Has_softcap, Is_deterministic, Traits::kDqOwner>(params, layout, &tma_dq_accum);
    } else {
        claim_registers<Traits::kKeyRegs>();
        bwd_consumer<Traits, Is_local, Has_softcap, Is_deterministic, 1 - Traits::kDqOwner>(params, layout,
                                                                                           &tma_dq_accum);
    }
}

}  // namespace flash::sm90
