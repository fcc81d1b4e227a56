// The sm80 family's entry points: the Ampere-class kernels (mma.sync, ldmatrix,
// cp.async), which run on every GPU from sm_80 on. The binding calls these
// through its family table (api/family.h); each returns the launch error, if
// any, and launches on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include "common/flash.h"

namespace flash::sm80 {

cudaError_t run_fwd(const FwdParams& params, cudaStream_t stream);
cudaError_t run_bwd(const BwdParams& params, cudaStream_t stream);

// A variable-length forward's rows that no sequence uses (outside every
// cu_seqlens_q range, or past a sequence's seqused_q): out 0 and lse -inf.
// Every family's run_fwd calls it before its kernels, which write the rest.
cudaError_t run_fwd_unwritten_rows(const FwdParams& params, cudaStream_t stream);

// The backward's row-wise passes, for a family whose main backward kernel keeps
// the sm80 layouts of its scratch (dsum_ptr, dq_accum_ptr): the preprocess
// D = rowsum(dout * out) - dlse into dsum_ptr (and the sink's gradient), and
// the dQ conversion dq = softmax_scale * dq_accum in the input dtype and dq's
// layout.
cudaError_t run_bwd_preprocess(const BwdParams& params, cudaStream_t stream);
cudaError_t run_bwd_convert_dq(const BwdParams& params, cudaStream_t stream);
// The learnable sink's gradient into dsink_ptr (flash.h: BwdParams), from the
// preprocess's D and the forward's lse; the preprocess runs it (params as the
// row-wise passes see them: a variable-length batch as one sequence).
cudaError_t run_bwd_dsink(const BwdParams& params, cudaStream_t stream);

// The KV cache (sm80/kvcache/). plan_kvcache completes the plan fields of
// `params` (pack_gqa, num_splits, decode_wide) for a call that asks for
// `requested_splits` splits (0: the family picks; more than kMaxKvSplits are
// clamped) and returns the scratch the forward needs. run_kvcache_append
// writes the new keys and values (rotary applied) and the rotated queries;
// run_fwd_kvcache attends over the cache and merges any splits.
KvcacheWorkspace plan_kvcache(FwdParams& params, int64_t requested_splits);
cudaError_t run_kvcache_append(const AppendParams& params, cudaStream_t stream);
cudaError_t run_fwd_kvcache(const FwdParams& params, cudaStream_t stream);

// flash_attn_combine (flash.h: CombineParams): one warp per (b, s, h) row.
cudaError_t run_combine(const CombineParams& params, cudaStream_t stream);
// FP8 values dequantised to 16 bits (dequantize.cu).
cudaError_t run_dequantize_fp8(const DequantizeParams& params, cudaStream_t stream);

// The compiled head dim that serves `head_dim` (for error messages).
int kernel_head_dim(int head_dim);

// The zeroed counters a forward call needs (FwdParams::fwd_counters): none.
int fwd_counters(const FwdParams& params);

// The scratch a backward call needs (flash.h: BwdWorkspace): dq_accum for the
// atomic dQ; the deterministic path's dQ pass owns its rows and needs none.
BwdWorkspace bwd_workspace(const BwdParams& params);

}  // namespace flash::sm80
