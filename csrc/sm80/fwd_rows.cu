// The forward's rows that no attention block writes in a variable-length batch
// (sm80.h: run_fwd_unwritten_rows), for every family's forward: rows outside
// every sequence (before cu_seqlens_q[0], past cu_seqlens_q[batch], which
// batches padded for CUDA graphs carry) and a sequence's rows past seqused_q.
// They get out 0 and lse -inf, as on CPU; the attention blocks write every
// other row, so out and lse need no fill of their own.
#include <cmath>
#include <cstdint>

#include "sm80/sm80.h"

namespace flash::sm80 {
namespace {

constexpr int kWarpsPerBlock = 4;

// Whether an attention block writes packed row r: the sequence whose
// cu_seqlens_q range holds it (the last one starting at or before r, which
// skips empty sequences; cu_seqlens are the caller's promise, non-decreasing),
// and r among its first seqused_q rows, clamped as varlen_sequence_of clamps
// it (mask.cuh).
__device__ bool row_is_written(const FwdParams& params, int r) {
    const int* cu = params.cu_seqlens_q;
    if (params.batch <= 0 || r < cu[0]) return false;
    int lo = 0, hi = params.batch - 1;  // cu[lo] <= r; the answer lies in [lo, hi]
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (cu[mid] <= r) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    const int start = cu[lo], length = cu[lo + 1] - start;
    if (r - start >= length) return false;
    if (params.seqused_q == nullptr) return true;
    const int used = min(max(params.seqused_q[lo], 0), max(length, 0));
    return r - start < used;
}

// One warp per packed row: lane 0 decides, the warp zeroes the row's heads.
template <typename Bits>
__global__ void __launch_bounds__(32 * kWarpsPerBlock) unwritten_rows_kernel(const FwdParams params) {
    const int r = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (r >= params.total_q) return;
    const bool written = __shfl_sync(0xffffffffu, lane == 0 ? row_is_written(params, r) : false, 0);
    if (written) return;
    Bits* row = static_cast<Bits*>(params.o_ptr) + r * params.o_row_stride;
    for (int h = 0; h < params.num_heads; ++h) {
        for (int d = lane; d < params.head_dim_v; d += 32) row[h * params.o_head_stride + d] = Bits(0);
    }
    for (int h = lane; h < params.num_heads; h += 32) params.lse_ptr[h * params.lse_head_stride + r] = -INFINITY;
}

}  // namespace

cudaError_t run_fwd_unwritten_rows(const FwdParams& params, cudaStream_t stream) {
    if (params.cu_seqlens_q == nullptr || params.total_q <= 0) return cudaSuccess;
    const unsigned blocks = static_cast<unsigned>((params.total_q + kWarpsPerBlock - 1) / kWarpsPerBlock);
    unwritten_rows_kernel<uint16_t><<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(params);  // fp16 and bf16: 0 is all-zero bits
    return cudaGetLastError();
}

}  // namespace flash::sm80
