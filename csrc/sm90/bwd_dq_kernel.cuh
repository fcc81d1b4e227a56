// The d256 backward's dQ kernel (kernel_traits.h: BwdDqTraits), in both
// modes. The main kernel (bwd_kernel.cuh, BwdSliceTraits) computes dK and dV
// over key tiles; this one computes dQ over query tiles, as the forward
// computes O: a block owns 128 queries of one query head, each consumer
// warpgroup 64 of them, and walks the key tiles those queries see
// (mask.cuh: key_tile_range), 64 keys a step:
//   S = Q K^T and dP = dO V^T (both operands from shared memory);
//   P = exp2(S * scale - LSE) from the saved LSE, masked where a query misses
//     a key (capped first with softcap), and dS = P (dP - D);
//   dQ += dS K, dS from registers (the accumulator's layout is wgmma's A
//     fragment), issued before the next step's S and dP so that it runs
//     while they are issued.
// dQ stays in fp32 registers from the first key tile to the last, so every
// row's sum runs in one order on every call: bitwise reproducible without
// atomics, semaphores or a grid order, at the price of S and dP computed a
// second time (the main kernel computes them too). It costs less than adding
// each step's dQ from the main kernel, which sent 64 KB of fp32 adds a step
// (benchmarks/NOTES.md, rounds 34 and 36).
//
// The producer warp copies Q and dO once (their row stats with them), then
// each step's K (two stages) and V (one: dP reads it early in the step, and
// the next step's V lands while the dQ GEMM still reads K). A block whose
// queries see no key writes zeros. dQ is scaled, rounded to the input dtype,
// staged in the warpgroup's own rows of Q (its S GEMMs are done) and written
// 16 bytes a thread, a warp a whole row; rows past the sequence and columns
// past the head dim are not written.
//
// The kernel is launched behind the main kernel with programmatic stream
// serialization (bwd_launch.cuh): it reads nothing the main kernel writes, so
// its blocks start as soon as the main kernel's last blocks have started, on
// the SMs they leave idle, and each waits for the main kernel only before it
// exits.
//
// Variable-length batches: Q and dO rows past a packed sequence belong to
// other sequences and only reach rows that are not written (each row's dQ
// depends on its own Q and dO rows alone); key rows past it (K and V) are
// zeroed in shared memory before any GEMM reads them, since a P of 0 does not
// cancel a NaN there (0 * NaN), as bwd_kernel.cuh's BwdWork does for its
// tiles.
#pragma once

#include <cuda.h>

#include <cmath>
#include <cstdint>

#include "common/flash.h"
#include "common/mask.cuh"
#include "common/ptx.cuh"
#include "common/softmax.cuh"
#include "sm90/bwd_kernel.cuh"
#include "sm90/kernel_traits.h"
#include "sm90/parts.cuh"
#include "sm90/pipeline.cuh"
#include "sm90/ptx.cuh"

namespace flash::sm90 {

template <typename Traits>
struct BwdDqSmem {
    uint32_t base;

    __device__ __forceinline__ explicit BwdDqSmem(const char* smem) {
        base = aligned_smem_base<Traits::kSmemAlign>(smem);
    }
    __device__ __forceinline__ uint32_t q() const { return base + Traits::kSmemQOffset; }
    __device__ __forceinline__ uint32_t dout() const { return base + Traits::kSmemDoOffset; }
    __device__ __forceinline__ uint32_t k(int stage) const { return base + Traits::kSmemKOffset + stage * Traits::kKVBytes; }
    __device__ __forceinline__ uint32_t v(int stage) const { return base + Traits::kSmemVOffset + stage * Traits::kKVBytes; }
    __device__ __forceinline__ uint32_t lse_log2() const { return base + Traits::kSmemRowStatsOffset; }
    __device__ __forceinline__ uint32_t dsum() const { return lse_log2() + Traits::kBlockM * 4; }
    __device__ __forceinline__ uint32_t barrier(int i) const { return base + Traits::kSmemBarrierOffset + 8 * i; }
    __device__ __forceinline__ uint32_t q_full() const { return barrier(0); }      // Q and dO (copy bytes)
    __device__ __forceinline__ uint32_t stats_full() const { return barrier(1); }  // the producer's 32 lanes
    __device__ __forceinline__ uint32_t k_full(int stage) const { return barrier(2 + stage); }
    __device__ __forceinline__ uint32_t k_empty(int stage) const { return barrier(2 + Traits::kKStages + stage); }
    __device__ __forceinline__ uint32_t v_full(int stage) const { return barrier(2 + 2 * Traits::kKStages + stage); }
    __device__ __forceinline__ uint32_t v_empty(int stage) const {
        return barrier(2 + 2 * Traits::kKStages + Traits::kVStages + stage);
    }
};

// A block's queries: its query tile (the longest walks first under a mask),
// query head and sequence, and the key tiles they see (the grid:
// schedule.h's backward_grid, taken from the last query tile to the first);
// in the grid's split tail (schedule.h: TailSplit) the part's share of them.
template <typename Traits, bool Is_local>
struct BwdDqWork {
    int m_block, head, batch;
    int part, parts, slot;  // 0 of 1 but in the tail
    Sequence seq;
    Window window;
    KeyTileRange key_tiles;

    __device__ __forceinline__ explicit BwdDqWork(const BwdParams& params) {
        const TileOfGrid block = backward_grid_tile<Is_local, /*kLastFirst=*/true>(
            (params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM, params.num_heads, params.tail_first,
            params.tail_parts, static_cast<int>(blockIdx.x));
        m_block = block.tile;
        head = block.head;
        batch = block.batch;
        part = block.part;
        parts = block.parts;
        slot = block.slot;
        seq = sequence_of<false>(params, batch);
        window = window_of(params, seq.seqlen_q, seq.seqlen_k);
        key_tiles = m0() < seq.seqlen_q ? key_tile_range<Traits::kBlockM, Traits::kBlockN>(m0(), seq.seqlen_q, window)
                                        : KeyTileRange{0, 0, 0, 0};
        if constexpr (!Is_local) {  // a masked grid has no split tail (schedule.h: backward_grid)
            const StepsOfPart share = steps_of_part(key_tiles.n_end - key_tiles.n_begin, part, parts);
            key_tiles.n_end = key_tiles.n_begin + share.end;
            key_tiles.n_begin += share.begin;
        }
    }
    __device__ __forceinline__ int m0() const { return m_block * Traits::kBlockM; }
    __device__ __forceinline__ bool has_rows() const { return m0() < seq.seqlen_q; }
    __device__ __forceinline__ int steps() const { return key_tiles.n_end - key_tiles.n_begin; }
    __device__ __forceinline__ int head_k(const BwdParams& params) const { return head / params.heads_per_kv_head; }
    __device__ __forceinline__ int q_batch(const BwdParams& params) const {
        return params.cu_seqlens_q == nullptr ? batch : 0;
    }
    __device__ __forceinline__ int k_batch(const BwdParams& params) const {
        return params.cu_seqlens_k == nullptr ? batch : 0;
    }
    // Key tile n reaches past a packed sequence's keys (BwdWork::zeroes_key_rows).
    __device__ __forceinline__ bool zeroes_key_rows(const BwdParams& params, int n_block) const {
        return params.cu_seqlens_k != nullptr && (n_block + 1) * Traits::kBlockN > seq.seqlen_k;
    }
};

template <typename Traits, bool Is_local, bool Has_softcap>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    bwd_dq_kernel(const __grid_constant__ BwdParams params, const __grid_constant__ CUtensorMap tma_q,
                  const __grid_constant__ CUtensorMap tma_k, const __grid_constant__ CUtensorMap tma_v,
                  const __grid_constant__ CUtensorMap tma_do) {
    using Element = typename Traits::Element;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kNTilesS = Traits::kNTilesS;
    constexpr int kNTilesDq = Traits::kNTilesDq;
    constexpr int kConsumerThreads = Traits::kConsumerWarpgroups * 128;

    extern __shared__ char smem[];
    const BwdDqSmem<Traits> layout(smem);

    if (threadIdx.x == 0) {
        mbarrier_init(layout.q_full(), 1);
        mbarrier_init(layout.stats_full(), 32);
        // Empty: one arrival per consumer warp once its GEMM reading the stage is complete.
        for (int stage = 0; stage < Traits::kKStages; ++stage) {
            mbarrier_init(layout.k_full(stage), 1);
            mbarrier_init(layout.k_empty(stage), kConsumerThreads / 32);
        }
        for (int stage = 0; stage < Traits::kVStages; ++stage) {
            mbarrier_init(layout.v_full(stage), 1);
            mbarrier_init(layout.v_empty(stage), kConsumerThreads / 32);
        }
        fence_barrier_init();
    }
    __syncthreads();

    const int warpgroup = threadIdx.x / 128;
    if (warpgroup == 0) {
        // Producer: warp 0 copies; the rest of the warpgroup exits.
        release_registers<Traits::kProducerRegs>();
        const BwdDqWork<Traits, Is_local> work(params);
        if (threadIdx.x >= 32 || work.steps() == 0) return;
        const int lane = threadIdx.x;
        const int m0 = work.m0();
        const int head_k = work.head_k(params);
        if (lane == 0) {
            prefetch_tensor_map(&tma_k);
            prefetch_tensor_map(&tma_v);
            mbarrier_arrive_expect_tx(layout.q_full(), 2 * Traits::kQBytes);
            load_tile<Traits>(layout.q(), &tma_q, layout.q_full(), work.seq.q_start + m0, work.head,
                              work.q_batch(params), Traits::kQBlockBytes);
            load_tile<Traits>(layout.dout(), &tma_do, layout.q_full(), work.seq.q_start + m0, work.head,
                              work.q_batch(params), Traits::kQBlockBytes);
        }
        // Rows past the sequence: lse_log2 = +inf (p = 0) and D = 0.
        const int64_t stats = work.batch * params.lse_batch_stride + work.head * params.lse_head_stride +
                              work.seq.q_start + m0;
        for (int r = lane; r < kBlockM; r += 32) {
            const bool valid = m0 + r < work.seq.seqlen_q;
            store_shared_f32(layout.lse_log2() + 4 * r, lse_to_log2(valid ? params.lse_ptr[stats + r] : -INFINITY));
            store_shared_f32(layout.dsum() + 4 * r, valid ? params.dsum_ptr[stats + r] : 0.f);
        }
        mbarrier_arrive(layout.stats_full());
        for (int i = 0; i < work.steps(); ++i) {
            const int n0 = (work.key_tiles.n_begin + i) * kBlockN;
            const StageOf<Traits, Traits::kKStages> ks(i);
            const StageOf<Traits, Traits::kVStages> vs(i);
            // A stage's first use needs no release; its u-th waits for release u - 1.
            if (i >= Traits::kKStages) mbarrier_wait(layout.k_empty(ks.stage), ks.phase ^ 1);
            if (lane == 0) {
                mbarrier_arrive_expect_tx(layout.k_full(ks.stage), Traits::kKVBytes);
                load_tile<Traits>(layout.k(ks.stage), &tma_k, layout.k_full(ks.stage), work.seq.k_start + n0, head_k,
                                  work.k_batch(params), Traits::kKVBlockBytes);
            }
            if (i >= Traits::kVStages) mbarrier_wait(layout.v_empty(vs.stage), vs.phase ^ 1);
            if (lane == 0) {
                mbarrier_arrive_expect_tx(layout.v_full(vs.stage), Traits::kKVBytes);
                load_tile<Traits>(layout.v(vs.stage), &tma_v, layout.v_full(vs.stage), work.seq.k_start + n0, head_k,
                                  work.k_batch(params), Traits::kKVBlockBytes);
            }
        }
        return;
    }

    claim_registers<Traits::kConsumerRegs>();
    // Warp-uniform to the compiler (through the shuffle): the descriptors derived from it.
    const int consumer = __shfl_sync(0xffffffffu, warpgroup - 1, 0);
    const int lane = threadIdx.x % 32;
    const int warp_in_group = (threadIdx.x / 32) % 4;
    const int row0 = consumer * Traits::kWarpgroupRows + warp_in_group * 16;  // this warp's first row of the block
    const BwdDqWork<Traits, Is_local> work(params);
    // Launched behind the main kernel, which it may overlap (bwd_launch.cuh),
    // the block waits for it before it exits: the grid completes after it.
    if (!work.has_rows()) {
        wait_for_prerequisite_grids();
        return;
    }
    const int m0 = work.m0();

    float dq[1][kNTilesDq][4];
#pragma unroll
    for (int r = 0; r < kNTilesDq * 4; ++r) flat(dq)[r] = 0.f;

    if (work.steps() > 0) {
        // Q and dO (K-major): this warpgroup's 64 rows of each column block.
        const uint32_t rows = consumer * Traits::kWarpgroupRows * kSwizzleBytes;
        const uint64_t q_desc = smem_descriptor_sw128(layout.q() + rows, kUnusedLeadingBytes, kSwizzleAtomBytes);
        const uint64_t do_desc = smem_descriptor_sw128(layout.dout() + rows, kUnusedLeadingBytes, kSwizzleAtomBytes);
        // S = Q K^T or dP = dO V^T: A this warpgroup's rows, B the stage's 64 keys (K-major), over the head dim.
        auto issue_scores = [&](float (&acc)[1][kNTilesS][4], uint64_t a_desc, uint32_t b_tile) {
            const uint64_t b_desc = smem_descriptor_sw128(b_tile, kUnusedLeadingBytes, kSwizzleAtomBytes);
            issue_scores_k_major<Element, kBlockN, Traits::kKStepsD, Traits::kQBlockBytes, Traits::kKVBlockBytes>(
                acc, a_desc, b_desc);
        };
        // dQ += dS K: A dS from registers (k16 step k: n8 blocks 2k and 2k + 1),
        // B the stage's K read MN-major (the keys are K, the head dim N: column
        // blocks of 64, kKVBlockBytes apart).
        uint32_t ds[Traits::kKStepsN][4];
        auto issue_dq = [&](uint32_t k_tile) {
            const uint64_t b_desc = smem_descriptor_sw128(k_tile, Traits::kKVBlockBytes, kSwizzleAtomBytes);
            wgmma_fence();
#pragma unroll
            for (int k = 0; k < Traits::kKStepsN; ++k) {
                Wgmma<Traits::kHeadDim>::template rs<Element>(flat(dq), ds[k],
                                                              advance_descriptor(b_desc, k * 16 * kSwizzleBytes),
                                                              /*scale_d=*/1);
            }
            wgmma_commit();
        };
        auto release = [&](uint32_t empty) {
            if (lane == 0) mbarrier_arrive(empty);
        };

        mbarrier_wait(layout.q_full(), 0);
        mbarrier_wait(layout.stats_full(), 0);
        const uint32_t stats_row = 4 * (row0 + lane / 4);
        const float lse[2] = {load_shared_f32(layout.lse_log2() + stats_row),
                              load_shared_f32(layout.lse_log2() + stats_row + 32)};
        const float dsum[2] = {load_shared_f32(layout.dsum() + stats_row), load_shared_f32(layout.dsum() + stats_row + 32)};

#pragma unroll 1
        for (int i = 0; i < work.steps(); ++i) {
            const int n_block = work.key_tiles.n_begin + i;
            const int n0 = n_block * kBlockN;
            const StageOf<Traits, Traits::kKStages> ks(i);
            const StageOf<Traits, Traits::kVStages> vs(i);
            mbarrier_wait(layout.k_full(ks.stage), ks.phase);
            if (work.zeroes_key_rows(params, n_block)) {  // uniform across the consumers: both zero, then both go
                mbarrier_wait(layout.v_full(vs.stage), vs.phase);
                zero_tile_rows<Traits::kColBlocks, Traits::kColBlocks, kBlockN>(
                    layout.k(ks.stage), layout.v(vs.stage), Traits::kKVBlockBytes, work.seq.seqlen_k - n0,
                    threadIdx.x - 128, kConsumerThreads);
                fence_proxy_async_shared();  // the zeros are read by wgmma (async proxy) after the barrier
                named_barrier_sync(1, kConsumerThreads);
            }
            float s[1][kNTilesS][4];
            float dp[1][kNTilesS][4];
            issue_scores(s, q_desc, layout.k(ks.stage));
            mbarrier_wait(layout.v_full(vs.stage), vs.phase);
            issue_scores(dp, do_desc, layout.v(vs.stage));
            // The last step's dQ GEMM and this step's S are complete: K of the last step is free.
            wgmma_wait<1>();
            pin_registers(flat(s));
            if (i > 0) release(layout.k_empty(StageOf<Traits, Traits::kKStages>(i - 1).stage));
            cap_rows<Has_softcap>(s, params);  // P and dS as the dK/dV kernel makes them (bwd_kernel.cuh)
            if (!tile_is_full<kBlockM, kBlockN>(m0, n0, work.seq.seqlen_q, work.window)) {
                apply_mask<Is_local>(s, m0 + row0, n0, work.window, lane);
            }
            exponentiate_rows<Has_softcap>(s, params, lse);
            wgmma_wait<0>();
            pin_registers(flat(dp));
            release(layout.v_empty(vs.stage));
            ds_rows<Has_softcap>(s, dp, params, lse, dsum);
#pragma unroll
            for (int k = 0; k < Traits::kKStepsN; ++k) {
                ds[k][0] = pack2<Element>(dp[0][2 * k][0], dp[0][2 * k][1]);
                ds[k][1] = pack2<Element>(dp[0][2 * k][2], dp[0][2 * k][3]);
                ds[k][2] = pack2<Element>(dp[0][2 * k + 1][0], dp[0][2 * k + 1][1]);
                ds[k][3] = pack2<Element>(dp[0][2 * k + 1][2], dp[0][2 * k + 1][3]);
            }
            issue_dq(layout.k(ks.stage));
        }
        wgmma_wait<0>();
        pin_registers(flat(dq));
    }

    // A part of a split item (schedule.h: TailSplit) hands its dQ on
    // (parts.cuh); the last part writes the item's.
    if (!Is_local && work.parts > 1) {
        const int part_barrier = 4 + consumer;  // this warpgroup's own
        const PartHandOn<Traits::kPartValues> hand_on(params, work.slot, work.part, work.parts, consumer,
                                                      Traits::kConsumerWarpgroups);
        hand_on.wait();
        hand_on.add(flat(dq), 0);
        if (!hand_on.last()) {
            hand_on.store(flat(dq), 0);
            hand_on.count(part_barrier);
            wait_for_prerequisite_grids();
            return;
        }
        hand_on.reset(part_barrier);
    }

    // Epilogue: dQ times the softmax scale, in 16 bits, staged in this
    // warpgroup's 64 rows of Q (K-major column blocks of 128-byte swizzled
    // rows; only its own GEMMs read them, and they are complete) by stmatrix:
    // n8 blocks j and j + 1, rows 0-7 and 8-15 of the warp, lane 8r + i giving
    // matrix r's row i. Then 16 bytes a thread, a warp a whole 512-byte row.
    const uint32_t staged = layout.q() + consumer * Traits::kWarpgroupRows * kSwizzleBytes;
    {
        const int r = lane / 8;
        const int row = warp_in_group * 16 + (r % 2) * 8 + lane % 8;  // of the warpgroup's 64
        const float scale = params.softmax_scale;
#pragma unroll
        for (int j = 0; j < kNTilesDq; j += 2) {
            const int col = (j + r / 2) * 8;
            stmatrix_x4(swizzled_address(staged + (col / kSwizzleCols) * Traits::kQBlockBytes, row,
                                         (col % kSwizzleCols) * 2),
                        pack2<Element>(dq[0][j][0] * scale, dq[0][j][1] * scale),
                        pack2<Element>(dq[0][j][2] * scale, dq[0][j][3] * scale),
                        pack2<Element>(dq[0][j + 1][0] * scale, dq[0][j + 1][1] * scale),
                        pack2<Element>(dq[0][j + 1][2] * scale, dq[0][j + 1][3] * scale));
        }
    }
    named_barrier_sync(2 + consumer, 128);
    Element* const dq_out = static_cast<Element*>(params.dq_ptr) + work.batch * params.dq_batch_stride +
                            work.head * params.dq_head_stride;
    constexpr int kChunksPerRow = Traits::kHeadDim / 8;  // 16-byte chunks of a row
    const int first_row = m0 + consumer * Traits::kWarpgroupRows;
    for (int c = threadIdx.x % 128; c < Traits::kWarpgroupRows * kChunksPerRow; c += 128) {
        const int row = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
        if (first_row + row >= work.seq.seqlen_q) break;  // the rows go in order: the rest are past it too
        if (col < params.head_dim) {
            const uint32_t at = swizzled_address(staged + (col / kSwizzleCols) * Traits::kQBlockBytes, row,
                                                 (col % kSwizzleCols) * 2);
            *reinterpret_cast<float4*>(dq_out + (work.seq.q_start + int64_t{first_row} + row) * params.dq_row_stride +
                                       col) = load_shared_f32x4(at);
        }
    }
    wait_for_prerequisite_grids();
}

}  // namespace flash::sm90
