// The append (and rotary) launch, whose kernel is in kvcache.cuh, and the
// split-KV heuristic.
#include <algorithm>
#include <array>

#include "flash.h"
#include "kernel_traits.h"
#include "kvcache.cuh"
#include "static_switch.h"

namespace flash {

// Splits: as many blocks as the SMs hold at once (their shared memory and
// threads), never more -- a second, partial wave would cost a whole block's
// time -- and at least kMinTilesPerSplit key tiles per split (the combine reads
// every split's fp32 rows back).
int kvcache_num_splits(const FwdParams& params, int max_keys, int sms) {
    constexpr int kMinTilesPerSplit = 8;
    int device = 0, smem_per_sm = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) != cudaSuccess) {
        return 1;
    }
    const bool decode = params.seqlen_q <= kDecodeRows;
    const auto [rows, keys, threads, smem] = FLASH_HEADDIM_SWITCH(params.head_dim, kHeadDim, [&] {
        using Decode = DecodeTraits<kHeadDim, __half>;
        using Tiled = KvcacheTraits<kHeadDim, __half>;
        return decode ? std::array<int, 4>{Decode::kRows, Decode::kBlockN, Decode::kNThreads, Decode::kSmemBytes}
                      : std::array<int, 4>{Tiled::kBlockM, Tiled::kBlockN, Tiled::kNThreads, Tiled::kSmemBytes};
    });
    const int per_sm = std::max(1, std::min({smem_per_sm / (smem + 1024), 2048 / threads, 32}));
    const int64_t blocks = static_cast<int64_t>(params.batch) * params.num_heads * ((params.seqlen_q + rows - 1) / rows);
    const int64_t tiles = (static_cast<int64_t>(max_keys) + keys - 1) / keys;
    const int64_t fill = static_cast<int64_t>(per_sm) * sms / blocks;
    return static_cast<int>(std::max<int64_t>(1, std::min({fill, tiles / kMinTilesPerSplit, int64_t{kMaxKvSplits}})));
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
