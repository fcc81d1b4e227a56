// Launches the sm90 forward kernel for one (dtype, head dim, V's head dim,
// local, softcap) instantiation, or one FP8 (out dtype, head dim, local)
// instantiation (instantiations/sm90_fwd_*.cu).
#pragma once

#include <cuda.h>

#include "common/flash.h"
#include "sm90/fp8_values.cuh"
#include "sm90/fwd_kernel.cuh"
#include "sm90/kernel_traits.h"
#include "sm90/schedule.h"
#include "sm90/tensor_map.h"

namespace flash::sm90 {

// Launches fwd_kernel<Traits, ...> over a call's query tiles with the maps of
// q, k and v made (v's: V^T's for FP8), O's made here where it is staged.
template <typename Traits, bool Is_local, bool Has_softcap>
cudaError_t launch_fwd(const FwdParams& params, const CUtensorMap& tma_q, const CUtensorMap& tma_k,
                       const CUtensorMap& tma_v, KeyCopy key_copy, cudaStream_t stream) {
    // O through shared memory (a buffer of its own, or the V stages:
    // kernel_traits.h, kOThroughSmem) and bulk stores where out has the
    // alignment a tensor map needs; from registers otherwise. Each consumer
    // warpgroup stores its own rows.
    CUtensorMap tma_o{};
    const bool o_by_tma = Traits::kOThroughSmem && o_tensor_map_fits(params);
    if (o_by_tma) {
        const cudaError_t err = make_fwd_o_tensor_map(params, Traits::kWarpgroupRows, &tma_o);
        if (err != cudaSuccess) return err;
    }
    auto kernel = &fwd_kernel<Traits, Is_local, Has_softcap>;
    // Dynamic shared memory above 48 KB must be opted into per kernel.
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes);
    if (err != cudaSuccess) return err;
    const int64_t tiles = static_cast<int64_t>((params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM) *
                          params.num_heads * params.batch;
    if (tiles == 0) return cudaSuccess;
    // Persistent: one block per SM (or per tile, when there are fewer), each
    // drawing query tiles until none is left, the next tile's loads under this
    // one's epilogue. Tiles of equal work (no mask that cuts keys) are drawn
    // statically; under a causal mask or a window their work differs, and a
    // static share leaves SMs idle at the end (NOTES.md): they are drawn from
    // the call's counter (fwd_counters), as blocks free up.
    // Drawn tiles are taken longest first within sections of heads whose K and
    // V fit in half of L2 (schedule.h); a head's keys are read by each of its
    // query tiles, and shared by the query heads of a KV head.
    int device = 0, sms = 0, l2_bytes = 0;
    err = cudaGetDevice(&device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device);
    if (err != cudaSuccess) return err;
    const int blocks = static_cast<int>(tiles < sms ? tiles : sms);
    WorkCounter* counter = Is_local ? reinterpret_cast<WorkCounter*>(params.fwd_counters) : nullptr;
    const int64_t kv_bytes_per_head = static_cast<int64_t>(params.seqlen_k) * (params.head_dim + params.head_dim_v) *
                                      sizeof(typename Traits::Element) / params.heads_per_kv_head;
    const int section =
        Is_local ? heads_per_section(kv_bytes_per_head, l2_bytes, params.num_heads * params.batch) : 1;
    kernel<<<blocks, Traits::kNThreads, Traits::kSmemBytes, stream>>>(params, tma_q, tma_k, tma_v, tma_o, o_by_tma,
                                                                      counter, key_copy, section);
    err = cudaGetLastError();
    if (err == cudaSuccess && o_by_tma) mark_o_written(params, stream);  // for compute-sanitizer's initcheck
    return err;
}

// key_copy: how paged keys are copied (dispatch.cu: key_copy_for); contiguous
// keys are copied by TMA whatever it says.
template <typename Element, int kHeadDim, int kHeadDimV, bool Is_local, bool Has_softcap>
cudaError_t run_fwd_(const FwdParams& params, KeyCopy key_copy, cudaStream_t stream) {
    using Traits = FwdTraitsFor<kHeadDim, Element, Is_local, kHeadDimV>;
    if (params.block_table == nullptr) key_copy = KeyCopy::kTma;
    CUtensorMap tma_q{}, tma_k{}, tma_v{};
    // Gathered keys need no map of k and v (box rows 0).
    const int box_rows_kv = params.block_table == nullptr ? Traits::kBlockN
                            : key_copy == KeyCopy::kTma   ? kv_box_rows(params.page_size, Traits::kBlockN)
                                                          : 0;
    if (key_copy == KeyCopy::kTma && box_rows_kv == 0) return cudaErrorInvalidValue;  // pages TMA cannot take
    const cudaError_t err = make_fwd_tensor_maps(params, Traits::kBlockM, box_rows_kv, &tma_q, &tma_k, &tma_v);
    if (err != cudaSuccess) return err;
    return launch_fwd<Traits, Is_local, Has_softcap>(params, tma_q, tma_k, tma_v, key_copy, stream);
}

// FP8 (params.fp8; e4m3 q, k, v, out of type Out): the kernel, with v as k
// where it transposes its tiles itself (Traits::kValuesInKernel), else after
// v transposed into the family's workspace (params.vt_ptr, fp8_values.cuh).
template <typename Out, int kHeadDim, bool Is_local>
cudaError_t run_fwd_fp8_(const FwdParams& params, cudaStream_t stream) {
    using Traits = Fp8FwdTraitsFor<kHeadDim, Out, Is_local>;
    CUtensorMap tma_q{}, tma_k{}, tma_v{};
    if constexpr (Traits::kValuesInKernel) {
        const cudaError_t err =
            make_fwd_fp8_tensor_maps(params, Traits::kBlockM, Traits::kBlockN, &tma_q, &tma_k, &tma_v);
        if (err != cudaSuccess) return err;
    } else {
        static_assert(Traits::kBlockN <= kFp8KeyTile && Traits::kBlockN % kTransposeKeys == 0,
                      "a sequence's columns are written up to a multiple of the key tile, inside its gap");
        const int64_t columns = value_columns(params);
        const int blocks_k =
            (params.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN * (Traits::kBlockN / kTransposeKeys);
        if (blocks_k > 0 && params.batch > 0) {
            const dim3 grid(blocks_k, params.num_heads_k, params.batch);
            const int smem = kTransposeKeys * (params.head_dim_v / 4 + 1) * 4;
            transpose_values<<<grid, kTransposeThreads, smem, stream>>>(params, columns, Traits::kBlockN);
            if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
        }
        cudaError_t err = make_fwd_fp8_tensor_maps(params, Traits::kBlockM, Traits::kBlockN, &tma_q, &tma_k, nullptr);
        if (err == cudaSuccess) {
            err = make_fwd_fp8_value_map(params, Traits::kTileColsV, Traits::kValueSwizzleBytes, columns, &tma_v);
        }
        if (err != cudaSuccess) return err;
    }
    return launch_fwd<Traits, Is_local, /*Has_softcap=*/false>(params, tma_q, tma_k, tma_v, KeyCopy::kTma, stream);
}

}  // namespace flash::sm90
