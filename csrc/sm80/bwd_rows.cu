// The backward's row-wise passes as entry points of their own (sm80.h), for a
// family whose main backward kernel is another but keeps these scratch layouts,
// and the learnable sink's gradient, which every family's preprocess runs.
#include <cmath>
#include <cstdint>

#include "common/static_switch.h"
#include "sm80/bwd_launch.cuh"
#include "sm80/sm80.h"

namespace flash::sm80 {
namespace {

constexpr int kDsinkThreads = 256;
static_assert(kDsinkPartials <= 32, "one warp adds a head's partial sums");

// Partial sum `part` of head h's sink gradient: of the head's rows (b, i) in
// order, the part-th of kDsinkPartials equal ranges, each thread its rows in a
// fixed order, then the block's threads in a fixed tree; the grid is
// (kDsinkPartials, H). A row's term is exp(sink_h - lse_i) * D_i (D: the
// preprocess's, dlse folded in); a row whose lse is -inf (it saw no key and
// there is no sink, or no sequence owns it) weighs 0.
__global__ void __launch_bounds__(kDsinkThreads) dsink_partial_kernel(const BwdParams params) {
    const int part = blockIdx.x, h = blockIdx.y;
    const int64_t rows = static_cast<int64_t>(params.batch) * params.seqlen_q;
    const int64_t per_part = (rows + kDsinkPartials - 1) / kDsinkPartials;
    const int64_t begin = part * per_part, end = min(rows, begin + per_part);
    const float sink = params.learnable_sink[h];
    float sum = 0.f;
    for (int64_t r = begin + threadIdx.x; r < end; r += kDsinkThreads) {
        const int64_t b = r / params.seqlen_q, i = r % params.seqlen_q;
        const int64_t at = b * params.lse_batch_stride + h * params.lse_head_stride + i;
        const float lse = params.lse_ptr[at];
        if (lse != -INFINITY) sum += expf(sink - lse) * params.dsum_ptr[at];
    }
    __shared__ float warp_sums[kDsinkThreads / 32];
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.f;
#pragma unroll
        for (int w = 0; w < kDsinkThreads / 32; ++w) total += warp_sums[w];
        params.dsink_partial_ptr[h * kDsinkPartials + part] = total;
    }
}

// dsink[h] = -(the sum of head h's partial sums): one warp per head, a fixed tree.
constexpr int kDsinkHeadsPerBlock = 4;

__global__ void __launch_bounds__(32 * kDsinkHeadsPerBlock) dsink_sum_kernel(const BwdParams params) {
    const int h = blockIdx.x * kDsinkHeadsPerBlock + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (h >= params.num_heads) return;
    float sum = lane < kDsinkPartials ? params.dsink_partial_ptr[h * kDsinkPartials + lane] : 0.f;
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) params.dsink_ptr[h] = -sum;
}

}  // namespace

cudaError_t run_bwd_preprocess(const BwdParams& params, cudaStream_t stream) {
    return FLASH_DTYPE_SWITCH(params.dtype, Element, [&] { return launch_dot_do_o<Element>(params, stream); });
}

cudaError_t run_bwd_convert_dq(const BwdParams& params, cudaStream_t stream) {
    return FLASH_DTYPE_SWITCH(params.dtype, Element, [&] { return launch_convert_dq<Element>(params, stream); });
}

cudaError_t run_bwd_dsink(const BwdParams& params, cudaStream_t stream) {
    if (params.num_heads == 0) return cudaSuccess;
    dsink_partial_kernel<<<dim3(kDsinkPartials, params.num_heads), kDsinkThreads, 0, stream>>>(params);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    const unsigned blocks = static_cast<unsigned>((params.num_heads + kDsinkHeadsPerBlock - 1) / kDsinkHeadsPerBlock);
    dsink_sum_kernel<<<blocks, 32 * kDsinkHeadsPerBlock, 0, stream>>>(params);
    return cudaGetLastError();
}

}  // namespace flash::sm80
