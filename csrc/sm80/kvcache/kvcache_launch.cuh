// Launches the sm80 KV-cache forward for one (dtype, head dim) instantiation
// (instantiations/sm80_fwd_kvcache_*.cu): the decoding kernel or the tiled
// forward, then the merge of the splits.
#pragma once

#include "common/flash.h"
#include "sm80/fwd_launch.cuh"
#include "sm80/kvcache/decode_kernel.cuh"
#include "sm80/kvcache/kvcache_traits.h"
#include "sm80/kvcache/merge.cuh"

namespace flash::sm80 {

template <typename Traits>
cudaError_t launch_decode(const FwdParams& params, cudaStream_t stream) {
    auto kernel = &decode_kernel<Traits>;
    constexpr int kSmem = Traits::kSmemBytes;
    if (kSmem > params.max_smem_per_block) return cudaErrorInvalidConfiguration;
    if (kSmem > 48 * 1024) {
        cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
        if (err != cudaSuccess) return err;
    }
    kernel<<<dim3(params.num_splits, params.num_heads, params.batch), Traits::kNThreads, kSmem, stream>>>(params);
    return cudaGetLastError();
}

// The KV-cache forward: the decoding kernel for up to kDecodeRows rows per
// (batch, head) (it merges its own splits), the tiled forward and then the
// merge of its splits beyond.
template <typename Element, int kHeadDim>
cudaError_t run_fwd_kvcache_(const FwdParams& params, cudaStream_t stream) {
    if (params.seqlen_q <= kDecodeRows) {
        return params.decode_wide ? launch_decode<DecodeTraits<kHeadDim, Element, true>>(params, stream)
                                  : launch_decode<DecodeTraits<kHeadDim, Element, false>>(params, stream);
    }
    using Traits = KvcacheTraits<kHeadDim, Element>;
    static_assert(Traits::kSmemBytes + PageEntryStage<Traits::kBlockN>::kBytes <= kSmallSmemPerBlock,
                  "the KV-cache config must fit sm_86/sm_89");
    const cudaError_t err =
        launch_fwd<Traits, /*Is_local=*/true, /*Has_extras=*/true, /*Is_kvcache=*/true>(params, stream);
    if (err != cudaSuccess || params.num_splits <= 1) return err;
    merge_splits_kernel<Element><<<static_cast<unsigned>(merge_splits_blocks(params)), kMergeThreads, 0, stream>>>(params);
    return cudaGetLastError();
}

// The KV-cache forward over an FP8 cache (FwdParams::kv_fp8): the decoding
// kernel only (up to kDecodeRows rows per (batch, head) after GQA packing),
// on Dense blocks only (kvcache.cu: plan_splits); more rows are refused
// (flashattn/fp8.py sends them the dequantising route).
template <typename Element, int kHeadDim>
cudaError_t run_fwd_kvcache_fp8_(const FwdParams& params, cudaStream_t stream) {
    if (params.seqlen_q > kDecodeRows || params.decode_wide) return cudaErrorNotSupported;
    return launch_decode<DecodeTraits<kHeadDim, Element, false, true>>(params, stream);
}

}  // namespace flash::sm80
