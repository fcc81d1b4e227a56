// Launches the sm90 backward for one (dtype, head dim, V head dim, local,
// softcap, deterministic) instantiation (instantiations/sm90_bwd_*.cu): the sm80
// family's preprocess (D into dsum_ptr), the main kernel (dK, dV; below d256
// dQ added into the zeroed dq_accum, deterministic: in an order that
// dq_semaphore keeps) and the sm80 family's dQ conversion; at d256 the main
// kernel computes dK and dV alone and bwd_dq_kernel writes dQ (no dq_accum, no
// semaphores, no conversion).
#pragma once

#include <cuda.h>

#include "common/flash.h"
#include "sm80/sm80.h"
#include "sm90/bwd_dq_kernel.cuh"
#include "sm90/bwd_grids.h"
#include "sm90/bwd_kernel.cuh"
#include "sm90/kernel_traits.h"
#include "sm90/schedule.h"
#include "sm90/tensor_map.h"

namespace flash::sm90 {

// dQ by the d256 backward's own kernel: one block per 128 queries of a query
// head and sequence (bwd_dq_kernel.cuh).
template <typename Element, bool Is_local, bool Has_softcap>
cudaError_t run_bwd_dq(const BwdParams& params, const BwdGrids& grids, cudaStream_t stream) {
    using Traits = BwdDqTraits<Element>;
    CUtensorMap tma_q{}, tma_k{}, tma_v{}, tma_do{};
    cudaError_t err = make_fwd_tensor_maps(params, Traits::kBlockM, Traits::kBlockN, &tma_q, &tma_k, &tma_v);
    if (err == cudaSuccess) err = make_bwd_tensor_maps(params, Traits::kBlockM, 0, &tma_do, nullptr);
    if (err != cudaSuccess) return err;
    auto kernel = &bwd_dq_kernel<Traits, Is_local, Has_softcap>;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes);
    if (err != cudaSuccess) return err;
    // Behind the main kernel, overlapping its last wave (bwd_dq_kernel.cuh).
    cudaLaunchAttribute overlap{};
    overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    overlap.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{};
    config.blockDim = dim3(Traits::kNThreads);
    config.dynamicSmemBytes = Traits::kSmemBytes;
    config.stream = stream;
    config.attrs = &overlap;
    config.numAttrs = 1;
    // The main kernel's grid by query tiles (run_bwd_), the last (the longest
    // walk under a mask) first. Variable lengths: the longest sequence's tiles
    // (params.seqlen_q is max_seqlen_q).
    config.gridDim = backward_grid<Is_local>(grids.query_tiles, params.num_heads, params.batch,  // schedule.h
                                             grids.dq);
    if (config.gridDim.x == 0 || config.gridDim.y == 0 || config.gridDim.z == 0) return cudaSuccess;
    return cudaLaunchKernelEx(&config, kernel,
                              with_tail(params, grids.dq, grids.main_partials, grids.main_flags), tma_q, tma_k,
                              tma_v, tma_do);
}

template <typename Element, int kHeadDim, int kHeadDimV, bool Is_local, bool Has_softcap, bool Is_deterministic>
cudaError_t run_bwd_(const BwdParams& params, cudaStream_t stream) {
    using Traits = BwdTraitsFor<kHeadDim, Element, kHeadDimV, Is_deterministic>;
    static_assert(Traits::kDqInKernel || !Is_deterministic,
                  "d256's dQ kernel is deterministic in both modes: dispatch.cu runs its one instantiation");
    CUtensorMap tma_q{}, tma_k{}, tma_v{}, tma_do{}, tma_dq_accum{};
    cudaError_t err = make_fwd_tensor_maps(params, Traits::kBlockM, Traits::kBlockN, &tma_q, &tma_k, &tma_v);
    if (err == cudaSuccess) {
        if constexpr (Traits::kDqInKernel) {
            err = make_bwd_tensor_maps(params, Traits::kBlockM, Traits::kDqRows, &tma_do, &tma_dq_accum);
        } else {
            err = make_bwd_tensor_maps(params, Traits::kBlockM, 0, &tma_do, nullptr);
        }
    }
    if (err != cudaSuccess) return err;
    auto kernel = &bwd_kernel<Traits, Is_local, Has_softcap, Is_deterministic>;
    // Dynamic shared memory above 48 KB must be opted into per kernel.
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes);
    if (err != cudaSuccess) return err;

    // The preprocess computes D and zeroes dq_accum (none at d256: D alone).
    err = sm80::run_bwd_preprocess(params, stream);
    if (err != cudaSuccess) return err;
    // One block per key tile. Variable lengths: the longest sequence's tiles
    // (params.seqlen_k is max_seqlen_k), none where every sequence is empty
    // of keys (dq stays 0). The default grid (schedule.h: backward_grid),
    // without a mask (key tile, KV head, batch), takes a pair's key tiles
    // together, which read the same query rows at the same steps. Under a
    // mask the tiles' work differs (a causal mask: the first key tiles see the
    // most query tiles), and the grid (batch, key tile, KV head) starts a
    // head's tiles longest first, each for all batches together: its last
    // blocks are short ones in every batch, where the pair after pair order
    // ended on the last pair's longest tiles (round 38, d128 8k causal: the
    // kernel 6% faster; d256: its two kernels 2% and 11%; without a mask this
    // order was 1-4% slower at d256). The blocks at work at one time read the
    // query rows of as many pairs as there are batches, which L2 holds at the
    // lengths where the grid's end matters. Without a mask the grid's last
    // items run in parts where they leave most of the last wave's SMs idle
    // (schedule.h: TailSplit; d64 and d128). Deterministic: the linear order
    // of schedule.h's deterministic_tile (bwd_kernel.cuh: BwdWork,
    // bwd_dq_writer).
    const BwdGrids grids = bwd_grids<Traits>(params, Is_local, Is_deterministic, tail_sms(params));
    const int key_tiles = grids.key_tiles;
    if (key_tiles > 0) {
        BwdParams launch_params = with_tail(params, grids.main, 0, 0);
        const dim3 grid = Is_deterministic
                              ? dim3(key_tiles, params.num_heads_k, params.batch)
                              : backward_grid<Is_local>(key_tiles, params.num_heads_k, params.batch, grids.main);
        if constexpr (Is_deterministic) {
            launch_params.det_run = deterministic_run(key_tiles, Is_local);  // schedule.h
        }
        kernel<<<grid, Traits::kNThreads, Traits::kSmemBytes, stream>>>(launch_params, tma_q, tma_k, tma_v, tma_do,
                                                                         tma_dq_accum);
        err = cudaGetLastError();
        if (err != cudaSuccess) return err;
    }
    if constexpr (Traits::kDqInKernel) {
        return sm80::run_bwd_convert_dq(params, stream);
    } else {
        return run_bwd_dq<Element, Is_local, Has_softcap>(params, grids, stream);
    }
}

}  // namespace flash::sm90
