// The append (and rotary) launch, whose kernel is in kvcache.cuh, and the
// split-KV heuristic.
#include <algorithm>
#include <array>

#include "flash.h"
#include "kernel_traits.h"
#include "kvcache.cuh"
#include "static_switch.h"

namespace flash {

namespace {

struct BlockShape {
    int rows, keys, threads, smem;
};

template <typename Traits>
BlockShape shape_of(int rows) {
    return {rows, Traits::kBlockN, Traits::kNThreads, Traits::kSmemBytes};
}

// Blocks of `shape` one SM holds at once (shared memory, threads), at least 1.
int blocks_per_sm(const BlockShape& shape, int smem_per_sm) {
    return std::max(1, std::min({smem_per_sm / (shape.smem + 1024), 2048 / shape.threads, 32}));
}

// An even share of whole tiles per split, without splits left empty.
int even_splits(int64_t tiles, int64_t splits) {
    splits = std::max<int64_t>(1, std::min<int64_t>({splits, tiles, kMaxKvSplits}));
    const int64_t per_split = (tiles + splits - 1) / splits;
    return static_cast<int>((tiles + per_split - 1) / per_split);
}

}  // namespace

// The decoding kernel (up to kDecodeRows rows per (batch, head)), from sweeps
// of block shape x splits on the H100 (benchmarks/NOTES.md, d5-d8), with n =
// batch x heads blocks per split:
//  - n below the SM count: split until there is one Wide block per SM (the
//    most bytes in flight per block; two blocks sharing an SM, or a second
//    wave, cost more than the few idle SMs);
//  - more: no split; Dense while every block is resident at once, Wide where
//    Dense would leave a short second wave (up to two waves of Wide), Dense
//    again beyond (many waves, where its three blocks per SM stream best).
// The tiled forward (more rows) fills the SMs once, at least 8 tiles a split.
KvcachePlan kvcache_plan(const FwdParams& params, int max_keys, int requested) {
    int device = 0, sms = 1, smem_per_sm = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) != cudaSuccess) {
        return {std::max(1, std::min(requested, kMaxKvSplits)), false};
    }
    const bool decode = params.seqlen_q <= kDecodeRows;
    const auto [wide, dense, tiled] = FLASH_HEADDIM_SWITCH(params.head_dim, kHeadDim, [&] {
        return std::array<BlockShape, 3>{shape_of<DecodeTraits<kHeadDim, __half, true>>(kDecodeRows),
                                         shape_of<DecodeTraits<kHeadDim, __half, false>>(kDecodeRows),
                                         shape_of<KvcacheTraits<kHeadDim, __half>>(KvcacheTraits<kHeadDim, __half>::kBlockM)};
    });
    const BlockShape& shape = decode ? dense : tiled;
    const int64_t n = static_cast<int64_t>(params.batch) * params.num_heads * ((params.seqlen_q + shape.rows - 1) / shape.rows);
    const int64_t tiles = (static_cast<int64_t>(max_keys) + shape.keys - 1) / shape.keys;
    if (!decode) {
        const int64_t fill = static_cast<int64_t>(blocks_per_sm(tiled, smem_per_sm)) * sms / n;
        const int splits = requested > 0 ? requested : static_cast<int>(std::min(fill, tiles / 8));
        return {std::max(1, std::min(splits, kMaxKvSplits)), false};
    }
    const bool wide_fits = wide.smem <= params.max_smem_per_block;
    const int64_t dense_slots = static_cast<int64_t>(blocks_per_sm(dense, smem_per_sm)) * sms;
    const int64_t wide_slots = static_cast<int64_t>(blocks_per_sm(wide, smem_per_sm)) * sms;
    int64_t splits = requested;
    if (splits <= 0) {
        const int64_t fill = n >= sms ? 1 : (wide_fits ? sms : dense_slots) / n;
        splits = even_splits(tiles, std::min(fill, std::max<int64_t>(1, tiles / 2)));
    }
    splits = std::max<int64_t>(1, std::min<int64_t>(splits, kMaxKvSplits));
    const int64_t blocks = n * splits;
    return {static_cast<int>(splits),
            wide_fits && (blocks <= sms || (blocks > dense_slots && blocks < 2 * wide_slots))};
}

cudaError_t run_kvcache_append(const AppendParams& params, cudaStream_t stream) {
    const int64_t pairs = params.head_dim / 2;
    const int64_t threads =
        static_cast<int64_t>(params.batch) * params.seqlen_knew * params.num_heads_k * pairs +
        (params.q_rot_ptr == nullptr ? 0 : static_cast<int64_t>(params.batch) * params.seqlen_q * params.num_heads * pairs);
    if (threads == 0) return cudaSuccess;
    return FLASH_DTYPE_SWITCH(params.dtype, Element, [&] {
        kvcache_append_kernel<Element><<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream>>>(params);
        return cudaGetLastError();
    });
}

}  // namespace flash
