// Parameter structs shared by the binding and the kernels. Plain C++: no torch.
#pragma once

#include <cstdint>
#include <cuda_runtime_api.h>

namespace flash {

enum class DType : int { kFloat16 = 0, kBFloat16 = 1 };

// Forward attention over q [B, Sq, H, D], k/v [B, Sk, Hk, D] (any strides, last
// dim contiguous, rows 16-byte aligned), writing out [B, Sq, H, D] and the
// natural-log log-sum-exp lse [B, H, Sq] (contiguous fp32).
struct FwdParams {
    const void* __restrict__ q_ptr;
    const void* __restrict__ k_ptr;
    const void* __restrict__ v_ptr;
    void* __restrict__ o_ptr;
    float* __restrict__ lse_ptr;

    // Strides in elements.
    int64_t q_batch_stride, q_row_stride, q_head_stride;
    int64_t k_batch_stride, k_row_stride, k_head_stride;
    int64_t v_batch_stride, v_row_stride, v_head_stride;
    int64_t o_batch_stride, o_row_stride, o_head_stride;

    int batch;
    int seqlen_q, seqlen_k;
    int num_heads, num_heads_k;
    int head_dim;           // actual head dim: a multiple of 8, <= the kernel's kHeadDim
    int heads_per_kv_head;  // num_heads / num_heads_k (GQA group size)

    float softmax_scale;       // applied to q.k; must be > 0
    float softmax_scale_log2;  // softmax_scale * log2(e): the kernel works in base 2

    // Shared memory a block may opt into on this device; head dims whose fastest
    // tile config needs more run a smaller one.
    int max_smem_per_block;

    DType dtype;
    bool is_causal;  // bottom-right aligned: query i sees key j iff j <= i + Sk - Sq
};

// Backward over the same tensors as the forward (the FwdParams part: q, k, v,
// out, lse, read only), plus dout [B, Sq, H, D] and the gradients dq [B, Sq, H, D],
// dk and dv [B, Sk, Hk, D]; dk/dv of a KV head sum its query heads' shares.
struct BwdParams : FwdParams {
    const void* __restrict__ do_ptr;
    void* __restrict__ dq_ptr;
    void* __restrict__ dk_ptr;
    void* __restrict__ dv_ptr;
    float* __restrict__ dsum_ptr;      // [B, H, Sq] scratch: D = rowsum(dout * out), fp32
    float* __restrict__ dq_accum_ptr;  // [B, Sq, H, D] fp32 scratch, zeroed (not deterministic only)

    int64_t do_batch_stride, do_row_stride, do_head_stride;
    int64_t dq_batch_stride, dq_row_stride, dq_head_stride;
    int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
    int64_t dv_batch_stride, dv_row_stride, dv_head_stride;

    // false: dQ is added up across key tiles with fp32 atomics inside the dK/dV
    // pass (fewer FLOPs, order-dependent rounding); true: a separate dQ pass
    // owns each dQ row (bitwise reproducible, recomputes S and dP).
    bool deterministic;
};

// Runs the forward pass on `stream`. Returns the launch error, if any.
cudaError_t run_fwd(const FwdParams& params, cudaStream_t stream);

// Runs the backward pass on `stream`. Returns the launch error, if any.
cudaError_t run_bwd(const BwdParams& params, cudaStream_t stream);

// Head dims a kernel is compiled for; other head dims run on the next larger one.
constexpr int kMaxHeadDim = 256;
int fwd_kernel_head_dim(int head_dim);

}  // namespace flash
