// The decoding kernel's operands over an FP8 cache (DecodeTraits::kFp8Kv): K
// and V tiles stay e4m3 in shared memory (half the bytes of a 16-bit cache, so
// half the memory traffic that bounds decoding) and become 16-bit mma.sync
// fragments in registers, exactly (every e4m3 value is an fp16 and a bf16
// value).
//
// An 8-bit tile is laid out as a SmemTile of byte pairs (SmemTile<rows,
// head_dim / 2>), so ldmatrix reads it as it reads 16-bit tiles; each 32-bit
// register it hands a lane then holds four e4m3 values, which convert to two
// fragment registers. Which four, and in which k order they enter the mma:
//  - K (S = Q K^T, plain ldmatrix): lane (g, t) = (lane / 4, lane % 4) gets
//    key g's columns 4t .. 4t + 3 of a 16-column group. Converted as {4t, 4t +
//    2} and {4t + 1, 4t + 3}, they are the fragment's k slots {2t, 2t + 1} and
//    {2t + 8, 2t + 9}: slot s of the group is column 2s (s < 8) or 2(s - 8) + 1.
//    A dot product does not depend on the order of its terms, so Q is stored
//    with each 16-column group in that order (its even columns, then its odd
//    ones: load_q_deinterleaved) and the A fragments read from it match.
//  - V (O += P V, ldmatrix.trans on byte pairs): lane (g, t) gets keys 2t and
//    2t + 1 of columns 2g and 2g + 1. Converted as {2g of both keys} and {2g + 1
//    of both keys}, they are the B fragments of two n8 tiles: one of the group's
//    even columns, one of its odd ones. So accumulator tile 2c (c: the 16-column
//    group) holds columns 16c + 2n and tile 2c + 1 columns 16c + 2n + 1; a
//    lane's four values of a row are columns 16c + 4t .. + 3 (store_o_row).
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/ptx.cuh"
#include "sm80/gemm.cuh"
#include "sm80/ptx.cuh"

namespace flash::sm80 {

// The e4m3 values in bytes kFirst and kFirst + 2 of `word`, as a packed pair
// of 16-bit Element (byte kFirst low). A byte's magnitude bits shifted into the
// 16-bit layout read as the value times 2^-8 in fp16 (exponent bias 15 against
// 7) or 2^-120 in bf16 (127), subnormals included; one multiply by the power of
// two (exact) gives the value. The e4m3 NaN codes (0x7f, 0xff) read as +-480.
// Integer and half-precision instructions only (no cvt), so it runs on sm_80.
template <typename Element, int kFirst>
__device__ __forceinline__ uint32_t e4m3_pair(uint32_t word) {
    static_assert(kFirst == 0 || kFirst == 1, "the pairs are bytes {0, 2} and {1, 3}");
    // Bytes: the two values, each followed by its sign replicated (0x00 or 0xff).
    constexpr uint32_t kSelect = kFirst | (8 | kFirst) << 4 | (kFirst + 2) << 8 | (8 | (kFirst + 2)) << 12;
    uint32_t spread;
    asm("prmt.b32 %0, %1, 0, %2;\n" : "=r"(spread) : "r"(word), "n"(kSelect));
    uint32_t out;
    if constexpr (std::is_same_v<Element, __half>) {
        const uint32_t bits = (spread << 7) & 0xbf80bf80u;  // sign at bit 15, magnitude at bits 7..13
        asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(out) : "r"(bits), "r"(0x5c005c00u), "r"(0x80008000u));  // x 2^8
    } else {
        const uint32_t bits = (spread << 4) & 0x87f087f0u;  // sign at bit 15, magnitude at bits 4..10
        asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(out) : "r"(bits), "r"(0x7b807b80u), "r"(0x80008000u));  // x 2^120
    }
    return out;
}

// Q [rows, cols] (16-bit, row stride q_row_stride, 16-byte aligned rows) into
// QTile with each 16-column group's even columns in its first chunk and its odd
// columns in its second (the header's k order); rows at or past `rows` and
// groups at or past `cols` (a multiple of 16) are zeros. Plain loads: Q is
// small and read once.
template <typename QTile, int kNThreads, typename Element>
__device__ __forceinline__ void load_q_deinterleaved(char* q_smem, const Element* q, int64_t q_row_stride, int rows,
                                                     int cols, int tid) {
    constexpr int kGroups = QTile::kCols / 16;
    for (int idx = tid; idx < QTile::kRows * kGroups; idx += kNThreads) {
        const int row = idx / kGroups, group = idx % kGroups;
        uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
        if (row < rows && group * 16 < cols) {
            const uint4* src = reinterpret_cast<const uint4*>(q + row * q_row_stride + group * 16);
            lo = src[0];
            hi = src[1];
        }
        const uint32_t x[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};  // word i: columns 2i, 2i + 1
        uint32_t even[4], odd[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            asm("prmt.b32 %0, %1, %2, 0x5410;\n" : "=r"(even[i]) : "r"(x[2 * i]), "r"(x[2 * i + 1]));
            asm("prmt.b32 %0, %1, %2, 0x7632;\n" : "=r"(odd[i]) : "r"(x[2 * i]), "r"(x[2 * i + 1]));
        }
        *reinterpret_cast<uint4*>(q_smem + QTile::offset(row, 2 * group)) = make_uint4(even[0], even[1], even[2], even[3]);
        *reinterpret_cast<uint4*>(q_smem + QTile::offset(row, 2 * group + 1)) = make_uint4(odd[0], odd[1], odd[2], odd[3]);
    }
}

// acc (16 rows x 16 keys: n8 tiles 0, 1) += Q K^T over kKSteps k16 steps: Q the
// deinterleaved 16-bit QTile (rows 0-15), K the 8-bit KTile's rows key0 ..
// key0 + 15. One ldmatrix.x4 of K covers both n8 tiles for two k16 steps.
template <typename Element, int kKSteps, typename QTile, typename KTile>
__device__ __forceinline__ void gemm_q_k8(float (&acc)[1][2][4], uint32_t q_smem, uint32_t k_smem, int key0,
                                          int lane) {
    static_assert(kKSteps % 2 == 0, "K is read two 16-byte chunks at a time");
    const auto a_lane = QTile::lane_offsets(lane % 16, lane / 16);
    // Matrices: keys 0-7 at chunks c, c + 1, then keys 8-15 at chunks c, c + 1.
    const auto b_lane = KTile::lane_offsets(key0 + (lane / 16) * 8 + lane % 8, (lane / 8) % 2);
#pragma unroll
    for (int kp = 0; kp < kKSteps / 2; ++kp) {
        uint32_t b[4];
        ldmatrix_x4(b, k_smem + KTile::offset(b_lane, 0, 2 * kp));
#pragma unroll
        for (int s = 0; s < 2; ++s) {
            const int kk = 2 * kp + s;
            uint32_t a[4];
            ldmatrix_x4(a, q_smem + QTile::offset(a_lane, 0, 2 * kk));
            const uint32_t b_lo[2] = {e4m3_pair<Element, 0>(b[s]), e4m3_pair<Element, 1>(b[s])};
            const uint32_t b_hi[2] = {e4m3_pair<Element, 0>(b[2 + s]), e4m3_pair<Element, 1>(b[2 + s])};
            mma_m16n8k16<Element>(acc[0][0], a, b_lo);
            mma_m16n8k16<Element>(acc[0][1], a, b_hi);
        }
    }
}

// acc (16 rows x kNTilesO n8 tiles, in the header's column order) += P V over
// 16 keys: P the fp32 scores' fragment rounded to Element, V the 8-bit VTile's
// rows key0 .. key0 + 15. One ldmatrix.x4.trans covers two 16-column groups.
template <typename Element, int kNTilesO, typename VTile>
__device__ __forceinline__ void gemm_p_v8(float (&acc)[1][kNTilesO][4], const float (&p)[1][2][4], uint32_t v_smem,
                                          int key0, int lane) {
    static_assert(kNTilesO % 4 == 0, "V is read two 16-column groups at a time");
    const uint32_t a[4] = {pack2<Element>(p[0][0][0], p[0][0][1]), pack2<Element>(p[0][0][2], p[0][0][3]),
                           pack2<Element>(p[0][1][0], p[0][1][1]), pack2<Element>(p[0][1][2], p[0][1][3])};
    // Matrices: keys 0-7 and 8-15 at chunk c, then the same at chunk c + 1.
    const auto b_lane = VTile::lane_offsets(key0 + ((lane / 8) % 2) * 8 + lane % 8, lane / 16);
#pragma unroll
    for (int cp = 0; cp < kNTilesO / 4; ++cp) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, v_smem + VTile::offset(b_lane, 0, 2 * cp));
#pragma unroll
        for (int s = 0; s < 2; ++s) {
            const int group = 2 * cp + s;
            const uint32_t even[2] = {e4m3_pair<Element, 0>(b[2 * s]), e4m3_pair<Element, 0>(b[2 * s + 1])};
            const uint32_t odd[2] = {e4m3_pair<Element, 1>(b[2 * s]), e4m3_pair<Element, 1>(b[2 * s + 1])};
            mma_m16n8k16<Element>(acc[0][2 * group], a, even);
            mma_m16n8k16<Element>(acc[0][2 * group + 1], a, odd);
        }
    }
}

// One row half (`half`: fragment row lane / 4 or + 8) of an accumulator in the
// header's column order, times `weight`, into row_out (fp32, the row's true
// column order): the lane's columns 16c + 4t .. + 3 of every group c.
template <int kNTilesO>
__device__ __forceinline__ void store_o_row(float* row_out, const float (&o)[1][kNTilesO][4], int half, float weight,
                                            int lane) {
#pragma unroll
    for (int c = 0; c < kNTilesO / 2; ++c) {
        *reinterpret_cast<float4*>(row_out + 16 * c + 4 * (lane % 4)) =
            make_float4(o[0][2 * c][2 * half] * weight, o[0][2 * c + 1][2 * half] * weight,
                        o[0][2 * c][2 * half + 1] * weight, o[0][2 * c + 1][2 * half + 1] * weight);
    }
}

}  // namespace flash::sm80
