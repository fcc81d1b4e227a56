// C entry points into FlashAttention-3's sm90 kernels, for same-run benchmarks only (scripts/stage_fa3.sh
// builds this file with FA3's own instantiations into .fa3/lib/libfa3.so; benchmarks/backends.py loads
// it with ctypes). Nothing here is part of flashattn: no torch, no checks beyond what a benchmark
// needs. It fills FA3's parameter struct for dense [B, S, H, D] tensors with a contiguous last
// dimension the way FA3's own binding does for such a call (one split, no varlen, no paging, its
// scheduler semaphore for causal calls), then calls FA3's launcher. Workspaces come from the caller.
#include <cstdint>
#include <cstring>

#include <cuda_runtime.h>

#include "cutlass/numeric_types.h"
#include "flash.h"

extern "C" {

// One call's tensors (device pointers) and sizes. Strides are in elements, for [B, S, H, D] tensors.
struct Fa3Call {
  void *q, *k, *v, *out, *lse;
  void *q_descale, *k_descale, *v_descale;  // fp32 (B, Hk) contiguous, or null (FP8 only)
  int *semaphore;                           // one int32 (causal forward), zeroed here before the call
  // backward
  void *dout, *dq, *dk, *dv;
  void *dq_accum, *dk_accum, *dv_accum;     // fp32; dk/dv_accum only where Hk < H (zeroed by the caller)
  void *softmax_d, *lse_log2;               // fp32 (B, H, Sq rounded to the block)
  int *dq_semaphore;                        // int32 (Sq blocks, B, H)
  int64_t q_strides[3], k_strides[3], v_strides[3], o_strides[3];  // batch, row, head
  int b, seqlen_q, seqlen_k, h, h_k, d;
  int seqlen_q_rounded, seqlen_k_rounded;
  float softmax_scale;
  int causal;
  int dtype;  // 0 fp16, 1 bf16, 2 e4m3
};

static int round_up_headdim(int d) { return d <= 64 ? 64 : d <= 96 ? 96 : d <= 128 ? 128 : d <= 192 ? 192 : 256; }

static void fill_forward(Flash_fwd_params &p, const Fa3Call &c) {
  std::memset(&p, 0, sizeof(p));
  p.is_bf16 = c.dtype == 1;
  p.is_e4m3 = c.dtype == 2;
  p.q_ptr = c.q; p.k_ptr = c.k; p.v_ptr = c.v; p.o_ptr = c.out;
  p.q_batch_stride = c.q_strides[0]; p.q_row_stride = c.q_strides[1]; p.q_head_stride = c.q_strides[2];
  p.k_batch_stride = c.k_strides[0]; p.k_row_stride = c.k_strides[1]; p.k_head_stride = c.k_strides[2];
  p.v_batch_stride = c.v_strides[0]; p.v_row_stride = c.v_strides[1]; p.v_head_stride = c.v_strides[2];
  p.v_dim_stride = 1;
  p.o_batch_stride = c.o_strides[0]; p.o_row_stride = c.o_strides[1]; p.o_head_stride = c.o_strides[2];
  p.softmax_lse_ptr = c.lse;
  p.b = c.b; p.b_k = c.b; p.h = c.h; p.h_k = c.h_k;
  p.seqlen_q = c.seqlen_q; p.seqlen_k = c.seqlen_k;
  p.seqlen_q_rounded = c.seqlen_q_rounded; p.seqlen_k_rounded = c.seqlen_k_rounded;
  p.total_q = c.b * c.seqlen_q; p.total_k = c.b * c.seqlen_k;
  p.d = c.d; p.d_rounded = round_up_headdim(c.d);
  p.dv = c.d; p.dv_rounded = p.d_rounded;
  p.scale_softmax = c.softmax_scale;
  p.p_dropout = 1.f; p.rp_dropout = 1.f; p.p_dropout_in_uint8_t = 255;
  // FA3's convention: causal is window (-1, 0); no window is (seqlen_k - 1, seqlen_q - 1).
  p.is_causal = c.causal != 0;
  p.window_size_left = c.seqlen_k - 1;
  p.window_size_right = c.causal ? 0 : c.seqlen_q - 1;
  if (p.is_e4m3) {
    p.q_descale_ptr = static_cast<float *>(c.q_descale);
    p.k_descale_ptr = static_cast<float *>(c.k_descale);
    p.v_descale_ptr = static_cast<float *>(c.v_descale);
    p.q_descale_batch_stride = p.k_descale_batch_stride = p.v_descale_batch_stride = c.h_k;
    p.q_descale_head_stride = p.k_descale_head_stride = p.v_descale_head_stride = 1;
  }
  p.num_splits = 1;
  p.varlen_sort_batches = true;
  p.head_swizzle = p.is_causal;
  int device = 0, major = 0, minor = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  cudaDeviceGetAttribute(&p.num_sm, cudaDevAttrMultiProcessorCount, device);
  p.arch = major * 10 + minor;
}

// Returns a cudaError_t: cudaErrorNotSupported for a head dim or dtype not built here (stage_fa3.sh
// defines FA3_HAVE_<unit> for each FA3 instantiation it links, so a subset links without undefined
// symbols), else what the runtime reports after the launch. FA3's launcher itself exits the process
// on a CUDA or CUTLASS error (its CHECK_CUDA, CHECK_CUTLASS), so benchmarks/backends.py refuses,
// before calling, what this library does not serve.
int fa3_forward(const Fa3Call *c, cudaStream_t stream) {
  Flash_fwd_params p;
  fill_forward(p, *c);
  if (p.is_causal) {
    p.tile_count_semaphore = c->semaphore;
    cudaMemsetAsync(c->semaphore, 0, sizeof(int), stream);
  }
#define FA3_FORWARD(DTYPE, D, T)                                                         \
  if (c->dtype == DTYPE && c->d == D) {                                                  \
    run_mha_fwd_<90, T, D, D, false, false, false, false>(p, stream);                    \
    return static_cast<int>(cudaGetLastError());                                         \
  }
#ifdef FA3_HAVE_flash_fwd_hdim64_e4m3_sm90
  FA3_FORWARD(2, 64, cutlass::float_e4m3_t)
#endif
#ifdef FA3_HAVE_flash_fwd_hdim128_e4m3_sm90
  FA3_FORWARD(2, 128, cutlass::float_e4m3_t)
#endif
#ifdef FA3_HAVE_flash_fwd_hdim256_e4m3_sm90
  FA3_FORWARD(2, 256, cutlass::float_e4m3_t)
#endif
#ifdef FA3_HAVE_flash_fwd_hdim64_bf16_sm90
  FA3_FORWARD(1, 64, cutlass::bfloat16_t)
#endif
#ifdef FA3_HAVE_flash_fwd_hdim128_bf16_sm90
  FA3_FORWARD(1, 128, cutlass::bfloat16_t)
#endif
#ifdef FA3_HAVE_flash_fwd_hdim256_bf16_sm90
  FA3_FORWARD(1, 256, cutlass::bfloat16_t)
#endif
#undef FA3_FORWARD
  return static_cast<int>(cudaErrorNotSupported);
}

int fa3_backward(const Fa3Call *c, cudaStream_t stream) {
  Flash_bwd_params p;
  std::memset(&p, 0, sizeof(p));
  fill_forward(p, *c);
  p.do_ptr = c->dout; p.dq_ptr = c->dq; p.dk_ptr = c->dk; p.dv_ptr = c->dv;
  // dout, dq share q's layout; dk, dv k's and v's.
  p.do_batch_stride = c->o_strides[0]; p.do_row_stride = c->o_strides[1]; p.do_head_stride = c->o_strides[2];
  p.dq_batch_stride = c->q_strides[0]; p.dq_row_stride = c->q_strides[1]; p.dq_head_stride = c->q_strides[2];
  p.dk_batch_stride = c->k_strides[0]; p.dk_row_stride = c->k_strides[1]; p.dk_head_stride = c->k_strides[2];
  p.dv_batch_stride = c->v_strides[0]; p.dv_row_stride = c->v_strides[1]; p.dv_head_stride = c->v_strides[2];
  p.dq_accum_ptr = c->dq_accum;
  p.dk_accum_ptr = c->h_k != c->h ? c->dk_accum : nullptr;
  p.dv_accum_ptr = c->h_k != c->h ? c->dv_accum : nullptr;
  p.dsoftmax_sum = c->softmax_d;
  p.softmax_lse_log2_ptr = c->lse_log2;
  p.dq_semaphore = c->dq_semaphore;
  p.deterministic = false;
#define FA3_BACKWARD(D)                                                                  \
  if (c->dtype == 1 && c->d == D) {                                                      \
    run_mha_bwd_<90, cutlass::bfloat16_t, D, false>(p, stream);                          \
    return static_cast<int>(cudaGetLastError());                                         \
  }
#ifdef FA3_HAVE_flash_bwd_hdim64_bf16_sm90
  FA3_BACKWARD(64)
#endif
#ifdef FA3_HAVE_flash_bwd_hdim128_bf16_sm90
  FA3_BACKWARD(128)
#endif
#ifdef FA3_HAVE_flash_bwd_hdim256_bf16_sm90
  FA3_BACKWARD(256)
#endif
#undef FA3_BACKWARD
  return static_cast<int>(cudaErrorNotSupported);
}

}  // extern "C"
