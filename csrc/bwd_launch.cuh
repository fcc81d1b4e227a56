// Launches the backward kernels for one (dtype, head dim, causal) instantiation.
#pragma once

#include "bwd_kernel.cuh"
#include "flash.h"
#include "kernel_traits.h"

namespace flash {

template <typename Kernel>
cudaError_t launch_with_smem(Kernel kernel, dim3 grid, int threads, int smem_bytes, const BwdParams& params,
                             cudaStream_t stream) {
    if (smem_bytes > params.max_smem_per_block) return cudaErrorInvalidConfiguration;
    // Dynamic shared memory above 48 KB must be opted into per kernel.
    if (smem_bytes > 48 * 1024) {
        cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
        if (err != cudaSuccess) return err;
    }
    kernel<<<grid, threads, smem_bytes, stream>>>(params);
    return cudaGetLastError();
}

// The dK/dV (and dQ) kernels of one tile config, after the preprocess.
template <typename Traits, bool Is_causal>
cudaError_t launch_bwd(const BwdParams& params, cudaStream_t stream) {
    constexpr int kSmem = Traits::kSmemBytesDkDv;
    const dim3 grid_kv((params.seqlen_k + Traits::kOwnRows - 1) / Traits::kOwnRows, params.num_heads_k,
                       params.batch);
    cudaError_t err;
    // Template flags: <Is_causal, Has_dK, Has_dV, Has_dQ>.
    if (params.deterministic) {
        if constexpr (Traits::kSplitDkDv) {
            err = launch_with_smem(&bwd_dk_dv_kernel<Traits, Is_causal, false, true, false>, grid_kv,
                                   Traits::kNThreads, kSmem, params, stream);
            if (err != cudaSuccess) return err;
            err = launch_with_smem(&bwd_dk_dv_kernel<Traits, Is_causal, true, false, false>, grid_kv,
                                   Traits::kNThreads, kSmem, params, stream);
        } else {
            err = launch_with_smem(&bwd_dk_dv_kernel<Traits, Is_causal, true, true, false>, grid_kv,
                                   Traits::kNThreads, kSmem, params, stream);
        }
        if (err != cudaSuccess) return err;
        const dim3 grid_q((params.seqlen_q + Traits::kOwnRows - 1) / Traits::kOwnRows, params.num_heads,
                          params.batch);
        using DqTraits = BwdKernelTraits<Traits::kHeadDim, typename Traits::Element,
                                         BwdDqConfig<typename Traits::Config>>;
        return launch_with_smem(&bwd_dq_kernel<DqTraits, Is_causal>, grid_q, DqTraits::kNThreads,
                                DqTraits::kSmemBytesDq, params, stream);
    }
    // dq_accum arrives zeroed; the dK pass adds every block's dQ share to it.
    if constexpr (Traits::kSplitDkDv) {
        err = launch_with_smem(&bwd_dk_dv_kernel<Traits, Is_causal, false, true, false>, grid_kv,
                               Traits::kNThreads, kSmem, params, stream);
        if (err != cudaSuccess) return err;
        err = launch_with_smem(&bwd_dk_dv_kernel<Traits, Is_causal, true, false, true>, grid_kv,
                               Traits::kNThreads, kSmem, params, stream);
    } else {
        err = launch_with_smem(&bwd_dk_dv_kernel<Traits, Is_causal, true, true, true>, grid_kv, Traits::kNThreads,
                               kSmem, params, stream);
    }
    if (err != cudaSuccess) return err;
    const int64_t chunks = static_cast<int64_t>(params.batch) * params.seqlen_q * params.num_heads *
                           (params.head_dim / 8);
    bwd_convert_dq_kernel<typename Traits::Element>
        <<<static_cast<unsigned>((chunks + 255) / 256), 256, 0, stream>>>(params);
    return cudaGetLastError();
}

template <typename Element, int kHeadDim, bool Is_causal>
cudaError_t run_bwd_(const BwdParams& params, cudaStream_t stream) {
    const int64_t rows = static_cast<int64_t>(params.batch) * params.num_heads * params.seqlen_q;
    bwd_dot_do_o_kernel<Element><<<static_cast<unsigned>((rows + 3) / 4), 128, 0, stream>>>(params);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;

    using Fast = BwdKernelTraits<kHeadDim, Element>;
    if constexpr (Fast::kSmemBytes <= kSmallSmemPerBlock) {
        return launch_bwd<Fast, Is_causal>(params, stream);
    } else {
        using Small = BwdKernelTraits<kHeadDim, Element, BwdSmallSmemConfig<kHeadDim>>;
        static_assert(Small::kSmemBytes <= kSmallSmemPerBlock, "the small-smem config must fit sm_86/sm_89");
        return params.max_smem_per_block >= Fast::kSmemBytes ? launch_bwd<Fast, Is_causal>(params, stream)
                                                             : launch_bwd<Small, Is_causal>(params, stream);
    }
}

}  // namespace flash
