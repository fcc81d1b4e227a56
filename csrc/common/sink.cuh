// Learnable sinks (flash.h: FwdParams::learnable_sink), read once per row:
// by the tiled forwards before the key loop, as the first column of the row's
// online softmax (softmax.cuh: start_at_sink, whose state holds it from there,
// so no register of its own crosses the loop), and by the LSE merges that
// finish a KV-cache row (lse_merge.cuh: add_sink).
//
// The online softmax takes it in its base-2 domain, that of the scaled scores
// times log2(e): the sink is a natural-log logit compared with the scaled
// scores, so its base-2 value is sink * log2(e). The LSE merges take it in
// natural log.
#pragma once

#include <cmath>

#include "common/flash.h"
#include "common/softmax.cuh"

namespace flash {

// The sink of query row `row` (counted from the block's sequence start) of the
// block's head `head`, natural log; -inf where there is none. May_pack: the
// kernel may run with pack_gqa (flash.h), where a block's rows are the query
// heads of KV head `head` and rows past the group have no sink.
template <bool May_pack>
__device__ __forceinline__ float learnable_sink_of(const FwdParams& params, int head, int row) {
    if (params.learnable_sink == nullptr) return -INFINITY;
    if (May_pack && params.pack_gqa) {
        return row < params.seqlen_q ? params.learnable_sink[head * params.seqlen_q + row] : -INFINITY;
    }
    return params.learnable_sink[head];
}

// The same in the online softmax's base-2 domain.
template <bool May_pack>
__device__ __forceinline__ float learnable_sink_log2_of(const FwdParams& params, int head, int row) {
    return learnable_sink_of<May_pack>(params, head, row) * kLog2e;
}

}  // namespace flash
