// Launches the backward kernels for one (dtype, head dim, V head dim, local, extras) instantiation.
#pragma once

#include "sm80/bwd_kernel.cuh"
#include "common/flash.h"
#include "sm80/kernel_traits.h"
#include "sm80/sm80.h"

namespace flash::sm80 {

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

// A variable-length batch as the row-wise kernels (preprocess, dQ conversion)
// see it: one sequence of total_q rows, in the layouts' flat row order.
inline BwdParams flat_rows(const BwdParams& params) {
    BwdParams flat = params;
    if (params.cu_seqlens_q != nullptr) {
        flat.batch = 1;
        flat.seqlen_q = params.total_q;
    }
    return flat;
}

// The preprocess: D = rowsum(dout * out) - dlse into dsum_ptr and dq_accum
// zeroed (bwd_dot_do_o_kernel); then, with a learnable sink, its gradient from
// D and lse (bwd_rows.cu).
template <typename Element>
cudaError_t launch_dot_do_o(const BwdParams& params, cudaStream_t stream) {
    const BwdParams flat = flat_rows(params);
    const int64_t rows = static_cast<int64_t>(flat.batch) * flat.num_heads * flat.seqlen_q;
    if (rows > 0) {
        int lanes_log2 = 0;  // lanes a row: head_dim_v's 16-byte chunks rounded up to a power of two, at most 32
        while (lanes_log2 < 5 && (8 << lanes_log2) < flat.head_dim_v) ++lanes_log2;
        const int64_t blocks = ((rows << lanes_log2) + kPreprocessThreads - 1) / kPreprocessThreads;
        bwd_dot_do_o_kernel<Element><<<static_cast<unsigned>(blocks), kPreprocessThreads, 0, stream>>>(flat,
                                                                                                        lanes_log2);
        const cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) return err;
    }
    return params.learnable_sink == nullptr ? cudaSuccess : run_bwd_dsink(flat, stream);
}

// The postprocess of the atomic dQ: dq = softmax_scale * dq_accum in Element.
template <typename Element>
cudaError_t launch_convert_dq(const BwdParams& params, cudaStream_t stream) {
    const BwdParams flat = flat_rows(params);
    const int64_t chunks = static_cast<int64_t>(flat.batch) * flat.seqlen_q * flat.num_heads * (flat.head_dim / 8);
    if (chunks == 0) return cudaSuccess;
    bwd_convert_dq_kernel<Element><<<static_cast<unsigned>((chunks + 255) / 256), 256, 0, stream>>>(flat);
    return cudaGetLastError();
}

// The dK/dV kernel(s) of one tile config: one pass, or one per gradient where
// dK and dV together do not fit the registers (Traits::kSplitDkDv); Has_dQ adds
// dQ's shares to the fp32 buffer in the pass that computes dS.
template <typename Traits, bool Is_local, bool Has_extras, bool Has_dQ>
cudaError_t launch_dk_dv(const BwdParams& params, cudaStream_t stream) {
    constexpr int kSmem = Traits::kSmemBytesDkDv;
    const dim3 grid((params.seqlen_k + Traits::kOwnRows - 1) / Traits::kOwnRows, params.num_heads_k, params.batch);
    // Template flags: <Is_local, Has_extras, Has_dK, Has_dV, Has_dQ>.
    if constexpr (Traits::kSplitDkDv) {
        cudaError_t err = launch_with_smem(&bwd_dk_dv_kernel<Traits, Is_local, Has_extras, false, true, false>, grid,
                                           Traits::kNThreads, kSmem, params, stream);
        if (err != cudaSuccess) return err;
        return launch_with_smem(&bwd_dk_dv_kernel<Traits, Is_local, Has_extras, true, false, Has_dQ>, grid,
                                Traits::kNThreads, kSmem, params, stream);
    } else {
        return launch_with_smem(&bwd_dk_dv_kernel<Traits, Is_local, Has_extras, true, true, Has_dQ>, grid,
                                Traits::kNThreads, kSmem, params, stream);
    }
}

// The dK/dV and dQ kernels of one tile config, after the preprocess.
template <typename Traits, bool Is_local, bool Has_extras>
cudaError_t launch_bwd(const BwdParams& params, cudaStream_t stream) {
    if (params.deterministic) {
        cudaError_t err = launch_dk_dv<Traits, Is_local, Has_extras, /*Has_dQ=*/false>(params, stream);
        if (err != cudaSuccess) return err;
        using DqTraits = BwdKernelTraits<Traits::kHeadDim, typename Traits::Element,
                                         BwdDqConfig<typename Traits::Config>, Traits::kHeadDimV>;
        // A block per (query tile, chunk of kHeadDimDq of dQ's columns).
        const int dq_chunks = DqTraits::dq_chunks(params.head_dim);
        const dim3 grid_q((params.seqlen_q + Traits::kOwnRows - 1) / Traits::kOwnRows * dq_chunks, params.num_heads,
                          params.batch);
        return launch_with_smem(&bwd_dq_kernel<DqTraits, Is_local, Has_extras>, grid_q, DqTraits::kNThreads,
                                DqTraits::kSmemBytesDq, params, stream);
    }
    // dq_accum arrives zeroed; the dK pass adds every block's dQ share to it.
    cudaError_t err = launch_dk_dv<Traits, Is_local, Has_extras, /*Has_dQ=*/true>(params, stream);
    if (err != cudaSuccess) return err;
    return launch_convert_dq<typename Traits::Element>(params, stream);
}

// kHeadDimV: kHeadDim, or the narrower V head dim compiled for it
// (kernel_traits.h: narrow_head_dim_v), which the call's head_dim_v fits. Its
// smaller V and dO tiles may bring the fast config within sm_86/sm_89's 99 KB
// (DeepSeek MLA's 192 / 128: 96.5 KB), so that those GPUs run it too.
template <typename Element, int kHeadDim, int kHeadDimV, bool Is_local, bool Has_extras>
cudaError_t run_bwd_(const BwdParams& params, cudaStream_t stream) {
    cudaError_t err = launch_dot_do_o<Element>(params, stream);
    if (err != cudaSuccess) return err;

    using Fast = BwdKernelTraits<kHeadDim, Element, BwdConfig<kHeadDim>, kHeadDimV>;
    if constexpr (Fast::kSmemBytes <= kSmallSmemPerBlock || kHeadDim > 256) {
        // Head dim 512 has one config (kernel_traits.h: BwdConfig<512>), for sm_90's shared memory.
        return launch_bwd<Fast, Is_local, Has_extras>(params, stream);
    } else {
        using Small = BwdKernelTraits<kHeadDim, Element, BwdSmallSmemConfig<kHeadDim>, kHeadDimV>;
        static_assert(Small::kSmemBytes <= kSmallSmemPerBlock, "the small-smem config must fit sm_86/sm_89");
        return params.max_smem_per_block >= Fast::kSmemBytes
                   ? launch_bwd<Fast, Is_local, Has_extras>(params, stream)
                   : launch_bwd<Small, Is_local, Has_extras>(params, stream);
    }
}

}  // namespace flash::sm80
