// Warp-level GEMMs on mma.sync m16n8k16 fragments.
//
// Accumulators are [kMTiles][kNTiles][4] fp32 fragments: m16 tile `mt`, n8 tile
// `j`; a thread holds rows lane/4 and lane/4 + 8, columns 2*(lane%4) and +1.
// Tiles in shared memory are SmemTile<rows, cols> of 16-bit elements.
#pragma once

#include <cstdint>

#include "sm80/kernel_traits.h"
#include "common/ptx.cuh"
#include "sm80/ptx.cuh"

namespace flash::sm80 {

template <int kMTiles, int kNTiles>
__device__ __forceinline__ void clear(float (&acc)[kMTiles][kNTiles][4]) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int j = 0; j < kNTiles; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][j][e] = 0.f;
}

template <int kMTiles, int kNTiles>
__device__ __forceinline__ void scale(float (&acc)[kMTiles][kNTiles][4], float factor) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int j = 0; j < kNTiles; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][j][e] *= factor;
}

// One k16 step into n8 tiles 2jp and 2jp + 1 of every m16 tile: `b` is the
// ldmatrix.x4 of B that holds both n8 tiles (regs 0-1, then 2-3), `a` the A
// fragment of each m16 tile. The loop every GEMM below ends in.
template <typename Element, int kMTiles, int kNTiles>
__device__ __forceinline__ void mma_n_pair(float (&acc)[kMTiles][kNTiles][4], const uint32_t (&a)[kMTiles][4],
                                           const uint32_t (&b)[4], int jp) {
    const uint32_t b_lo[2] = {b[0], b[1]};
    const uint32_t b_hi[2] = {b[2], b[3]};
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
        mma_m16n8k16<Element>(acc[mt][2 * jp], a[mt], b_lo);
        mma_m16n8k16<Element>(acc[mt][2 * jp + 1], a[mt], b_hi);
    }
}

// acc[m][n] += sum_k A[m][k] * B[n][k], both operands row-major in shared memory:
// A = rows a_row0 .. a_row0 + 16*kMTiles of ATile, B = rows b_row0 .. b_row0 +
// 8*kNTiles of BTile (b_row0 a multiple of 8), k over the first 16*kKSteps
// columns of both. (Q K^T, dO V^T, K Q^T ...) An odd kNTiles takes its last n8
// tile with ldmatrix.x2 (one n8 tile: the head dim 512 backward's S^T).
template <typename Element, int kMTiles, int kNTiles, int kKSteps, typename ATile, typename BTile>
__device__ __forceinline__ void gemm_smem_smem(float (&acc)[kMTiles][kNTiles][4], uint32_t a_smem, int a_row0,
                                               uint32_t b_smem, int b_row0, int lane) {
    // ldmatrix.x4 lane roles. A: matrices {rows 0-7, 8-15} x {k 0-7, 8-15}. B,
    // stored [n][k] (already the "col" operand): matrices {n 0-7} x {k 0-7, 8-15},
    // then {n 8-15} x {k 0-7, 8-15}; ldmatrix.x2 reads the first two, from
    // lanes 0-15's addresses, which are the same.
    const auto a_lane = ATile::lane_offsets(a_row0 + lane % 16, lane / 16);
    const auto b_lane = BTile::lane_offsets(b_row0 + (lane / 16) * 8 + lane % 8, (lane / 8) % 2);
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
        uint32_t a[kMTiles][4];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
            ldmatrix_x4(a[mt], a_smem + ATile::offset(a_lane, mt * 16, kk * 2));
        }
#pragma unroll
        for (int jp = 0; jp < kNTiles / 2; ++jp) {
            uint32_t b[4];
            ldmatrix_x4(b, b_smem + BTile::offset(b_lane, jp * 16, kk * 2));
            mma_n_pair<Element>(acc, a, b, jp);
        }
        if constexpr (kNTiles % 2 == 1) {
            uint32_t b[2];
            ldmatrix_x2(b, b_smem + BTile::offset(b_lane, (kNTiles - 1) * 8, kk * 2));
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) mma_m16n8k16<Element>(acc[mt][kNTiles - 1], a[mt], b);
        }
    }
}

// acc[m][n] += sum_k A[m][k] * B[k][n] with A in registers: the fp32 accumulator
// fragment `a` of an earlier GEMM (its n8 tiles 2kk, 2kk+1 are the k16 step kk),
// rounded to 16 bits, is exactly the A-operand fragment of this mma. B = rows
// (k) 0 .. 16*kKSteps of BTile, columns (n) 0 .. 8*kNTiles, read transposed by
// ldmatrix.trans. (P V, P^T dO, dS^T Q, dS K ...)
template <typename Element, int kMTiles, int kNTiles, int kKSteps, typename BTile>
__device__ __forceinline__ void gemm_regs_smem(float (&acc)[kMTiles][kNTiles][4],
                                               const float (&a)[kMTiles][2 * kKSteps][4], uint32_t b_smem,
                                               int lane) {
    static_assert(kNTiles % 2 == 0, "ldmatrix.x4 loads two n8 tiles of B");
    // ldmatrix.x4.trans on B stored [k][n]: matrices {k 0-7, 8-15} x {n 0-7}, then
    // {k 0-7, 8-15} x {n 8-15}; .trans hands each lane two k of one n.
    const auto b_lane = BTile::lane_offsets(((lane / 8) % 2) * 8 + lane % 8, lane / 16);
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
        uint32_t a_frag[kMTiles][4];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
            a_frag[mt][0] = pack2<Element>(a[mt][2 * kk][0], a[mt][2 * kk][1]);
            a_frag[mt][1] = pack2<Element>(a[mt][2 * kk][2], a[mt][2 * kk][3]);
            a_frag[mt][2] = pack2<Element>(a[mt][2 * kk + 1][0], a[mt][2 * kk + 1][1]);
            a_frag[mt][3] = pack2<Element>(a[mt][2 * kk + 1][2], a[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int jp = 0; jp < kNTiles / 2; ++jp) {
            uint32_t b[4];
            ldmatrix_x4_trans(b, b_smem + BTile::offset(b_lane, kk * 16, jp * 2));
            mma_n_pair<Element>(acc, a_frag, b, jp);
        }
    }
}

// acc[m][n] += sum_k A[m][k] * B[k][n] with both operands in shared memory and
// k over the first 16*kKSteps rows of B. A is row-major [m][k] with this warp's
// m at rows a_m0 .. a_m0 + 16*kMTiles, or, kATransposed, stored [k][m] with
// them at columns a_m0 .. (a multiple of 16); B is [k][n] with the warp's n from
// column 8*n_tile0 on (n_tile0 even). Both read by ldmatrix, B (and a stored-
// transposed A) with .trans. (dV = P^T dO, dK = dS^T Q, dQ = dS K from the P^T
// and dS^T tiles of the dK/dV pass.)
template <typename Element, bool kATransposed, int kMTiles, int kNTiles, int kKSteps, typename ATile,
          typename BTile>
__device__ __forceinline__ void gemm_smem_kn(float (&acc)[kMTiles][kNTiles][4], uint32_t a_smem, int a_m0,
                                             uint32_t b_smem, int n_tile0, int lane) {
    static_assert(kNTiles % 2 == 0, "ldmatrix.x4 loads two n8 tiles of B");
    // A fragment matrices {m 0-7, 8-15} x {k 0-7, 8-15}: row-major, lanes 0-15
    // give rows m at chunk k/8 = 0, lanes 16-31 at chunk 1; stored transposed,
    // lanes address rows k (0-7, then 8-15 for lanes 16-31) at chunk m/8 = 0
    // (lanes 0-7, 16-23) or 1, and .trans hands back the row-major fragment.
    const auto a_lane = kATransposed ? ATile::lane_offsets((lane / 16) * 8 + lane % 8, (lane / 8) % 2, a_m0 / 8)
                                     : ATile::lane_offsets(a_m0 + lane % 16, lane / 16);
    const auto b_lane = BTile::lane_offsets(((lane / 8) % 2) * 8 + lane % 8, lane / 16, n_tile0);
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
        uint32_t a[kMTiles][4];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
            if constexpr (kATransposed) {
                ldmatrix_x4_trans(a[mt], a_smem + ATile::offset(a_lane, kk * 16, mt * 2));
            } else {
                ldmatrix_x4(a[mt], a_smem + ATile::offset(a_lane, mt * 16, kk * 2));
            }
        }
#pragma unroll
        for (int jp = 0; jp < kNTiles / 2; ++jp) {
            uint32_t b[4];
            ldmatrix_x4_trans(b, b_smem + BTile::offset(b_lane, kk * 16, jp * 2));
            mma_n_pair<Element>(acc, a, b, jp);
        }
    }
}

// Writes an accumulator fragment, rounded to 16 bits, into rows row0 .. row0 +
// 16*kMTiles and columns from 8*chunk0 on of a shared-memory tile (to be stored
// to global memory with 16-byte writes by TileCopy, or read by a later GEMM).
template <typename Element, typename Tile, int kMTiles, int kNTiles>
__device__ __forceinline__ void store_fragment(const float (&acc)[kMTiles][kNTiles][4], char* smem_tile, int row0,
                                               int chunk0, int lane) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = row0 + mt * 16 + half * 8 + lane / 4;
#pragma unroll
            for (int j = 0; j < kNTiles; ++j) {
                *reinterpret_cast<uint32_t*>(smem_tile + Tile::offset(row, chunk0 + j) + (lane % 4) * 4) =
                    pack2<Element>(acc[mt][j][2 * half], acc[mt][j][2 * half + 1]);
            }
        }
    }
}

}  // namespace flash::sm80
