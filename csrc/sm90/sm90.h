// The sm90 family's entry points: the Hopper kernels (wgmma, TMA, warp
// specialisation; sm_90a only). The same table as sm80.h, which the binding
// calls through api/family.h. What the family's kernels do not serve (serves()
// and serves_bwd() below; the KV cache) runs on the sm80 family on the same
// GPU: these entry points delegate to flash::sm80::.
#pragma once

#include <cuda_runtime_api.h>

#include "common/flash.h"

namespace flash::sm90 {

// Whether the sm90 forward kernels serve a call: fp16/bf16, a head dim that
// rounds to 64, 96, 128, 192 or 256, causal, windowed, softcap, GQA/MQA, any
// strides the tensor maps can describe, variable lengths, paged keys of any
// page size (gathered where TMA boxes do not fit; FLASHATTN_SM90_PAGED_COPY=tma
// sends pages TMA cannot take to sm80, dispatch.cu). Not: ALiBi, dropout, head
// dims up to 32, a shared-memory limit under what the kernels need
// (FLASHATTN_MAX_SMEM_PER_BLOCK), broadcast (stride 0) views.
bool serves(const FwdParams& params);

cudaError_t run_fwd(const FwdParams& params, cudaStream_t stream);

// Whether the sm90 backward serves a call: fp16/bf16, head dims 33..256 (on
// its d64, d128, d192 (and MLA's V of 128) and d256 kernels, padded),
// causal, windowed, softcap, GQA/MQA, deterministic=True up to 128, padded
// batches and variable lengths (cu_seqlens, seqused_q/k, leftpad_k) with
// strides the tensor maps can describe, in any combination. Not (the sm80
// family runs them): ALiBi, dropout (softcap with either included), head dims
// up to 32 and over 256, deterministic=True over 128.
bool serves_bwd(const BwdParams& params);
cudaError_t run_bwd(const BwdParams& params, cudaStream_t stream);
// The scratch a backward call needs (flash.h: BwdWorkspace): dq_accum, and
// with deterministic=True the semaphores that order the dQ adds; sm80's
// where the call runs there.
BwdWorkspace bwd_workspace(const BwdParams& params);
KvcacheWorkspace plan_kvcache(FwdParams& params, int64_t requested_splits);
cudaError_t run_kvcache_append(const AppendParams& params, cudaStream_t stream);
cudaError_t run_fwd_kvcache(const FwdParams& params, cudaStream_t stream);
int kernel_head_dim(int head_dim);
// flash_attn_combine: sm80's kernel (a memory-bound merge, nothing Hopper-specific).
cudaError_t run_combine(const CombineParams& params, cudaStream_t stream);
cudaError_t run_dequantize_fp8(const DequantizeParams& params, cudaStream_t stream);
// The zeroed counters a forward call needs (FwdParams::fwd_counters): the tile
// counter of a causal or windowed forward (its blocks draw tiles dynamically).
int fwd_counters(const FwdParams& params);
// FP8 attention (FwdParams::fp8): whether the sm90 FP8 kernel serves a call
// (head dims up to 256, padded to 128 or 256, v's no wider; causal, windowed,
// GQA/MQA, padded or packed batches with cu_seqlens; not: softcap, ALiBi,
// dropout, sinks, pages, seqused_q/k, leftpad_k, broadcast views), the bytes of
// the workspace it asks for (params.vt_ptr: v transposed, fp8_values.cuh), and
// the call (cudaErrorInvalidValue where it does not serve it).
bool serves_fp8(const FwdParams& params);
int64_t fwd_fp8_workspace(const FwdParams& params);
cudaError_t run_fwd_fp8(const FwdParams& params, cudaStream_t stream);
// A message naming this family's switch that has a value it does not take
// (FLASHATTN_SM90_PAGED_COPY), or nullptr.
const char* switch_error();

}  // namespace flash::sm90
