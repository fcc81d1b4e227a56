// What the sm90 forward and backward kernels share around their pipelines:
// the aligned base of the block's shared memory, the (stage, phase) of a ring
// of kStages buffers, and the copy of a tile by the bulk tensor copy.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "sm90/kernel_traits.h"
#include "sm90/ptx.cuh"

namespace flash::sm90 {

// The shared address of the dynamic shared memory `smem`, rounded up to
// kAlign bytes (the swizzle atom the tiles' layouts start on).
template <int kAlign>
__device__ __forceinline__ uint32_t aligned_smem_base(const char* smem) {
    return (smem_addr(smem) + kAlign - 1) & ~static_cast<uint32_t>(kAlign - 1);
}

// The i-th use (0, 1, ...) of a ring of kStages buffers (by default
// Traits::kStages) takes stage i % kStages for the (i / kStages)-th time: the
// phase of that stage's barriers to wait for.
template <typename Traits, int kStages = Traits::kStages>
struct StageOf {
    int stage;
    uint32_t phase;
    __device__ __forceinline__ explicit StageOf(int i) : stage(i % kStages), phase((i / kStages) & 1) {}
};

// Copies a tile of rows `row`.. of a [head dim, rows, heads, batch] tensor
// map into `dst`, one box per column block of 128 bytes (block_bytes apart),
// the bytes counted on barrier `bar`: kColBlocks blocks, by default the head
// dim's (Traits::kColBlocks; a narrower V's tiles pass Traits::kColBlocksV).
template <typename Traits, int kColBlocks = Traits::kColBlocks>
__device__ __forceinline__ void load_tile(uint32_t dst, const CUtensorMap* map, uint32_t bar, int row, int head,
                                          int batch, int block_bytes) {
#pragma unroll
    for (int cb = 0; cb < kColBlocks; ++cb) {
        constexpr int kBlockCols = kSwizzleBytes / static_cast<int>(sizeof(typename Traits::Element));
        tma_load_4d(dst + cb * block_bytes, map, bar, cb * kBlockCols, row, head, batch);
    }
}

}  // namespace flash::sm90
