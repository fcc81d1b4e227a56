// The only torch-aware C++ in flashattn (with its two headers: checks.h, the
// input checks, and family.h, which kernel family serves a device): allocates
// outputs and scratch, fills the params struct, calls the family's entry point
// on the current stream, and registers the operators' CUDA implementations
// (their schemas are defined once, in flashattn/ops.py). It knows nothing of how
// attention is computed.
#include <Python.h>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "api/checks.h"
#include "api/family.h"
#include "api/faults.h"
#include "common/flash.h"

namespace {

using namespace flashattn_api;

// t itself when its first row is 16-byte aligned, else an aligned copy (the
// kernels read 16-byte chunks). Under torch.compile flash_attn_func cannot see
// addresses, only strides, so the start is checked here.
at::Tensor aligned(const at::Tensor& t) {
    return readable_in_place(t) ? t : t.clone(at::MemoryFormat::Contiguous);
}

// An optional fp32 tensor as the kernels read it: contiguous (a strided view is copied).
std::optional<at::Tensor> contiguous_if_given(const std::optional<at::Tensor>& t) {
    return t.has_value() ? std::optional<at::Tensor>(t->contiguous()) : std::nullopt;
}

// The shape of out (and dout): q's, with v's head dim.
std::vector<int64_t> out_shape(const at::Tensor& q, const at::Tensor& v) {
    std::vector<int64_t> sizes = q.sizes().vec();
    sizes.back() = v.size(-1);
    return sizes;
}

// Fills the params both passes share. out and lse are written by the forward
// and read by the backward.
void set_params(flash::FwdParams& params, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const at::Tensor& out, const at::Tensor& lse, const Layout& layout, int64_t batch,
                const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_k,
                int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale, bool causal, int64_t window_left,
                int64_t window_right, double softcap, const std::optional<at::Tensor>& alibi_slopes,
                double dropout_p, const std::optional<at::Tensor>& rng_state,
                const std::optional<at::Tensor>& learnable_sink, int max_smem_per_block) {
    params.q_ptr = q.data_ptr();
    params.k_ptr = k.data_ptr();
    params.v_ptr = v.data_ptr();
    params.o_ptr = out.data_ptr();
    params.lse_ptr = lse.data_ptr<float>();
    params.q_batch_stride = layout.batch_stride(q), params.q_row_stride = q.stride(-3),
    params.q_head_stride = q.stride(-2);
    params.k_batch_stride = layout.batch_stride(k), params.k_row_stride = k.stride(-3),
    params.k_head_stride = k.stride(-2);
    params.v_batch_stride = layout.batch_stride(v), params.v_row_stride = v.stride(-3),
    params.v_head_stride = v.stride(-2);
    params.o_batch_stride = layout.batch_stride(out), params.o_row_stride = out.stride(-3),
    params.o_head_stride = out.stride(-2);
    params.batch = static_cast<int>(batch);
    params.seqlen_q = static_cast<int>(layout.varlen ? max_seqlen_q : q.size(1));
    params.seqlen_k = static_cast<int>(layout.varlen ? max_seqlen_k : k.size(1));
    params.num_heads = static_cast<int>(q.size(-2));
    params.num_heads_k = static_cast<int>(k.size(-2));
    params.head_dim = static_cast<int>(q.size(-1));
    params.head_dim_v = static_cast<int>(v.size(-1));
    params.heads_per_kv_head = params.num_heads / params.num_heads_k;

    params.cu_seqlens_q = layout.varlen ? cu_seqlens_q->data_ptr<int>() : nullptr;
    params.cu_seqlens_k = layout.varlen ? cu_seqlens_k->data_ptr<int>() : nullptr;
    params.total_q = static_cast<int>(layout.rows(q) * (layout.varlen ? 1 : batch));
    params.total_k = static_cast<int>(layout.rows(k) * (layout.varlen ? 1 : batch));
    // lse: [B, H, Sq] padded, [H, total_q] packed.
    params.lse_batch_stride = layout.varlen ? 0 : lse.stride(0);
    params.lse_head_stride = lse.stride(-2);

    params.window_left = static_cast<int>(window_left);
    params.window_right = causal ? 0 : static_cast<int>(window_right);
    params.is_local = params.window_left >= 0 || params.window_right >= 0;

    constexpr double kLog2e = 1.4426950408889634;  // exp(x) = exp2(x * log2(e))
    params.softmax_scale = static_cast<float>(softmax_scale);
    params.softcap = static_cast<float>(softcap);
    params.softcap_inner_scale = softcap > 0 ? static_cast<float>(softmax_scale / softcap) : 0.f;
    const double unit_scale = softcap > 0 ? softcap : softmax_scale;  // the kernels' score unit, in natural log
    params.softmax_scale_log2 = static_cast<float>(unit_scale * kLog2e);
    params.alibi_slopes_ptr = alibi_slopes.has_value() ? alibi_slopes->data_ptr<float>() : nullptr;
    params.alibi_batch_stride = alibi_slopes.has_value() && alibi_slopes->dim() == 2 ? alibi_slopes->stride(0) : 0;
    params.alibi_scale = static_cast<float>(1.0 / unit_scale);
    // An element is dropped iff its 16-bit draw is below floor(p * 2^16).
    params.dropout_threshold = static_cast<uint32_t>(std::floor(dropout_p * 65536.0));
    params.dropout_rescale = static_cast<float>(1.0 / (1.0 - dropout_p));
    params.rng_state = dropout_p > 0 ? rng_state->data_ptr<int64_t>() : nullptr;
    params.has_extras = softcap > 0 || alibi_slopes.has_value() || dropout_p > 0;
    params.learnable_sink = learnable_sink.has_value() ? learnable_sink->data_ptr<float>() : nullptr;

    params.dtype = q.scalar_type() == at::kBFloat16 ? flash::DType::kBFloat16 : flash::DType::kFloat16;
    params.max_smem_per_block = max_smem_per_block;
}

// The per-sequence options of a variable-length batch (checks.h:
// check_sequences): lengths that narrow the sequences, and pages for k and v.
void set_sequences(flash::FwdParams& params, const at::Tensor& q, const at::Tensor& k,
                   const std::optional<at::Tensor>& seqused_q, const std::optional<at::Tensor>& seqused_k,
                   const std::optional<at::Tensor>& leftpad_k, const std::optional<at::Tensor>& block_table) {
    params.seqused_q = seqused_q.has_value() ? seqused_q->data_ptr<int>() : nullptr;
    params.seqused_k = seqused_k.has_value() ? seqused_k->data_ptr<int>() : nullptr;
    params.leftpad_k = leftpad_k.has_value() ? leftpad_k->data_ptr<int>() : nullptr;
    if (block_table.has_value()) {
        params.block_table = block_table->data_ptr<int>();
        params.block_table_batch_stride = block_table->stride(0);
        params.page_size = static_cast<int>(k.size(1));
        params.kv_capacity = static_cast<int>(block_table->size(1) * k.size(1));
        params.kv_cache_batch = static_cast<int>(k.size(0));
        params.num_splits = 1;
    }
    if (seqused_q || seqused_k || leftpad_k || block_table) {  // values the kernels check (index_check.cuh)
        params.faults = fault_sink(q.get_device(), c10::cuda::getCurrentCUDAStream(q.get_device()).stream());
    }
}

void check_launch(cudaError_t err, const char* pass, const at::Tensor& q, const flash::FwdParams& params,
                  const Family& family) {
    TORCH_CHECK(err == cudaSuccess, "flashattn: ", pass, " kernel (", family.name, ", head_dim ",
                str(family.kernel_head_dim(params.head_dim)), ", ", q.scalar_type(),
                params.is_local ? ", local" : "", params.has_extras ? ", extras" : "",
                ") failed to launch: ", cudaGetErrorString(err), " (the device allows ",
                str(params.max_smem_per_block), " bytes of shared memory per block)");
}

// `count` int32 counters that are zero on entry and that the kernels leave
// zero again (flash::KvcacheWorkspace, FwdParams::fwd_counters,
// BwdParams::dq_semaphore): one buffer per (device, stream) serves
// every call on that stream (calls on one stream never overlap; on two streams
// they may, and never share a buffer). A call being captured into a CUDA graph
// gets a buffer of its own, zeroed inside the graph: replays of different
// graphs may overlap.
at::Tensor zeroed_counters(const at::Tensor& q, int64_t count, cudaStream_t stream) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    const at::TensorOptions options = q.options().dtype(at::kInt);
    if (capture != cudaStreamCaptureStatusNone) return at::zeros({count}, options);
    static std::mutex mutex;
    // Never destroyed: the tensors must not be freed after CUDA shuts down at exit.
    static auto* buffers = new std::map<std::pair<int, cudaStream_t>, at::Tensor>();
    const std::lock_guard<std::mutex> lock(mutex);
    at::Tensor& buffer = (*buffers)[{q.get_device(), stream}];
    if (!buffer.defined() || buffer.numel() < count) buffer = at::zeros({std::max<int64_t>(count, 1024)}, options);
    return buffer;
}

// `deterministic` is in the schema for the backward, which autograd runs with
// the forward's arguments; the forward is deterministic either way.
std::tuple<at::Tensor, at::Tensor> mha_fwd(const at::Tensor& q,  // [B, Sq, H, D] or [total_q, H, D]
                                           const at::Tensor& k,  // [B, Sk, Hk, D] or [total_k, Hk, D]
                                           const at::Tensor& v,  // like k, with head dim Dv <= D
                                           double softmax_scale, bool causal, bool /*deterministic*/,
                                           int64_t window_left, int64_t window_right, double softcap,
                                           const std::optional<at::Tensor>& alibi_slopes, double dropout_p,
                                           const std::optional<at::Tensor>& rng_state,
                                           const std::optional<at::Tensor>& cu_seqlens_q,
                                           const std::optional<at::Tensor>& cu_seqlens_k, int64_t max_seqlen_q,
                                           int64_t max_seqlen_k, const std::optional<at::Tensor>& seqused_q,
                                           const std::optional<at::Tensor>& seqused_k,
                                           const std::optional<at::Tensor>& leftpad_k,
                                           const std::optional<at::Tensor>& block_table,
                                           const std::optional<at::Tensor>& learnable_sink) {
    Layout layout = check_varlen(q, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
    check_needs_varlen(layout, seqused_q, seqused_k, leftpad_k, block_table);
    layout.paged = block_table.has_value();
    check_qkv(q, k, v, layout);
    const DeviceKernels kernels = device_kernels(q.get_device());
    raise_recorded_fault(q.get_device(), c10::cuda::getCurrentCUDAStream(q.get_device()).stream());
    const int64_t batch = layout.varlen ? cu_seqlens_q->size(0) - 1 : q.size(0);
    check_options(q, batch, window_left, window_right, alibi_slopes, dropout_p, rng_state);
    check_sequences(q, k, layout, batch, seqused_q, seqused_k, leftpad_k, block_table);
    check_learnable_sink(learnable_sink, q);
    const c10::cuda::CUDAGuard device_guard(q.device());
    const int64_t rows = layout.rows(q), num_heads = q.size(-2);
    // A variable-length batch's rows that no sequence uses (past cu_seqlens_q[-1],
    // which batches padded for CUDA graphs carry, or past a sequence's
    // seqused_q) get out 0 and lse -inf, as on CPU: from the family's forward
    // (sm80.h: run_fwd_unwritten_rows), or here when there is no sequence.
    at::Tensor out = at::empty(out_shape(q, v), q.options());
    at::Tensor lse = layout.varlen ? at::empty({num_heads, rows}, q.options().dtype(at::kFloat))
                                   : at::empty({batch, num_heads, rows}, q.options().dtype(at::kFloat));
    if (batch == 0 || rows == 0 || num_heads == 0) return {out.zero_(), lse.fill_(-INFINITY)};

    const at::Tensor q_in = aligned(q), k_in = aligned(k), v_in = aligned(v);
    const std::optional<at::Tensor> sink_in = contiguous_if_given(learnable_sink);
    flash::FwdParams params{};
    set_params(params, q_in, k_in, v_in, out, lse, layout, batch, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
               max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, dropout_p,
               rng_state, sink_in, kernels.max_smem_per_block);
    set_sequences(params, q, k, seqused_q, seqused_k, leftpad_k, block_table);
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
    at::Tensor counters;
    if (const int count = kernels.family->fwd_counters(params); count > 0) {
        counters = zeroed_counters(q, count, stream);
        params.fwd_counters = reinterpret_cast<unsigned int*>(counters.data_ptr<int>());
    }
    check_launch(kernels.family->run_fwd(params, stream), "forward", q, params, *kernels.family);
    return {out, lse};
}

// FP8 attention (flashattn/ops.py: FP8_SCHEMA): float8_e4m3fn q, k, v standing
// for stored value x descale, out in out_dtype (bf16 by default, or fp16), on
// the family's FP8 kernel; forward only. A call the family's FP8 kernel does not
// serve is refused (flashattn/fp8.py sends only calls it serves here).
std::tuple<at::Tensor, at::Tensor> mha_fwd_fp8(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                               const std::optional<at::Tensor>& q_descale,
                                               const std::optional<at::Tensor>& k_descale,
                                               const std::optional<at::Tensor>& v_descale, double softmax_scale,
                                               bool causal, int64_t window_left, int64_t window_right,
                                               const std::optional<at::Tensor>& cu_seqlens_q,
                                               const std::optional<at::Tensor>& cu_seqlens_k, int64_t max_seqlen_q,
                                               int64_t max_seqlen_k, std::optional<at::ScalarType> out_dtype) {
    const Layout layout = check_varlen(q, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
    check_qkv(q, k, v, layout, /*fp8=*/true);
    const DeviceKernels kernels = device_kernels(q.get_device());
    const int64_t batch = layout.varlen ? cu_seqlens_q->size(0) - 1 : q.size(0);
    check_options(q, batch, window_left, window_right, std::nullopt, 0.0, std::nullopt);
    const int64_t num_heads_k = k.size(-2);
    check_descale(q_descale, "q_descale", q, batch, num_heads_k);
    check_descale(k_descale, "k_descale", q, batch, num_heads_k);
    check_descale(v_descale, "v_descale", q, batch, num_heads_k);
    const at::ScalarType out_type = out_dtype.value_or(at::kBFloat16);
    TORCH_CHECK_VALUE(out_type == at::kBFloat16 || out_type == at::kHalf,
                      "flashattn: out_dtype must be torch.bfloat16 or torch.float16 for FP8 inputs, got ",
                      str(out_type));
    TORCH_CHECK_NOT_IMPLEMENTED(kernels.family->run_fwd_fp8 != nullptr, "flashattn: no FP8 kernel serves cuda:",
                                str(q.get_device()), " (the ", kernels.family->name,
                                " family; the FP8 kernel is sm90's); flash_attn_func runs FP8 inputs dequantised "
                                "there");
    const c10::cuda::CUDAGuard device_guard(q.device());
    const int64_t rows = layout.rows(q), num_heads = q.size(-2);
    const at::TensorOptions out_options = q.options().dtype(out_type);
    at::Tensor out = at::empty(out_shape(q, v), out_options);
    at::Tensor lse = layout.varlen ? at::empty({num_heads, rows}, q.options().dtype(at::kFloat))
                                   : at::empty({batch, num_heads, rows}, q.options().dtype(at::kFloat));
    if (batch == 0 || rows == 0 || num_heads == 0) return {out.zero_(), lse.fill_(-INFINITY)};

    const at::Tensor q_in = aligned(q), k_in = aligned(k), v_in = aligned(v);
    const std::optional<at::Tensor> q_descale_in = contiguous_if_given(q_descale),
                                    k_descale_in = contiguous_if_given(k_descale),
                                    v_descale_in = contiguous_if_given(v_descale);
    flash::FwdParams params{};
    set_params(params, q_in, k_in, v_in, out, lse, layout, batch, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
               max_seqlen_k, softmax_scale, causal, window_left, window_right, /*softcap=*/0.0, std::nullopt,
               /*dropout_p=*/0.0, std::nullopt, std::nullopt, kernels.max_smem_per_block);
    params.dtype = out_type == at::kBFloat16 ? flash::DType::kBFloat16 : flash::DType::kFloat16;
    params.fp8 = true;
    params.q_descale = q_descale_in.has_value() ? q_descale_in->data_ptr<float>() : nullptr;
    params.k_descale = k_descale_in.has_value() ? k_descale_in->data_ptr<float>() : nullptr;
    params.v_descale = v_descale_in.has_value() ? v_descale_in->data_ptr<float>() : nullptr;
    TORCH_CHECK_VALUE(kernels.family->serves_fp8(params), "flashattn: the FP8 kernel does not serve q ",
                      str(q.sizes()), ", k ", str(k.sizes()), ", v ", str(v.sizes()),
                      " (head dims up to 256, v's no wider than q's, strides that are not 0)");
    const at::Tensor workspace = at::empty({kernels.family->fwd_fp8_workspace(params)}, q.options().dtype(at::kByte));
    params.vt_ptr = workspace.data_ptr();
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
    at::Tensor counters;
    if (const int count = kernels.family->fwd_counters(params); count > 0) {
        counters = zeroed_counters(q, count, stream);
        params.fwd_counters = reinterpret_cast<unsigned int*>(counters.data_ptr<int>());
    }
    check_launch(kernels.family->run_fwd_fp8(params, stream), "FP8 forward", q, params, *kernels.family);
    return {out, lse};
}

// The sink's gradient of a backward with no key, where no kernel runs (flash.h:
// BwdParams::dsink_ptr): -sum over each head's rows of exp(sink - lse) * (D -
// dlse), D = rowsum(dout * out), rows of lse -inf (no sequence) left out.
at::Tensor sink_gradient_without_keys(const at::Tensor& dout, const at::Tensor& out, const at::Tensor& lse,
                                      const at::Tensor& learnable_sink, const std::optional<at::Tensor>& dlse,
                                      const Layout& layout) {
    // D in lse's layout: [B, Sq, H] -> [B, H, Sq], or [total_q, H] -> [H, total_q].
    at::Tensor delta = (dout.to(at::kFloat) * out.to(at::kFloat)).sum(-1).transpose(-1, -2);
    const at::Tensor no_row = lse == -INFINITY;
    if (dlse.has_value()) delta = delta - dlse->masked_fill(no_row, 0.0);
    const at::Tensor sink = layout.varlen ? learnable_sink.view({-1, 1}) : learnable_sink.view({1, -1, 1});
    const at::Tensor weight = (sink - lse).exp().masked_fill(no_row, 0.0);
    return layout.varlen ? -(weight * delta).sum(1) : -(weight * delta).sum(at::IntArrayRef{0, 2});
}

// The gradients of the forward above, and with learnable_sink its gradient
// (fp32 [H]; an empty (0,) tensor without one); dlse, if given, is the
// gradient of the forward's lse. deterministic=true: bitwise reproducible
// (dQ summed in one order; dsink always is); false: dQ is summed with fp32
// atomics in whatever order the blocks finish, where that is faster.
// dout may have any strides: it is whatever the consumer of out produced (the
// gradient of out.sum() is a broadcast of stride 0, a slice of a larger
// gradient starts anywhere), and it is copied when the kernels cannot read it
// in place.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> mha_bwd(
    const at::Tensor& dout,  // like out
    const at::Tensor& q,     // [B, Sq, H, D] or [total_q, H, D]
    const at::Tensor& k,     // [B, Sk, Hk, D] or [total_k, Hk, D]
    const at::Tensor& v,     // like k, with head dim Dv <= D
    const at::Tensor& out,   // like q, with v's head dim
    const at::Tensor& lse,   // [B, H, Sq] or [H, total_q], fp32
    double softmax_scale, bool causal, bool deterministic, int64_t window_left, int64_t window_right,
    double softcap, const std::optional<at::Tensor>& alibi_slopes, double dropout_p,
    const std::optional<at::Tensor>& rng_state, const std::optional<at::Tensor>& cu_seqlens_q,
    const std::optional<at::Tensor>& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
    const std::optional<at::Tensor>& seqused_q, const std::optional<at::Tensor>& seqused_k,
    const std::optional<at::Tensor>& leftpad_k, const std::optional<at::Tensor>& learnable_sink,
    const std::optional<at::Tensor>& dlse) {
    const Layout layout = check_varlen(q, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
    check_needs_varlen(layout, seqused_q, seqused_k, leftpad_k, std::nullopt);
    check_qkv(q, k, v, layout);
    const DeviceKernels kernels = device_kernels(q.get_device());
    raise_recorded_fault(q.get_device(), c10::cuda::getCurrentCUDAStream(q.get_device()).stream());
    const int64_t batch = layout.varlen ? cu_seqlens_q->size(0) - 1 : q.size(0);
    check_options(q, batch, window_left, window_right, alibi_slopes, dropout_p, rng_state);
    check_sequences(q, k, layout, batch, seqused_q, seqused_k, leftpad_k, std::nullopt);
    check_tensor(dout, "dout", q, layout);
    check_input(out, "out", q, layout);
    const std::vector<int64_t> out_sizes = out_shape(q, v);
    TORCH_CHECK(dout.sizes() == out_sizes && out.sizes() == out_sizes, "flashattn: dout ", str(dout.sizes()),
                " and out ", str(out.sizes()), " must have the shape of q ", str(q.sizes()), " with v's headdim, ",
                str(at::IntArrayRef(out_sizes)));
    const int64_t rows = layout.rows(q), num_heads = q.size(-2);
    const bool lse_ok = lse.is_cuda() && lse.device() == q.device() && lse.scalar_type() == at::kFloat &&
                        lse.is_contiguous() &&
                        (layout.varlen ? lse.dim() == 2 && lse.size(0) == num_heads && lse.size(1) == rows
                                       : lse.dim() == 3 && lse.size(0) == batch && lse.size(1) == num_heads &&
                                             lse.size(2) == rows);
    const std::string lse_shape = layout.varlen ? "(" + str(num_heads) + ", " + str(rows) + ")"
                                                : "(" + str(batch) + ", " + str(num_heads) + ", " + str(rows) + ")";
    TORCH_CHECK(lse_ok, "flashattn: softmax_lse must be the forward's contiguous float32 tensor of shape ", lse_shape,
                " on q's device, got ", str(lse.sizes()), " ", lse.scalar_type(), " on ", lse.device().str());
    check_learnable_sink(learnable_sink, q);
    check_dlse(dlse, lse);
    const c10::cuda::CUDAGuard device_guard(q.device());
    at::Tensor dq = at::empty(q.sizes(), q.options());
    at::Tensor dk = at::empty(k.sizes(), k.options());
    at::Tensor dv = at::empty(v.sizes(), v.options());
    at::Tensor dsink = at::empty({learnable_sink.has_value() ? num_heads : 0}, q.options().dtype(at::kFloat));
    if (batch == 0 || num_heads == 0 || rows == 0) return {dq.zero_(), dk.zero_(), dv.zero_(), dsink.zero_()};
    if (layout.rows(k) == 0) {  // no key: every gradient is 0 but the sink's
        if (learnable_sink.has_value()) {
            dsink = sink_gradient_without_keys(dout, out, lse, *learnable_sink, dlse, layout);
        }
        return {dq.zero_(), dk.zero_(), dv.zero_(), dsink};
    }
    // A key no query sees gets no block's attention in a variable-length batch
    // whose sequences leave rows unassigned (or cut them with seqused_k,
    // leftpad_k), nor does a query row past cu_seqlens_q[-1] or seqused_q;
    // zeroing first covers them.
    if (layout.varlen) {
        dq.zero_();
        dk.zero_();
        dv.zero_();
    }
    at::Tensor dsum = at::empty(lse.sizes(), lse.options());

    // A broadcast dout is copied too: not every family's copy engine takes a
    // stride of 0, and which kernel runs (with its own summation order, under
    // deterministic=True too) must not depend on dout's layout.
    const bool dout_readable =
        dout.stride(-1) == 1 && strides_aligned(dout) && readable_in_place(dout) && !broadcasts(dout);
    const at::Tensor dout_rows = dout_readable ? dout : dout.clone(at::MemoryFormat::Contiguous);

    const at::Tensor q_in = aligned(q), k_in = aligned(k), v_in = aligned(v), out_in = aligned(out);
    const std::optional<at::Tensor> sink_in = contiguous_if_given(learnable_sink);
    const std::optional<at::Tensor> dlse_in = contiguous_if_given(dlse);
    flash::BwdParams params{};
    set_params(params, q_in, k_in, v_in, out_in, lse, layout, batch, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
               max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, dropout_p,
               rng_state, sink_in, kernels.max_smem_per_block);
    set_sequences(params, q, k, seqused_q, seqused_k, leftpad_k, std::nullopt);
    params.do_ptr = dout_rows.data_ptr();
    params.dq_ptr = dq.data_ptr();
    params.dk_ptr = dk.data_ptr();
    params.dv_ptr = dv.data_ptr();
    params.dsum_ptr = dsum.data_ptr<float>();
    params.dlse_ptr = dlse_in.has_value() ? dlse_in->data_ptr<float>() : nullptr;
    at::Tensor dsink_partial;
    if (learnable_sink.has_value()) {
        dsink_partial = at::empty({num_heads, flash::kDsinkPartials}, q.options().dtype(at::kFloat));
        params.dsink_ptr = dsink.data_ptr<float>();
        params.dsink_partial_ptr = dsink_partial.data_ptr<float>();
    }
    params.deterministic = deterministic;
    params.do_batch_stride = layout.batch_stride(dout_rows), params.do_row_stride = dout_rows.stride(-3),
    params.do_head_stride = dout_rows.stride(-2);
    params.dq_batch_stride = layout.batch_stride(dq), params.dq_row_stride = dq.stride(-3),
    params.dq_head_stride = dq.stride(-2);
    params.dk_batch_stride = layout.batch_stride(dk), params.dk_row_stride = dk.stride(-3),
    params.dk_head_stride = dk.stride(-2);
    params.dv_batch_stride = layout.batch_stride(dv), params.dv_row_stride = dv.stride(-3),
    params.dv_head_stride = dv.stride(-2);
    // The scratch the family's algorithm asks for, once the params say what the call is.
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
    const flash::BwdWorkspace workspace = kernels.family->bwd_workspace(params);
    at::Tensor dq_accum, counters, partials;
    if (workspace.dq_accum) {
        dq_accum = at::empty(q.sizes(), q.options().dtype(at::kFloat));
        params.dq_accum_ptr = dq_accum.data_ptr<float>();
        params.dq_accum_batch_stride = layout.varlen ? 0 : dq_accum.stride(0);
    }
    // The semaphores, then the flags, in one buffer of zeroed counters.
    if (workspace.semaphores + workspace.flags > 0) {
        counters = zeroed_counters(q, workspace.semaphores + workspace.flags, stream);
        if (workspace.semaphores > 0) params.dq_semaphore = counters.data_ptr<int>();
        if (workspace.flags > 0) params.tail_flags = counters.data_ptr<int>() + workspace.semaphores;
    }
    if (workspace.partials > 0) {
        partials = at::empty({workspace.partials}, q.options().dtype(at::kFloat));
        params.tail_partials = partials.data_ptr<float>();
    }
    check_launch(kernels.family->run_bwd(params, stream), "backward", q, params, *kernels.family);
    return {dq, dk, dv, dsink};
}

// flash_attn_with_kvcache: append k/v (rotary applied) into the cache in place,
// then attend from q (rotated) to each sequence's cached keys.
// fwd_kvcache and, kv_fp8, fwd_kvcache_fp8 (an e4m3 cache with k_descale and
// v_descale, q 16-bit; the decoding kernel only).
std::tuple<at::Tensor, at::Tensor> kvcache_forward(
    const at::Tensor& q,        // [B, Sq, H, D]
    const at::Tensor& k_cache,  // [B_cache, S_cache, Hk, D] or [num_blocks, page_size, Hk, D]
    const at::Tensor& v_cache,  // like k_cache, with head dim Dv <= D
    const std::optional<at::Tensor>& k_new, const std::optional<at::Tensor>& v_new,  // [B, Snew, Hk, D]
    const std::optional<at::Tensor>& rotary_cos, const std::optional<at::Tensor>& rotary_sin,
    const at::Tensor& cache_seqlens, const std::optional<at::Tensor>& cache_batch_idx,
    const std::optional<at::Tensor>& cache_leftpad, const std::optional<at::Tensor>& block_table,
    double softmax_scale, bool causal, int64_t window_left, int64_t window_right, double softcap,
    bool rotary_interleaved, const std::optional<at::Tensor>& alibi_slopes, int64_t num_splits,
    const std::optional<at::Tensor>& learnable_sink, bool kv_fp8, const std::optional<at::Tensor>& k_descale,
    const std::optional<at::Tensor>& v_descale) {
    const Layout layout{false};
    check_kvcache(q, k_cache, v_cache, k_new, v_new, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                  cache_leftpad, block_table, kv_fp8);
    check_learnable_sink(learnable_sink, q);
    const int64_t batch = q.size(0), seqlen_q = q.size(1), num_heads = q.size(2), head_dim = q.size(3);
    const int64_t num_heads_k = k_cache.size(2);
    std::optional<at::Tensor> k_descale_in, v_descale_in;
    if (kv_fp8) {
        check_descale(k_descale, "k_descale", q, batch, num_heads_k);
        check_descale(v_descale, "v_descale", q, batch, num_heads_k);
        const int64_t rows = flash::kvcache_block_rows(seqlen_q, num_heads / num_heads_k, alibi_slopes.has_value());
        TORCH_CHECK_VALUE(rows <= flash::kFp8KvcacheMaxRows, "flashattn: the FP8 KV-cache kernel decodes up to ",
                          str(flash::kFp8KvcacheMaxRows), " query rows per KV head (seqlen_q, or with seqlen_q 1 "
                          "the query heads of a KV head); got ", str(rows));
        k_descale_in = contiguous_if_given(k_descale);
        v_descale_in = contiguous_if_given(v_descale);
    }
    const bool paged = block_table.has_value();
    const int64_t page_size = paged ? k_cache.size(1) : 0;
    const int64_t cache_capacity = paged ? block_table->size(1) * page_size : k_cache.size(1);
    const int64_t seqlen_knew = k_new.has_value() ? k_new->size(1) : 0;
    at::Tensor cos, sin;
    const int64_t rotary_dim = rotary_cos.has_value() ? 2 * rotary_cos->size(1) : 0;
    if (rotary_dim > 0) {
        cos = rotary_cos->to(at::kFloat).contiguous();
        sin = rotary_sin->to(at::kFloat).contiguous();
    }
    check_options(q, batch, window_left, window_right, alibi_slopes, 0.0, std::nullopt);
    const DeviceKernels kernels = device_kernels(q.get_device());
    const c10::cuda::CUDAGuard device_guard(q.device());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
    raise_recorded_fault(q.get_device(), stream);
    const flash::FaultSink faults = fault_sink(q.get_device(), stream);

    // The index check, the append, and q rotated (where it rotates) into q_attn.
    at::Tensor q_attn = rotary_dim > 0 ? at::empty(q.sizes(), q.options()) : aligned(q);
    {
        flash::AppendParams ap{};
        if (seqlen_knew > 0) {
            ap.k_new_ptr = k_new->data_ptr(), ap.v_new_ptr = v_new->data_ptr();
            ap.knew_batch_stride = k_new->stride(0), ap.knew_row_stride = k_new->stride(1),
            ap.knew_head_stride = k_new->stride(2);
            ap.vnew_batch_stride = v_new->stride(0), ap.vnew_row_stride = v_new->stride(1),
            ap.vnew_head_stride = v_new->stride(2);
        }
        ap.k_cache_ptr = k_cache.data_ptr(), ap.v_cache_ptr = v_cache.data_ptr();
        ap.kc_batch_stride = k_cache.stride(0), ap.kc_row_stride = k_cache.stride(1),
        ap.kc_head_stride = k_cache.stride(2);
        ap.vc_batch_stride = v_cache.stride(0), ap.vc_row_stride = v_cache.stride(1),
        ap.vc_head_stride = v_cache.stride(2);
        ap.q_ptr = q.data_ptr();
        ap.q_rot_ptr = rotary_dim > 0 ? q_attn.data_ptr() : nullptr;
        ap.q_batch_stride = q.stride(0), ap.q_row_stride = q.stride(1), ap.q_head_stride = q.stride(2);
        ap.cache_seqlens = cache_seqlens.data_ptr<int>();
        ap.kv_batch_idx = cache_batch_idx.has_value() ? cache_batch_idx->data_ptr<int>() : nullptr;
        ap.block_table = paged ? block_table->data_ptr<int>() : nullptr;
        ap.block_table_batch_stride = paged ? block_table->stride(0) : 0;
        ap.page_size = static_cast<int>(page_size);
        ap.capacity = static_cast<int>(cache_capacity), ap.num_cache_rows = static_cast<int>(k_cache.size(0));
        ap.faults = faults;
        ap.rotary_cos = rotary_dim > 0 ? cos.data_ptr<float>() : nullptr;
        ap.rotary_sin = rotary_dim > 0 ? sin.data_ptr<float>() : nullptr;
        ap.rotary_rows = rotary_dim > 0 ? static_cast<int>(cos.size(0)) : 0;
        ap.rotary_dim = static_cast<int>(rotary_dim);
        ap.rotary_interleaved = rotary_interleaved;
        ap.q_positions_per_row = causal || window_left >= 0 || window_right >= 0;
        ap.batch = static_cast<int>(batch), ap.seqlen_q = static_cast<int>(seqlen_q);
        ap.seqlen_knew = static_cast<int>(seqlen_knew);
        ap.num_heads = static_cast<int>(num_heads), ap.num_heads_k = static_cast<int>(num_heads_k);
        ap.head_dim = static_cast<int>(head_dim), ap.head_dim_v = static_cast<int>(v_cache.size(3));
        ap.dtype = q.scalar_type() == at::kBFloat16 ? flash::DType::kBFloat16 : flash::DType::kFloat16;
        ap.kv_fp8 = kv_fp8;
        ap.k_descale = k_descale_in.has_value() ? k_descale_in->data_ptr<float>() : nullptr;
        if (seqlen_knew > 0 || rotary_dim > 0) {
            const cudaError_t err = kernels.family->run_kvcache_append(ap, stream);
            TORCH_CHECK(err == cudaSuccess, "flashattn: the KV-cache append kernel failed to launch: ",
                        cudaGetErrorString(err));
        }
    }

    at::Tensor out = at::empty(out_shape(q, v_cache), q.options());
    at::Tensor lse = at::empty({batch, num_heads, seqlen_q}, q.options().dtype(at::kFloat));
    if (batch == 0 || seqlen_q == 0) return {out, lse};

    const std::optional<at::Tensor> sink_in = contiguous_if_given(learnable_sink);
    flash::FwdParams params{};
    set_params(params, q_attn, k_cache, v_cache, out, lse, layout, batch, std::nullopt, std::nullopt, 0, 0,
               softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, 0.0, std::nullopt, sink_in,
               kernels.max_smem_per_block);
    params.seqlen_k = static_cast<int>(cache_capacity);
    params.cache_seqlens = cache_seqlens.data_ptr<int>();
    params.leftpad_k = cache_leftpad.has_value() ? cache_leftpad->data_ptr<int>() : nullptr;
    params.kv_batch_idx = cache_batch_idx.has_value() ? cache_batch_idx->data_ptr<int>() : nullptr;
    params.seqlen_knew = static_cast<int>(seqlen_knew);
    params.block_table = paged ? block_table->data_ptr<int>() : nullptr;
    params.block_table_batch_stride = paged ? block_table->stride(0) : 0;
    params.page_size = static_cast<int>(page_size);
    params.kv_capacity = static_cast<int>(cache_capacity);
    params.kv_cache_batch = static_cast<int>(k_cache.size(0));
    params.faults = faults;
    params.kv_fp8 = kv_fp8;
    params.k_descale = k_descale_in.has_value() ? k_descale_in->data_ptr<float>() : nullptr;
    params.v_descale = v_descale_in.has_value() ? v_descale_in->data_ptr<float>() : nullptr;
    const flash::KvcacheWorkspace workspace = kernels.family->plan_kvcache(params, num_splits);
    at::Tensor o_accum, lse_accum, counters;
    if (workspace.accum_floats > 0) {
        o_accum = at::empty({workspace.accum_floats}, q.options().dtype(at::kFloat));
        lse_accum = at::empty({workspace.lse_floats}, q.options().dtype(at::kFloat));
        params.o_accum_ptr = o_accum.data_ptr<float>();
        params.lse_accum_ptr = lse_accum.data_ptr<float>();
    }
    if (workspace.counters > 0) {
        counters = zeroed_counters(q, workspace.counters, stream);
        params.split_counters = reinterpret_cast<unsigned int*>(counters.data_ptr<int>());
    }
    check_launch(kernels.family->run_fwd_kvcache(params, stream), "KV-cache forward", q, params, *kernels.family);
    return {out, lse};
}

std::tuple<at::Tensor, at::Tensor> mha_fwd_kvcache(
    const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, const std::optional<at::Tensor>& k_new,
    const std::optional<at::Tensor>& v_new, const std::optional<at::Tensor>& rotary_cos,
    const std::optional<at::Tensor>& rotary_sin, const at::Tensor& cache_seqlens,
    const std::optional<at::Tensor>& cache_batch_idx, const std::optional<at::Tensor>& cache_leftpad,
    const std::optional<at::Tensor>& block_table, double softmax_scale, bool causal, int64_t window_left,
    int64_t window_right, double softcap, bool rotary_interleaved, const std::optional<at::Tensor>& alibi_slopes,
    int64_t num_splits, const std::optional<at::Tensor>& learnable_sink) {
    return kvcache_forward(q, k_cache, v_cache, k_new, v_new, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                           cache_leftpad, block_table, softmax_scale, causal, window_left, window_right, softcap,
                           rotary_interleaved, alibi_slopes, num_splits, learnable_sink, /*kv_fp8=*/false,
                           std::nullopt, std::nullopt);
}

std::tuple<at::Tensor, at::Tensor> mha_fwd_kvcache_fp8(
    const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, const std::optional<at::Tensor>& k_new,
    const std::optional<at::Tensor>& v_new, const std::optional<at::Tensor>& k_descale,
    const std::optional<at::Tensor>& v_descale, const std::optional<at::Tensor>& rotary_cos,
    const std::optional<at::Tensor>& rotary_sin, const at::Tensor& cache_seqlens,
    const std::optional<at::Tensor>& cache_batch_idx, const std::optional<at::Tensor>& cache_leftpad,
    const std::optional<at::Tensor>& block_table, double softmax_scale, bool causal, int64_t window_left,
    int64_t window_right, double softcap, bool rotary_interleaved, const std::optional<at::Tensor>& alibi_slopes,
    int64_t num_splits, const std::optional<at::Tensor>& learnable_sink) {
    return kvcache_forward(q, k_cache, v_cache, k_new, v_new, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                           cache_leftpad, block_table, softmax_scale, causal, window_left, window_right, softcap,
                           rotary_interleaved, alibi_slopes, num_splits, learnable_sink, /*kv_fp8=*/true, k_descale,
                           v_descale);
}

// flash_attn_combine (FlashAttention-3's): the partial results of attention
// over disjoint sets of keys merged by their LSE into out [B, S, H, D] in
// out_dtype (default float32) and lse [B, S, H] fp32, both contiguous.
std::tuple<at::Tensor, at::Tensor> mha_combine(const at::Tensor& out_partial,  // [splits, B, S, H, D] fp32
                                               const at::Tensor& lse_partial,  // [splits, B, S, H] fp32
                                               std::optional<at::ScalarType> out_dtype) {
    const at::ScalarType dtype = out_dtype.value_or(at::kFloat);
    check_combine(out_partial, lse_partial, dtype);
    const DeviceKernels kernels = device_kernels(out_partial.get_device());
    const c10::cuda::CUDAGuard device_guard(out_partial.device());
    const int64_t batch = out_partial.size(1), seqlen = out_partial.size(2), num_heads = out_partial.size(3);
    const int64_t head_dim = out_partial.size(4);
    at::Tensor out = at::empty({batch, seqlen, num_heads, head_dim}, out_partial.options().dtype(dtype));
    at::Tensor lse = at::empty({batch, seqlen, num_heads}, out_partial.options());
    flash::CombineParams params{};
    params.out_partial_ptr = out_partial.data_ptr<float>();
    params.lse_partial_ptr = lse_partial.data_ptr<float>();
    params.out_ptr = out.data_ptr();
    params.lse_ptr = lse.data_ptr<float>();
    params.op_split_stride = out_partial.stride(0), params.op_batch_stride = out_partial.stride(1);
    params.op_row_stride = out_partial.stride(2), params.op_head_stride = out_partial.stride(3);
    params.lp_split_stride = lse_partial.stride(0), params.lp_batch_stride = lse_partial.stride(1);
    params.lp_row_stride = lse_partial.stride(2), params.lp_head_stride = lse_partial.stride(3);
    params.o_batch_stride = out.stride(0), params.o_row_stride = out.stride(1), params.o_head_stride = out.stride(2);
    params.num_splits = static_cast<int>(out_partial.size(0));
    params.batch = static_cast<int>(batch), params.seqlen = static_cast<int>(seqlen);
    params.num_heads = static_cast<int>(num_heads), params.head_dim = static_cast<int>(head_dim);
    params.out_type = dtype == at::kHalf       ? flash::CombineParams::OutType::kFloat16
                      : dtype == at::kBFloat16 ? flash::CombineParams::OutType::kBFloat16
                                               : flash::CombineParams::OutType::kFloat32;
    // 4 columns per 16-byte load: every stride of out_partial but the last a multiple of 4, its start 16-byte
    // aligned (out is fresh, contiguous: its rows follow head_dim).
    bool vectorized = head_dim % 4 == 0 && reinterpret_cast<uintptr_t>(out_partial.data_ptr()) % 16 == 0;
    for (int64_t d = 0; d + 1 < out_partial.dim(); ++d) vectorized &= out_partial.stride(d) % 4 == 0;
    params.vectorized = vectorized;
    const cudaError_t err = kernels.family->run_combine(params, c10::cuda::getCurrentCUDAStream().stream());
    TORCH_CHECK(err == cudaSuccess, "flashattn: the combine kernel failed to launch: ", cudaGetErrorString(err));
    return {out, lse};
}

// The dequantising route of FP8 attention: t (rows, seqlen, nheads, headdim)
// e4m3 times scale (rows, nheads) fp32, rounded to out_dtype, contiguous.
at::Tensor mha_dequantize_fp8(const at::Tensor& t, const at::Tensor& scale, at::ScalarType out_dtype) {
    check_dequantize_fp8(t, scale, out_dtype);
    const DeviceKernels kernels = device_kernels(t.get_device());
    const c10::cuda::CUDAGuard device_guard(t.device());
    at::Tensor out = at::empty(t.sizes(), t.options().dtype(out_dtype));
    flash::DequantizeParams params{};
    params.in_ptr = reinterpret_cast<const uint8_t*>(t.data_ptr());
    params.scale_ptr = scale.data_ptr<float>();
    params.out_ptr = out.data_ptr();
    params.in_row_stride = t.stride(0), params.in_seq_stride = t.stride(1), params.in_head_stride = t.stride(2);
    params.scale_row_stride = scale.stride(0), params.scale_head_stride = scale.stride(1);
    params.rows = t.size(0), params.seqlen = t.size(1), params.heads = t.size(2);
    params.head_dim = static_cast<int>(t.size(3));
    params.out_type = out_dtype == at::kBFloat16 ? flash::DequantizeParams::OutType::kBFloat16
                                                 : flash::DequantizeParams::OutType::kFloat16;
    // 16 values per 16-byte load: the head dim and every stride above it multiples of 16, the start
    // 16-byte aligned (out is fresh and contiguous: 32-byte aligned rows of 16-value chunks).
    bool vectorized = t.size(3) % 16 == 0 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
    for (int64_t d = 0; d + 1 < t.dim(); ++d) vectorized &= t.stride(d) % 16 == 0;
    params.vectorized = vectorized;
    const cudaError_t err =
        kernels.family->run_dequantize_fp8(params, c10::cuda::getCurrentCUDAStream().stream());
    TORCH_CHECK(err == cudaSuccess, "flashattn: the dequantize kernel failed to launch: ", cudaGetErrorString(err));
    return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(flashattn, CUDA, m) {
    m.impl("fwd", &mha_fwd);
    m.impl("bwd", &mha_bwd);
    m.impl("fwd_kvcache", &mha_fwd_kvcache);
    m.impl("fwd_kvcache_fp8", &mha_fwd_kvcache_fp8);
    m.impl("combine", &mha_combine);
    m.impl("fwd_fp8", &mha_fwd_fp8);
    m.impl("dequantize_fp8", &mha_dequantize_fp8);
}

// flashattn._C.kernel_family(device_index) -> str: the family that serves
// calls on that CUDA device (api/family.h), for tests and benchmark labels.
PyObject* kernel_family(PyObject* /*module*/, PyObject* arg) {
    const long device = PyLong_AsLong(arg);
    if (device == -1 && PyErr_Occurred()) return nullptr;
    try {
        return PyUnicode_FromString(flashattn_api::device_kernels(static_cast<int>(device)).family->name);
    } catch (const c10::Error& e) {
        PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
        return nullptr;
    }
}

// flashattn._C.check_faults(device_index): raises RuntimeError for an index
// fault a kernel recorded on that device since the last check (api/faults.h).
PyObject* check_faults(PyObject* /*module*/, PyObject* arg) {
    const long device = PyLong_AsLong(arg);
    if (device == -1 && PyErr_Occurred()) return nullptr;
    try {
        flashattn_api::raise_recorded_fault(static_cast<int>(device),
                                            c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream());
    } catch (const c10::Error& e) {
        PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
        return nullptr;
    }
    Py_RETURN_NONE;
}

// `import flashattn._C` (after flashattn.ops has defined the schemas) loads
// this library, which registers the CUDA implementations above; the module
// itself holds kernel_family and check_faults.
PyMODINIT_FUNC PyInit__C(void) {
    static PyMethodDef methods[] = {
        {"kernel_family", kernel_family, METH_O, "The kernel family that serves a CUDA device (its index)."},
        {"check_faults", check_faults, METH_O, "Raises an index fault recorded on a CUDA device (its index)."},
        {nullptr, nullptr, 0, nullptr}};
    static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, methods};
    return PyModule_Create(&module);
}
