// The sm80 family's KV-cache entry points (sm80.h): the plan (GQA packing,
// split-KV, block shape), the append launch and the forward's dispatch.
#include <algorithm>
#include <array>

#include "common/flash.h"
#include "common/static_switch.h"
#include "sm80/kvcache/append.cuh"
#include "sm80/kvcache/kvcache_traits.h"
#include "sm80/sm80.h"

namespace flash::sm80 {

// Defined in instantiations/sm80_fwd_kvcache_*.cu (kvcache_launch.cuh).
template <typename Element, int kHeadDim>
cudaError_t run_fwd_kvcache_(const FwdParams& params, cudaStream_t stream);
template <typename Element, int kHeadDim>
cudaError_t run_fwd_kvcache_fp8_(const FwdParams& params, cudaStream_t stream);

// fp8_cache_head_dim(head_dim) as a compile-time constant for `body`.
template <typename Body>
auto fp8_cache_head_dim_switch(int head_dim, Body&& body) {
    switch (fp8_cache_head_dim(head_dim)) {
        case 64: return body.template operator()<64>();
        case 128: return body.template operator()<128>();
        case 192: return body.template operator()<192>();
        default: return body.template operator()<256>();
    }
}

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

// The decoding kernel (up to kDecodeRows rows per (batch, head)), from sweeps
// of block shape x splits on the H100 (benchmarks/NOTES.md, d5-d8; an FP8
// cache: Dense only, below), with n = batch x heads blocks per split:
//  - n below the SM count: split until there is one Wide block per SM (the
//    most bytes in flight per block; two blocks sharing an SM, or a second
//    wave, cost more than the few idle SMs);
//  - more: no split; Dense while every block is resident at once, Wide where
//    Dense would leave a short second wave (up to two waves of Wide), Dense
//    again beyond (many waves, where its three blocks per SM stream best).
// The tiled forward (more rows) fills the SMs once, at least 8 tiles a split.
struct SplitPlan {
    int num_splits;
    bool decode_wide;
};

SplitPlan plan_splits(const FwdParams& params, int max_keys, int requested) {
    int device = 0, sms = 1, smem_per_sm = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) != cudaSuccess) {
        return {std::max(1, requested), false};
    }
    const bool decode = params.seqlen_q <= kDecodeRows;
    std::array<BlockShape, 3> shapes = FLASH_HEADDIM_SWITCH(params.head_dim, kHeadDim, [&] {
        return std::array<BlockShape, 3>{shape_of<DecodeTraits<kHeadDim, __half, true>>(kDecodeRows),
                                         shape_of<DecodeTraits<kHeadDim, __half, false>>(kDecodeRows),
                                         shape_of<KvcacheTraits<kHeadDim, __half>>(KvcacheTraits<kHeadDim, __half>::kBlockM)};
    });
    if (params.kv_fp8) {  // an FP8 cache's decoding blocks (Dense only, below; run_fwd_kvcache_fp8_)
        fp8_cache_head_dim_switch(params.head_dim, [&]<int kHeadDim>() {
            shapes[1] = shape_of<DecodeTraits<kHeadDim, __half, false, true>>(kDecodeRows);
        });
    }
    const auto& [wide, dense, tiled] = shapes;
    const BlockShape& shape = decode ? dense : tiled;
    const int64_t n = static_cast<int64_t>(params.batch) * params.num_heads * ((params.seqlen_q + shape.rows - 1) / shape.rows);
    const int64_t tiles = (static_cast<int64_t>(max_keys) + shape.keys - 1) / shape.keys;
    if (!decode) {
        const int64_t fill = static_cast<int64_t>(blocks_per_sm(tiled, smem_per_sm)) * sms / n;
        const int splits = requested > 0 ? requested : static_cast<int>(std::min(fill, tiles / 8));
        return {std::max(1, std::min(splits, kMaxKvSplits)), false};
    }
    // An FP8 cache's blocks convert every byte they read into 16-bit operands: one block of four
    // warps per SM cannot hide that work (round 30: 2.8 TB/s where Dense blocks three to an SM
    // reached 3.7), so it always runs Dense, split to fill the SMs' Dense slots.
    const bool wide_fits = !params.kv_fp8 && wide.smem <= params.max_smem_per_block;
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

// Decoding with GQA packs the group's query heads as the rows of one block (q
// and out seen as [B, G, Hk, D], lse's (h, i) as (hk, g)); ALiBi's slopes
// differ per query head, so it does not pack.
void pack_gqa(FwdParams& params) {
    const int group = params.heads_per_kv_head;
    params.pack_gqa = kvcache_packs_gqa(params.seqlen_q, group, params.alibi_slopes_ptr != nullptr);
    if (!params.pack_gqa) return;
    params.seqlen_q = group;
    params.num_heads = params.num_heads_k;
    params.heads_per_kv_head = 1;
    params.q_row_stride = params.q_head_stride, params.q_head_stride *= group;
    params.o_row_stride = params.o_head_stride, params.o_head_stride *= group;
    params.lse_head_stride *= group;  // one query row: the head stride is the row stride
    params.total_q = params.batch * group;
}

}  // namespace

KvcacheWorkspace plan_kvcache(FwdParams& params, int64_t requested_splits) {
    pack_gqa(params);
    const int requested = static_cast<int>(std::clamp<int64_t>(requested_splits, 0, kMaxKvSplits));
    const SplitPlan plan = plan_splits(params, params.kv_capacity, requested);
    params.num_splits = plan.num_splits;
    params.decode_wide = plan.decode_wide;
    if (params.num_splits <= 1) return {0, 0, 0};
    const int64_t rows = static_cast<int64_t>(params.num_splits) * params.batch * params.num_heads * params.seqlen_q;
    const bool decode = params.seqlen_q <= kDecodeRows;  // the decoding kernel merges its own splits
    return {rows * params.head_dim_v, rows, decode ? static_cast<int64_t>(params.batch) * params.num_heads : 0};
}

cudaError_t run_kvcache_append(const AppendParams& params, cudaStream_t stream) {
    const int64_t pairs = params.head_dim / 2;
    const int64_t threads =
        static_cast<int64_t>(params.batch) * params.seqlen_knew * params.num_heads_k * pairs +
        (params.q_rot_ptr == nullptr ? 0 : static_cast<int64_t>(params.batch) * params.seqlen_q * params.num_heads * pairs);
    if (threads == 0) return cudaSuccess;
    return FLASH_DTYPE_SWITCH(params.dtype, Element, [&] {
        const unsigned blocks = static_cast<unsigned>((threads + 255) / 256);
        if (params.kv_fp8) {
            kvcache_append_kernel<Element, true><<<blocks, 256, 0, stream>>>(params);
        } else {
            kvcache_append_kernel<Element, false><<<blocks, 256, 0, stream>>>(params);
        }
        return cudaGetLastError();
    });
}

cudaError_t run_fwd_kvcache(const FwdParams& params, cudaStream_t stream) {
    if (params.kv_fp8) {
        return FLASH_DTYPE_SWITCH(params.dtype, Element, [&] {
            return fp8_cache_head_dim_switch(params.head_dim, [&]<int kHeadDim>() {
                return run_fwd_kvcache_fp8_<Element, kHeadDim>(params, stream);
            });
        });
    }
    return FLASH_DTYPE_SWITCH(params.dtype, Element, [&] {
        return FLASH_HEADDIM_SWITCH(params.head_dim, kHeadDim, [&] {
            return run_fwd_kvcache_<Element, kHeadDim>(params, stream);
        });
    });
}

}  // namespace flash::sm80
