// Launches the forward kernel for one (dtype, head dim, local, extras) instantiation.
#pragma once

#include "flash.h"
#include "decode_kernel.cuh"
#include "fwd_kernel.cuh"
#include "kernel_traits.h"
#include "kvcache.cuh"

namespace flash {

template <typename Traits, bool Is_local, bool Has_extras, bool Is_kvcache = false>
cudaError_t launch_fwd(const FwdParams& params, cudaStream_t stream) {
    auto kernel = &fwd_kernel<Traits, Is_local, Has_extras, Is_kvcache>;
    constexpr int kSmem = Traits::kSmemBytes;
    if (kSmem > params.max_smem_per_block) return cudaErrorInvalidConfiguration;
    // Dynamic shared memory above 48 KB must be opted into per kernel.
    if (kSmem > 48 * 1024) {
        cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
        if (err != cudaSuccess) return err;
    }
    const int splits = Is_kvcache ? params.num_splits : 1;
    const dim3 grid((params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM * splits, params.num_heads,
                    params.batch);
    kernel<<<grid, Traits::kNThreads, kSmem, stream>>>(params);
    return cudaGetLastError();
}

template <typename Element, int kHeadDim, bool Is_local, bool Has_extras>
cudaError_t run_fwd_(const FwdParams& params, cudaStream_t stream) {
    using Fast = FwdTraitsFor<kHeadDim, Element>;
    using Small = FwdTraitsFor<kHeadDim, Element, FwdSmallSmemConfig<kHeadDim>>;
    static_assert(Small::kSmemBytes <= kSmallSmemPerBlock, "the small-smem config must fit sm_86/sm_89");
    if constexpr (Fast::kSmemBytes <= kSmallSmemPerBlock) {
        return launch_fwd<Fast, Is_local, Has_extras>(params, stream);
    } else {
        return params.max_smem_per_block >= Fast::kSmemBytes
                   ? launch_fwd<Fast, Is_local, Has_extras>(params, stream)
                   : launch_fwd<Small, Is_local, Has_extras>(params, stream);
    }
}

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
// combine kernel beyond.
template <typename Element, int kHeadDim>
cudaError_t run_fwd_kvcache_(const FwdParams& params, const CombineParams& combine, cudaStream_t stream) {
    if (params.seqlen_q <= kDecodeRows) {
        return params.decode_wide ? launch_decode<DecodeTraits<kHeadDim, Element, true>>(params, stream)
                                  : launch_decode<DecodeTraits<kHeadDim, Element, false>>(params, stream);
    }
    using Traits = KvcacheTraits<kHeadDim, Element>;
    static_assert(Traits::kSmemBytes <= kSmallSmemPerBlock, "the KV-cache config must fit sm_86/sm_89");
    const cudaError_t err =
        launch_fwd<Traits, /*Is_local=*/true, /*Has_extras=*/true, /*Is_kvcache=*/true>(params, stream);
    if (err != cudaSuccess || params.num_splits <= 1) return err;
    const int64_t rows = static_cast<int64_t>(combine.batch) * combine.num_heads * combine.seqlen_q;
    kvcache_combine_kernel<Element><<<static_cast<unsigned>(rows), kCombineWarps * 32, 0, stream>>>(combine);
    return cudaGetLastError();
}

}  // namespace flash
