// FP8 attention's values (kernel_traits.h: FwdTraits::kFp8): the layout of v
// that the FP8 forward kernel reads, and the kernel that writes it.
//
// In 8 bits wgmma takes both operands K-major, so the B operand of O += P V
// must have the keys contiguous: V^T. And P must reach the A operand from the
// scores' accumulator, whose layout differs from the k32 A fragment's: for row
// r and the 32 keys of a k32 step, a thread (t = lane % 4) holds keys {2t,
// 2t+1, 8+2t, 9+2t} and the same 16 further (the m16n8 accumulator over four n8
// blocks), while the A fragment wants k indices {4t .. 4t+3} and the same 16
// further. The kernel puts its own eight values there as they are (fwd_kernel.cuh:
// pack_p) and the values are stored with their keys permuted the same way
// within each block of 32: k index kk of a block holds key value_key(kk). A
// GEMM sums over k, so the order of the keys does not change O; it saves the
// shuffles that would move P between lanes.
//
// The layout: v of each KV head transposed to [head_dim_v rows,
// value_columns] (8 bits), the sequences one after the other, sequence b's
// keys from column value_key_start(b) (16-byte aligned), its columns up to the
// next multiple of kFp8KeyTile written (zeros past its keys), so that a key tile
// that reaches past a sequence's end reads zeros (no NaN bit pattern of the
// next sequence's values can meet a P of 0). Where the kernel does not write
// its V^T tiles itself (d256; kernel_traits.h: kValuesInKernel), written by
// transpose_values once per call and read by the kernel's bulk tensor copies
// (tensor_map.cu); at d128 the kernel's producer warps write each tile in the
// same order and swizzle (fwd_kernel.cuh: transpose_value_tile).
#pragma once

#include <cstdint>

#include "common/flash.h"

namespace flash::sm90 {

// The largest key tile of the FP8 kernels (FwdTraits::kBlockN); a call's
// sequences have their columns written up to a multiple of its kernel's.
constexpr int kFp8KeyTile = 192;
constexpr int kFp8KeyBlock = 32;  // the keys of one k32 step, within which they are permuted
// Sequence b starts at the multiple of 16 from its first key's row, plus b
// times this: a start rounded up by at most 15 and kFp8KeyTile - 1 columns
// past its keys fit before the next sequence's start.
constexpr int kFp8SequenceGap = 208;
static_assert(kFp8SequenceGap % 16 == 0 && kFp8SequenceGap >= 15 + kFp8KeyTile - 1, "aligned, disjoint sequences");

// The key whose value k index kk of a 32-key block holds: kk = 16 h + 4 t + s
// holds key 16 h + 8 (s / 2) + 2 t + s % 2 (a bijection of 0..31).
__host__ __device__ constexpr int value_key(int kk) {
    return (kk / 16) * 16 + ((kk % 4) / 2) * 8 + ((kk % 16) / 4) * 2 + kk % 2;
}

// The first column of sequence b's keys: its first key's row (cu_seqlens_k of
// a packed batch, else b seqlen_k) rounded up to 16, plus b kFp8SequenceGap.
__device__ __forceinline__ int value_key_start(const FwdParams& params, int batch) {
    const int row = params.cu_seqlens_k != nullptr ? params.cu_seqlens_k[batch] : batch * params.seqlen_k;
    return (row + 15) / 16 * 16 + batch * kFp8SequenceGap;
}

// Columns of the layout: every key's and the gaps, 16-byte rows.
inline int64_t value_columns(const FwdParams& params) {
    const int64_t keys = params.cu_seqlens_k != nullptr ? params.total_k
                                                        : static_cast<int64_t>(params.batch) * params.seqlen_k;
    return (keys + static_cast<int64_t>(params.batch) * kFp8SequenceGap + 15) / 16 * 16;
}

// The layout's bytes for a call: num_heads_k x head_dim_v rows of value_columns.
inline int64_t value_bytes(const FwdParams& params) {
    return static_cast<int64_t>(params.num_heads_k) * params.head_dim_v * value_columns(params);
}

// One block: 64 columns of one KV head of one sequence (blockIdx.x: which 64
// of its columns, blockIdx.y the head, blockIdx.z the sequence), all
// head_dim_v rows; a sequence's columns up to a multiple of the kernel's key
// tile (key_tile, a multiple of 64), those past its keys zeros. The block reads
// its keys' rows of v (16 bytes a thread; keys past the sequence as zeros) into
// shared memory, rows 4 bytes longer than v's so that the words of one column
// that a warp reads from different rows fall in distinct banks; then each
// thread writes 4 columns of 4 rows: the 4 keys that 4 consecutive columns
// hold (value_key: keys k, k + 1, k + 8, k + 9 of a block of 32) read as one
// word of 4 head-dim rows each, the 4 x 4 bytes transposed with byte permutes.
constexpr int kTransposeKeys = 64;
constexpr int kTransposeThreads = 256;
static_assert(kFp8KeyTile % kTransposeKeys == 0 && kTransposeKeys % kFp8KeyBlock == 0, "whole blocks of keys");
static_assert(value_key(1) == value_key(0) + 1 && value_key(2) == value_key(0) + 8 && value_key(3) == value_key(0) + 9,
              "4 consecutive columns hold keys k, k + 1, k + 8, k + 9 (and the same at every multiple of 4)");

// (A template, for one definition across the instantiations that launch it.)
template <int kKeys = kTransposeKeys>
__global__ void __launch_bounds__(kTransposeThreads)
    transpose_values(const __grid_constant__ FwdParams params, int64_t columns, int key_tile) {
    static_assert(kKeys == kTransposeKeys, "one block's keys");
    extern __shared__ uint32_t rows[];  // [kTransposeKeys][head_dim_v / 4 + 1] words
    const int batch = blockIdx.z, head = blockIdx.y;
    const int dv = params.head_dim_v;  // a multiple of 16
    const int row_words = dv / 4 + 1;
    const int seqlen = params.cu_seqlens_k != nullptr
                           ? params.cu_seqlens_k[batch + 1] - params.cu_seqlens_k[batch]
                           : params.seqlen_k;
    const int key0 = blockIdx.x * kTransposeKeys;  // of the sequence
    // Past the sequence's last tile: no kernel reads it (the next sequence's columns, or none).
    if (key0 >= (seqlen + key_tile - 1) / key_tile * key_tile) return;
    const int row_start = params.cu_seqlens_k != nullptr ? params.cu_seqlens_k[batch] : 0;
    const uint8_t* v = static_cast<const uint8_t*>(params.v_ptr) + batch * params.v_batch_stride +
                       head * params.v_head_stride;
    // Load: thread i takes 16-byte chunk i % (dv / 16) of key i / (dv / 16), in turn.
    const int chunks = dv / 16;
    for (int i = threadIdx.x; i < kTransposeKeys * chunks; i += kTransposeThreads) {
        const int key = key0 + i / chunks, chunk = i % chunks;
        uint4 value = make_uint4(0, 0, 0, 0);
        if (key < seqlen) {
            value = *reinterpret_cast<const uint4*>(v + static_cast<int64_t>(row_start + key) * params.v_row_stride +
                                                    16 * chunk);
        }
        uint32_t* row = rows + (i / chunks) * row_words + 4 * chunk;
        row[0] = value.x, row[1] = value.y, row[2] = value.z, row[3] = value.w;
    }
    __syncthreads();
    // Store: thread i takes the 4 columns 4 (i % 16) .. + 3 of rows 4 (i / 16) .. + 3.
    uint8_t* vt = static_cast<uint8_t*>(params.vt_ptr) + static_cast<int64_t>(head) * dv * columns +
                  value_key_start(params, batch) + key0;
    constexpr int kWords = kTransposeKeys / 4;  // of a row of the block's columns
    for (int i = threadIdx.x; i < (dv / 4) * kWords; i += kTransposeThreads) {
        const int word = i / kWords, c0 = 4 * (i % kWords);  // 4 head-dim rows from 4 word; 4 columns from c0
        const int k = c0 - c0 % kFp8KeyBlock + value_key(c0 % kFp8KeyBlock);
        const uint32_t w0 = rows[k * row_words + word], w1 = rows[(k + 1) * row_words + word];
        const uint32_t w2 = rows[(k + 8) * row_words + word], w3 = rows[(k + 9) * row_words + word];
        // Row r of the 4 gets byte r of w0, w1, w2, w3, in that order.
        const uint32_t lo01 = __byte_perm(w0, w1, 0x5140), hi01 = __byte_perm(w0, w1, 0x7362);
        const uint32_t lo23 = __byte_perm(w2, w3, 0x5140), hi23 = __byte_perm(w2, w3, 0x7362);
        const uint32_t out[4] = {__byte_perm(lo01, lo23, 0x5410), __byte_perm(lo01, lo23, 0x7632),
                                 __byte_perm(hi01, hi23, 0x5410), __byte_perm(hi01, hi23, 0x7632)};
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            *reinterpret_cast<uint32_t*>(vt + static_cast<int64_t>(4 * word + r) * columns + c0) = out[r];
        }
    }
}

static_assert(value_key(0) == 0 && value_key(1) == 1 && value_key(2) == 8 && value_key(3) == 9 &&
                  value_key(4) == 2 && value_key(15) == 15 && value_key(16) == 16 && value_key(18) == 24 &&
                  value_key(31) == 31,
              "the k32 A fragment's k index against the accumulator's key");

}  // namespace flash::sm90
