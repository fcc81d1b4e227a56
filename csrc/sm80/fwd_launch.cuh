// Launches the sm80 forward kernel for one (dtype, head dim, local, extras)
// instantiation (instantiations/sm80_fwd_*.cu).
#pragma once

#include "common/flash.h"
#include "sm80/fwd_kernel.cuh"
#include "sm80/kernel_traits.h"

namespace flash::sm80 {

template <typename Traits, bool Is_local, bool Has_extras, bool Is_kvcache = false, bool Is_paged = false>
cudaError_t launch_fwd(const FwdParams& params, cudaStream_t stream) {
    auto kernel = &fwd_kernel<Traits, Is_local, Has_extras, Is_kvcache, Is_paged>;
    // The KV-cache kernels stage block-table entries after the tiles (kvcache/kv_rows.cuh).
    constexpr int kSmem = Traits::kSmemBytes + (Is_kvcache ? PageEntryStage<Traits::kBlockN>::kBytes : 0);
    if (kSmem > params.max_smem_per_block) return cudaErrorInvalidConfiguration;
    // Dynamic shared memory above 48 KB must be opted into per kernel.
    if (kSmem > 48 * 1024) {
        cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
        if (err != cudaSuccess) return err;
    }
    const int splits = Is_kvcache ? params.num_splits : 1;
    // O in column chunks: a block per kHeadDimV of V's columns (fwd_kernel.cuh).
    const int v_chunks = Traits::v_chunks(params.head_dim_v);
    const dim3 grid((params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM * splits * v_chunks, params.num_heads,
                    params.batch);
    kernel<<<grid, Traits::kNThreads, kSmem, stream>>>(params);
    return cudaGetLastError();
}

// The fastest tile config of the head dim whose shared memory the device has.
template <typename Element, int kHeadDim, bool Is_local, bool Has_extras, bool Is_kvcache = false,
          bool Is_paged = false>
cudaError_t launch_fwd_fastest(const FwdParams& params, cudaStream_t stream) {
    using Fast = FwdTraitsFor<kHeadDim, Element>;
    using Small = FwdTraitsFor<kHeadDim, Element, FwdSmallSmemConfig<kHeadDim>>;
    constexpr int kStaged = Is_kvcache ? PageEntryStage<Fast::kBlockN>::kBytes : 0;
    static_assert(Small::kSmemBytes + kStaged <= kSmallSmemPerBlock, "the small-smem config must fit sm_86/sm_89");
    if constexpr (Fast::kSmemBytes + kStaged <= kSmallSmemPerBlock) {
        return launch_fwd<Fast, Is_local, Has_extras, Is_kvcache, Is_paged>(params, stream);
    } else {
        return params.max_smem_per_block >= Fast::kSmemBytes + kStaged
                   ? launch_fwd<Fast, Is_local, Has_extras, Is_kvcache, Is_paged>(params, stream)
                   : launch_fwd<Small, Is_local, Has_extras, Is_kvcache, Is_paged>(params, stream);
    }
}

template <typename Element, int kHeadDim, bool Is_local, bool Has_extras>
cudaError_t run_fwd_(const FwdParams& params, cudaStream_t stream) {
    return launch_fwd_fastest<Element, kHeadDim, Is_local, Has_extras>(params, stream);
}

// A paged variable-length batch (block_table): the kernel that reads keys
// through the block table, in the forward's tile config, with the window
// decided at run time. The extras are compiled in only where asked for (the
// extras variant alone costs 6-9%), the copies only for pages
// (benchmarks/NOTES.md, paged v5).
template <typename Element, int kHeadDim, bool Has_extras>
cudaError_t run_fwd_paged_(const FwdParams& params, cudaStream_t stream) {
    return launch_fwd_fastest<Element, kHeadDim, /*Is_local=*/true, Has_extras, /*Is_kvcache=*/true,
                              /*Is_paged=*/true>(params, stream);
}

}  // namespace flash::sm80
