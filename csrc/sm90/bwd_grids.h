// The sm90 backward's default grids on the host (bwd_launch.cuh launches
// them, dispatch.cu's bwd_workspace sizes their scratch): their items and,
// without a mask, their split tails (schedule.h: TailSplit).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/flash.h"
#include "sm90/kernel_traits.h"
#include "sm90/schedule.h"

namespace flash::sm90 {

// The SMs of the current device; 0 where CUDA cannot say (then no grid's tail is split).
inline int current_device_sms() {
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
        return 0;
    }
    return sms;
}

// The SMs a call's tails are split for (bwd_grids): none where the caller
// gave no scratch for them (bwd_workspace asked for none).
inline int tail_sms(const BwdParams& params) {
    return params.tail_partials != nullptr && params.tail_flags != nullptr ? current_device_sms() : 0;
}

// A call's default backward grids (the deterministic main kernel's aside):
// their items (a tile of a head and batch: the main kernel's key tiles, d256's
// dQ kernel's query tiles) and, without a mask, their split tails
// (schedule.h: TailSplit) and the scratch those hand their sums on through
// (parts.cuh; BwdWorkspace::partials and ::flags): the main kernel's first,
// then the dQ kernel's, which runs beside the main kernel's last blocks. A
// kernel splits only where its traits say what a part hands on
// (kPartValues): d64 and d128's main kernels, d256's dQ kernel.
struct BwdGrids {
    int key_tiles = 0, query_tiles = 0;
    TailSplit main{0, 1}, dq{0, 1};
    int64_t main_partials = 0, main_flags = 0, dq_partials = 0, dq_flags = 0;
};
template <typename Traits>  // the main kernel's
BwdGrids bwd_grids(const BwdParams& params, bool is_local, bool deterministic, int sms) {
    using DqTraits = BwdDqTraits<typename Traits::Element>;
    BwdGrids grids;
    grids.key_tiles = (params.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
    const int64_t main_items = int64_t{grids.key_tiles} * params.num_heads_k * params.batch;
    grids.main = {main_items, 1};
    if (!is_local && !deterministic && Traits::kPartValues > 0) grids.main = tail_split(main_items, 0, sms);
    const int64_t main_slots = main_items - grids.main.first;
    grids.main_partials = main_slots * Traits::kConsumerWarpgroups * 128 * Traits::kPartValues;
    grids.main_flags = main_slots * Traits::kConsumerWarpgroups;
    if constexpr (!Traits::kDqInKernel) {
        grids.query_tiles = (params.seqlen_q + DqTraits::kBlockM - 1) / DqTraits::kBlockM;
        const int64_t dq_items = int64_t{grids.query_tiles} * params.num_heads * params.batch;
        grids.dq = {dq_items, 1};
        if (!is_local) grids.dq = tail_split(dq_items, main_items, sms);
        const int64_t dq_slots = dq_items - grids.dq.first;
        grids.dq_partials = dq_slots * DqTraits::kConsumerWarpgroups * 128 * DqTraits::kPartValues;
        grids.dq_flags = dq_slots * DqTraits::kConsumerWarpgroups;
    }
    return grids;
}

// A kernel's params: its tail, and its share of the scratch (`partials` and
// `flags` into the call's).
inline BwdParams with_tail(const BwdParams& params, const TailSplit& tail, int64_t partials, int64_t flags) {
    BwdParams launch_params = params;
    launch_params.tail_first = tail.first;
    launch_params.tail_parts = tail.parts;
    launch_params.tail_partials = tail.parts > 1 ? params.tail_partials + partials : nullptr;
    launch_params.tail_flags = tail.parts > 1 ? params.tail_flags + flags : nullptr;
    return launch_params;
}

}  // namespace flash::sm90
