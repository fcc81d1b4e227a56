// The only torch-aware C++ in flashattn: checks inputs, allocates outputs,
// fills the params struct, dispatches on the current stream, and registers the
// operators. It knows nothing of how attention is computed.
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

#include "flash.h"

namespace {

constexpr int64_t kAlignElems = 8;  // the kernels move 16-byte chunks of 16-bit elements

// Error messages are assembled from strings only. Streaming a number into the
// message (c10::str / operator<< of an int or an IntArrayRef, instantiated in
// this library) segfaulted on the H100 machine inside ostream::_M_insert<long>,
// reaching a foreign locale facet: the compiler that builds the extension and
// the libstdc++ that torch's process loads disagree. std::to_string and
// snprintf use no facet.
std::string str(int64_t value) { return std::to_string(value); }

std::string str_real(double value) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%g", value);
    return buf;
}

std::string str(c10::IntArrayRef values) {
    std::string out = "(";
    for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + std::to_string(values[i]);
    return out + (values.size() == 1 ? ",)" : ")");
}

// Refuses GPUs older than sm_80 (the kernels use Ampere instructions) and
// returns the shared memory a block may opt into. FLASHATTN_MAX_SMEM_PER_BLOCK
// (bytes) lowers that limit, so the tests can run the configs that GPUs with
// less shared memory (sm_86, sm_89) use.
int check_device(int device) {
    int major = 0, minor = 0, smem = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    TORCH_CHECK(major >= 8, "flashattn: needs a GPU of compute capability 8.0 (Ampere) or newer; cuda:", str(device),
                " is ", str(major), ".", str(minor));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    static const int smem_cap = [] {
        const char* env = std::getenv("FLASHATTN_MAX_SMEM_PER_BLOCK");
        return env ? std::atoi(env) : INT32_MAX;
    }();
    return std::min(smem, smem_cap);
}

// The kernels read rows of 16-byte chunks: every stride but the last a multiple
// of 8 elements, and a 16-byte aligned start.
bool strides_aligned(const at::Tensor& t) {
    for (int64_t d = 0; d + 1 < t.dim(); ++d) {
        if (t.size(d) > 1 && t.stride(d) % kAlignElems != 0) return false;
    }
    return true;
}

bool start_aligned(const at::Tensor& t) {
    return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 || t.numel() == 0;
}

// The two layouts: padded (batch, seqlen, heads, head_dim) or, with cu_seqlens,
// packed (total, heads, head_dim).
struct Layout {
    bool varlen;
    int64_t rank() const { return varlen ? 3 : 4; }
    const char* shape() const {
        return varlen ? "(total_tokens, heads, head_dim)" : "(batch, seqlen, heads, head_dim)";
    }
    int64_t batch_stride(const at::Tensor& t) const { return varlen ? 0 : t.stride(0); }
    int64_t rows(const at::Tensor& t) const { return varlen ? t.size(0) : t.size(1); }
};

// Device, dtype and rank: what every tensor argument must have.
void check_tensor(const at::Tensor& t, const char* name, const at::Tensor& q, const Layout& layout) {
    TORCH_CHECK(t.is_cuda(), "flashattn: ", name, " must be a CUDA tensor (got device ", t.device().str(), ")");
    TORCH_CHECK(t.device() == q.device(), "flashattn: ", name, " is on ", t.device().str(), " but q is on ",
                q.device().str(), "; all inputs must be on one device");
    TORCH_CHECK(t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16, "flashattn: ", name,
                " must be float16 or bfloat16 (got ", t.scalar_type(), ")");
    TORCH_CHECK(t.scalar_type() == q.scalar_type(), "flashattn: ", name, " has dtype ", t.scalar_type(),
                " but q has ", q.scalar_type(), "; q, k and v must share a dtype");
    TORCH_CHECK(t.dim() == layout.rank(), "flashattn: ", name, " must be ", str(layout.rank()), "-D ",
                layout.shape(), ", got ", str(t.dim()), "-D of shape ", str(t.sizes()));
}

// check_tensor, and a layout the kernels read in place.
void check_input(const at::Tensor& t, const char* name, const at::Tensor& q, const Layout& layout) {
    check_tensor(t, name, q, layout);
    TORCH_CHECK(t.stride(-1) == 1, "flashattn: the last dimension of ", name,
                " must be contiguous (stride 1, got ", str(t.stride(-1)), "); call .contiguous()");
    TORCH_CHECK(strides_aligned(t), "flashattn: ", name, " stride ", str(t.strides()), " must be a multiple of ",
                str(kAlignElems), " elements in every dimension but the last (flash_attn_func copies such inputs)");
}

// t itself when its first row is 16-byte aligned, else an aligned copy (the
// kernels read 16-byte chunks). Under torch.compile flash_attn_func cannot see
// addresses, only strides, so the start is checked here.
at::Tensor aligned(const at::Tensor& t) {
    return start_aligned(t) ? t : t.clone(at::MemoryFormat::Contiguous);
}

// cu_seqlens_q/k: both or neither; int32 [B + 1] on q's device, contiguous.
// Their values (0 first, nondecreasing, last = the row count, max_seqlen at
// least every length) are the caller's promise: reading them would wait for
// the GPU (flash_attn_varlen_func checks what it can without that).
Layout check_varlen(const at::Tensor& q, const std::optional<at::Tensor>& cu_seqlens_q,
                    const std::optional<at::Tensor>& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k) {
    TORCH_CHECK(cu_seqlens_q.has_value() == cu_seqlens_k.has_value(),
                "flashattn: cu_seqlens_q and cu_seqlens_k must be given together (variable-length batch) or not "
                "at all");
    if (!cu_seqlens_q.has_value()) return {false};
    for (const auto& [name, cu] : {std::pair<const char*, const at::Tensor&>{"cu_seqlens_q", *cu_seqlens_q},
                                   std::pair<const char*, const at::Tensor&>{"cu_seqlens_k", *cu_seqlens_k}}) {
        TORCH_CHECK(cu.device() == q.device(), "flashattn: ", name, " is on ", cu.device().str(),
                    " but q is on ", q.device().str());
        TORCH_CHECK(cu.scalar_type() == at::kInt, "flashattn: ", name, " must be int32, got ", cu.scalar_type());
        TORCH_CHECK(cu.dim() == 1 && cu.size(0) >= 1 && cu.is_contiguous(), "flashattn: ", name,
                    " must be a contiguous 1-D tensor of batch + 1 offsets, got shape ", str(cu.sizes()));
    }
    TORCH_CHECK(cu_seqlens_q->size(0) == cu_seqlens_k->size(0), "flashattn: cu_seqlens_q ",
                str(cu_seqlens_q->sizes()), " and cu_seqlens_k ", str(cu_seqlens_k->sizes()),
                " must have the same length (batch + 1)");
    TORCH_CHECK(max_seqlen_q >= 0 && max_seqlen_k >= 0 && max_seqlen_q <= INT32_MAX && max_seqlen_k <= INT32_MAX,
                "flashattn: max_seqlen_q (", str(max_seqlen_q), ") and max_seqlen_k (", str(max_seqlen_k),
                ") must be in [0, 2^31)");
    return {true};
}

// The checks q, k, v get in both passes; returns the device's shared-memory limit.
int check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double softmax_scale,
              const Layout& layout) {
    check_input(q, "q", q, layout);
    check_input(k, "k", q, layout);
    check_input(v, "v", q, layout);
    const int64_t num_heads = q.size(-2), head_dim = q.size(-1), num_heads_k = k.size(-2);
    if (!layout.varlen) {
        TORCH_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0), "flashattn: batch sizes differ: q ",
                    str(q.sizes()), ", k ", str(k.sizes()), ", v ", str(v.sizes()));
    }
    TORCH_CHECK(k.sizes() == v.sizes(), "flashattn: k ", str(k.sizes()), " and v ", str(v.sizes()),
                " must have the same shape");
    TORCH_CHECK(k.size(-1) == head_dim, "flashattn: head_dim of q (", str(head_dim), ") and k/v (",
                str(k.size(-1)), ") must match");
    TORCH_CHECK(head_dim <= flash::kMaxHeadDim, "flashattn: head_dim ", str(head_dim),
                " is not supported; the maximum is ", str(flash::kMaxHeadDim));
    TORCH_CHECK(head_dim % kAlignElems == 0, "flashattn: the kernel needs head_dim to be a multiple of ",
                str(kAlignElems), " (got ", str(head_dim), "); flash_attn_func pads it for you");
    TORCH_CHECK(num_heads_k > 0 && num_heads % num_heads_k == 0, "flashattn: the number of query heads (",
                str(num_heads), ") must be a multiple of the number of key/value heads (", str(num_heads_k),
                ")");
    TORCH_CHECK(std::isfinite(softmax_scale) && softmax_scale > 0, "flashattn: softmax_scale must be a ",
                "positive finite number (got ", str_real(softmax_scale), ")");
    TORCH_CHECK(num_heads <= 65535 && (layout.varlen || q.size(0) <= 65535), "flashattn: batch and heads (",
                str(num_heads), ") must each be at most 65535");
    TORCH_CHECK(layout.rows(q) <= INT32_MAX && layout.rows(k) <= INT32_MAX,
                "flashattn: sequence lengths must fit in int32");
    return check_device(q.get_device());
}

// window_size, softcap, ALiBi slopes, dropout: values and tensors.
void check_options(const at::Tensor& q, int64_t batch, int64_t window_left, int64_t window_right, double softcap,
                   const std::optional<at::Tensor>& alibi_slopes, double dropout_p,
                   const std::optional<at::Tensor>& rng_state) {
    TORCH_CHECK(window_left >= -1 && window_right >= -1 && window_left <= INT32_MAX && window_right <= INT32_MAX,
                "flashattn: window_left and window_right must be ints >= -1 (-1: unbounded), got (",
                str(window_left), ", ", str(window_right), ")");
    TORCH_CHECK(std::isfinite(softcap) && softcap >= 0, "flashattn: softcap must be a finite number >= 0, got ",
                str_real(softcap));
    if (alibi_slopes.has_value()) {
        const at::Tensor& slopes = *alibi_slopes;
        const int64_t num_heads = q.size(-2);
        TORCH_CHECK(slopes.device() == q.device() && slopes.scalar_type() == at::kFloat && slopes.is_contiguous() &&
                        ((slopes.dim() == 1 && slopes.size(0) == num_heads) ||
                         (slopes.dim() == 2 && slopes.size(0) == batch && slopes.size(1) == num_heads)),
                    "flashattn: alibi_slopes must be a contiguous float32 tensor of shape (", str(num_heads),
                    ",) or (", str(batch), ", ", str(num_heads), ") on q's device, got ", slopes.scalar_type(),
                    " of shape ", str(slopes.sizes()), " on ", slopes.device().str());
    }
    TORCH_CHECK(dropout_p >= 0 && dropout_p < 1, "flashattn: dropout_p must be in [0, 1), got ",
                str_real(dropout_p));
    if (dropout_p > 0) {
        TORCH_CHECK(rng_state.has_value(), "flashattn: dropout_p > 0 needs rng_state (int64 seed and offset)");
        TORCH_CHECK(rng_state->device() == q.device() && rng_state->scalar_type() == at::kLong &&
                        rng_state->numel() == 2 && rng_state->is_contiguous(),
                    "flashattn: rng_state must be a contiguous int64 tensor of 2 elements on q's device, got ",
                    rng_state->scalar_type(), " of shape ", str(rng_state->sizes()), " on ",
                    rng_state->device().str());
    }
}

// Fills the params both passes share. out and lse are written by the forward
// and read by the backward.
void set_params(flash::FwdParams& params, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const at::Tensor& out, const at::Tensor& lse, const Layout& layout, int64_t batch,
                const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_k,
                int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale, bool causal, int64_t window_left,
                int64_t window_right, double softcap, const std::optional<at::Tensor>& alibi_slopes,
                double dropout_p, const std::optional<at::Tensor>& rng_state, int max_smem_per_block) {
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
    params.heads_per_kv_head = params.num_heads / params.num_heads_k;

    params.cu_seqlens_q = layout.varlen ? cu_seqlens_q->data_ptr<int>() : nullptr;
    params.cu_seqlens_k = layout.varlen ? cu_seqlens_k->data_ptr<int>() : nullptr;
    params.total_q = static_cast<int>(layout.rows(q) * (layout.varlen ? 1 : batch));
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

    params.dtype = q.scalar_type() == at::kBFloat16 ? flash::DType::kBFloat16 : flash::DType::kFloat16;
    params.max_smem_per_block = max_smem_per_block;
}

void check_launch(cudaError_t err, const char* pass, const at::Tensor& q, const flash::FwdParams& params) {
    TORCH_CHECK(err == cudaSuccess, "flashattn: ", pass, " kernel (head_dim ",
                str(flash::fwd_kernel_head_dim(params.head_dim)), ", ", q.scalar_type(),
                params.is_local ? ", local" : "", params.has_extras ? ", extras" : "",
                ") failed to launch: ", cudaGetErrorString(err), " (the device allows ",
                str(params.max_smem_per_block), " bytes of shared memory per block)");
}

// `deterministic` is in the schema for the backward, which autograd runs with
// the forward's arguments; the forward is deterministic either way.
std::tuple<at::Tensor, at::Tensor> mha_fwd(const at::Tensor& q,  // [B, Sq, H, D] or [total_q, H, D]
                                           const at::Tensor& k,  // [B, Sk, Hk, D] or [total_k, Hk, D]
                                           const at::Tensor& v,  // like k
                                           double softmax_scale, bool causal, bool /*deterministic*/,
                                           int64_t window_left, int64_t window_right, double softcap,
                                           const std::optional<at::Tensor>& alibi_slopes, double dropout_p,
                                           const std::optional<at::Tensor>& rng_state,
                                           const std::optional<at::Tensor>& cu_seqlens_q,
                                           const std::optional<at::Tensor>& cu_seqlens_k, int64_t max_seqlen_q,
                                           int64_t max_seqlen_k) {
    const Layout layout = check_varlen(q, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
    const int max_smem_per_block = check_qkv(q, k, v, softmax_scale, layout);
    const int64_t batch = layout.varlen ? cu_seqlens_q->size(0) - 1 : q.size(0);
    check_options(q, batch, window_left, window_right, softcap, alibi_slopes, dropout_p, rng_state);
    const c10::cuda::CUDAGuard device_guard(q.device());
    const int64_t rows = layout.rows(q), num_heads = q.size(-2);
    at::Tensor out = at::empty(q.sizes(), q.options());
    at::Tensor lse = layout.varlen ? at::empty({num_heads, rows}, q.options().dtype(at::kFloat))
                                   : at::empty({batch, num_heads, rows}, q.options().dtype(at::kFloat));
    if (batch == 0 || rows == 0 || num_heads == 0) return {out, lse};

    const at::Tensor q_in = aligned(q), k_in = aligned(k), v_in = aligned(v);
    flash::FwdParams params{};
    set_params(params, q_in, k_in, v_in, out, lse, layout, batch, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
               max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, dropout_p,
               rng_state, max_smem_per_block);
    check_launch(flash::run_fwd(params, c10::cuda::getCurrentCUDAStream().stream()), "forward", q, params);
    return {out, lse};
}

// The gradients of the forward above. deterministic=true: bitwise reproducible
// (no atomics); false: dQ is summed with fp32 atomics where that is faster.
// dout may have any strides: it is whatever the consumer of out produced (the
// gradient of out.sum() is a broadcast of stride 0, a slice of a larger
// gradient starts anywhere), and it is copied when the kernels cannot read it
// in place.
std::tuple<at::Tensor, at::Tensor, at::Tensor> mha_bwd(
    const at::Tensor& dout,  // like q
    const at::Tensor& q,     // [B, Sq, H, D] or [total_q, H, D]
    const at::Tensor& k,     // [B, Sk, Hk, D] or [total_k, Hk, D]
    const at::Tensor& v,     // like k
    const at::Tensor& out,   // like q
    const at::Tensor& lse,   // [B, H, Sq] or [H, total_q], fp32
    double softmax_scale, bool causal, bool deterministic, int64_t window_left, int64_t window_right,
    double softcap, const std::optional<at::Tensor>& alibi_slopes, double dropout_p,
    const std::optional<at::Tensor>& rng_state, const std::optional<at::Tensor>& cu_seqlens_q,
    const std::optional<at::Tensor>& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k) {
    const Layout layout = check_varlen(q, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
    const int max_smem_per_block = check_qkv(q, k, v, softmax_scale, layout);
    const int64_t batch = layout.varlen ? cu_seqlens_q->size(0) - 1 : q.size(0);
    check_options(q, batch, window_left, window_right, softcap, alibi_slopes, dropout_p, rng_state);
    check_tensor(dout, "dout", q, layout);
    check_input(out, "out", q, layout);
    TORCH_CHECK(dout.sizes() == q.sizes() && out.sizes() == q.sizes(), "flashattn: dout ", str(dout.sizes()),
                " and out ", str(out.sizes()), " must have the shape of q ", str(q.sizes()));
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
    const c10::cuda::CUDAGuard device_guard(q.device());
    at::Tensor dq = at::empty(q.sizes(), q.options());
    at::Tensor dk = at::empty(k.sizes(), k.options());
    at::Tensor dv = at::empty(v.sizes(), v.options());
    if (layout.rows(k) == 0 || batch == 0 || num_heads == 0) {  // no key: every gradient is 0
        return {dq.zero_(), dk.zero_(), dv.zero_()};
    }
    if (rows == 0) return {dq, dk.zero_(), dv.zero_()};
    // A key no query sees gets no block's attention in a variable-length batch
    // whose sequences leave rows unassigned; zeroing first covers them.
    if (layout.varlen) {
        dk.zero_();
        dv.zero_();
    }
    at::Tensor dsum = at::empty(lse.sizes(), lse.options());
    at::Tensor dq_accum;
    if (!deterministic) dq_accum = at::zeros(q.sizes(), q.options().dtype(at::kFloat));

    const bool dout_readable = dout.stride(-1) == 1 && strides_aligned(dout) && start_aligned(dout);
    const at::Tensor dout_rows = dout_readable ? dout : dout.clone(at::MemoryFormat::Contiguous);

    const at::Tensor q_in = aligned(q), k_in = aligned(k), v_in = aligned(v), out_in = aligned(out);
    flash::BwdParams params{};
    set_params(params, q_in, k_in, v_in, out_in, lse, layout, batch, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
               max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, dropout_p,
               rng_state, max_smem_per_block);
    params.do_ptr = dout_rows.data_ptr();
    params.dq_ptr = dq.data_ptr();
    params.dk_ptr = dk.data_ptr();
    params.dv_ptr = dv.data_ptr();
    params.dsum_ptr = dsum.data_ptr<float>();
    params.dq_accum_ptr = deterministic ? nullptr : dq_accum.data_ptr<float>();
    params.dq_accum_batch_stride = deterministic || layout.varlen ? 0 : dq_accum.stride(0);
    params.deterministic = deterministic;
    params.do_batch_stride = layout.batch_stride(dout_rows), params.do_row_stride = dout_rows.stride(-3),
    params.do_head_stride = dout_rows.stride(-2);
    params.dq_batch_stride = layout.batch_stride(dq), params.dq_row_stride = dq.stride(-3),
    params.dq_head_stride = dq.stride(-2);
    params.dk_batch_stride = layout.batch_stride(dk), params.dk_row_stride = dk.stride(-3),
    params.dk_head_stride = dk.stride(-2);
    params.dv_batch_stride = layout.batch_stride(dv), params.dv_row_stride = dv.stride(-3),
    params.dv_head_stride = dv.stride(-2);
    check_launch(flash::run_bwd(params, c10::cuda::getCurrentCUDAStream().stream()), "backward", q, params);
    return {dq, dk, dv};
}

// An optional int32 [n] (or [n, cols]) tensor on q's device, contiguous.
void check_index_tensor(const std::optional<at::Tensor>& t, const char* name, const at::Tensor& q, int64_t rows,
                        bool matrix) {
    if (!t.has_value()) return;
    TORCH_CHECK(t->device() == q.device() && t->scalar_type() == at::kInt && t->is_contiguous() &&
                    t->dim() == (matrix ? 2 : 1) && t->size(0) == rows,
                "flashattn: ", name, " must be a contiguous int32 tensor of shape ",
                matrix ? "(batch, max_blocks_per_seq) = (" : "(batch,) = (", str(rows), matrix ? ", ...)" : ",)",
                " on q's device, got ", t->scalar_type(), " of shape ", str(t->sizes()), " on ", t->device().str());
}

// Zeroed counters for the decoding kernel's merge of its splits (FwdParams::
// split_counters): every call leaves them zero again, so one buffer per (device,
// stream) serves every call on that stream (calls on one stream never overlap;
// on two streams they may, and never share a buffer). A call being captured
// into a CUDA graph gets a buffer of its own, zeroed inside the graph: replays
// of different graphs may overlap.
at::Tensor split_counters(const at::Tensor& q, int64_t count, cudaStream_t stream) {
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

// flash_attn_with_kvcache: append k/v (rotary applied) into the cache in place,
// then attend from q (rotated) to each sequence's cached keys.
std::tuple<at::Tensor, at::Tensor> mha_fwd_kvcache(
    const at::Tensor& q,        // [B, Sq, H, D]
    const at::Tensor& k_cache,  // [B_cache, S_cache, Hk, D] or [num_blocks, page_size, Hk, D]
    const at::Tensor& v_cache,  // like k_cache
    const std::optional<at::Tensor>& k_new, const std::optional<at::Tensor>& v_new,  // [B, Snew, Hk, D]
    const std::optional<at::Tensor>& rotary_cos, const std::optional<at::Tensor>& rotary_sin,
    const at::Tensor& cache_seqlens, const std::optional<at::Tensor>& cache_batch_idx,
    const std::optional<at::Tensor>& cache_leftpad, const std::optional<at::Tensor>& block_table,
    double softmax_scale, bool causal, int64_t window_left, int64_t window_right, double softcap,
    bool rotary_interleaved, const std::optional<at::Tensor>& alibi_slopes, int64_t num_splits) {
    const Layout layout{false};
    check_input(q, "q", q, layout);
    check_input(k_cache, "k_cache", q, layout);
    check_input(v_cache, "v_cache", q, layout);
    TORCH_CHECK(start_aligned(k_cache) && start_aligned(v_cache),
                "flashattn: k_cache and v_cache must start at 16-byte aligned addresses (they are written in place)");
    TORCH_CHECK(k_cache.sizes() == v_cache.sizes(), "flashattn: k_cache ", str(k_cache.sizes()), " and v_cache ",
                str(v_cache.sizes()), " must have the same shape");
    const int64_t batch = q.size(0), seqlen_q = q.size(1), num_heads = q.size(2), head_dim = q.size(3);
    const int64_t num_heads_k = k_cache.size(2);
    TORCH_CHECK(k_cache.size(3) == head_dim, "flashattn: head_dim of q (", str(head_dim), ") and k_cache (",
                str(k_cache.size(3)), ") must match");
    TORCH_CHECK(head_dim <= flash::kMaxHeadDim && head_dim % kAlignElems == 0, "flashattn: head_dim ",
                str(head_dim), " is not supported by the KV-cache kernels: a multiple of 8 up to 256");
    TORCH_CHECK(num_heads_k > 0 && num_heads % num_heads_k == 0, "flashattn: the number of query heads (",
                str(num_heads), ") must be a multiple of the number of key/value heads in k_cache (",
                str(num_heads_k), ")");
    TORCH_CHECK(std::isfinite(softmax_scale) && softmax_scale > 0, "flashattn: softmax_scale must be a ",
                "positive finite number (got ", str_real(softmax_scale), ")");
    check_index_tensor(cache_seqlens, "cache_seqlens", q, batch, false);
    check_index_tensor(cache_batch_idx, "cache_batch_idx", q, batch, false);
    check_index_tensor(cache_leftpad, "cache_leftpad", q, batch, false);
    check_index_tensor(block_table, "block_table", q, batch, true);
    const bool paged = block_table.has_value();
    TORCH_CHECK(!(paged && cache_batch_idx.has_value()),
                "flashattn: cache_batch_idx cannot be combined with block_table (a paged cache)");
    const int64_t page_size = paged ? k_cache.size(1) : 0;
    if (!paged) {
        TORCH_CHECK(cache_batch_idx.has_value() || k_cache.size(0) >= batch, "flashattn: k_cache holds ",
                    str(k_cache.size(0)), " sequences but q has a batch of ", str(batch));
    }
    const int64_t cache_capacity = paged ? block_table->size(1) * page_size : k_cache.size(1);
    TORCH_CHECK(k_new.has_value() == v_new.has_value(), "flashattn: k and v must be given together");
    int64_t seqlen_knew = 0;
    if (k_new.has_value()) {
        check_input(*k_new, "k", q, layout);
        check_input(*v_new, "v", q, layout);
        TORCH_CHECK(k_new->size(0) == batch && k_new->size(2) == num_heads_k && k_new->size(3) == head_dim &&
                        v_new->sizes() == k_new->sizes(),
                    "flashattn: k ", str(k_new->sizes()), " and v ", str(v_new->sizes()), " must have shape (",
                    str(batch), ", seqlen_new, ", str(num_heads_k), ", ", str(head_dim), ")");
        seqlen_knew = k_new->size(1);
    }
    TORCH_CHECK(rotary_cos.has_value() == rotary_sin.has_value(), "flashattn: rotary_cos and rotary_sin must be "
                "given together");
    at::Tensor cos, sin;
    int64_t rotary_dim = 0;
    if (rotary_cos.has_value()) {
        TORCH_CHECK(rotary_cos->device() == q.device() && rotary_sin->device() == q.device() &&
                        rotary_cos->dim() == 2 && rotary_cos->sizes() == rotary_sin->sizes(),
                    "flashattn: rotary_cos and rotary_sin must be 2-D (seqlen_ro, rotary_dim / 2) tensors of "
                    "one shape on q's device, got ", str(rotary_cos->sizes()), " and ", str(rotary_sin->sizes()));
        rotary_dim = 2 * rotary_cos->size(1);
        TORCH_CHECK(rotary_dim <= head_dim, "flashattn: rotary_dim (2 * rotary_cos.size(1) = ", str(rotary_dim),
                    ") must be at most head_dim (", str(head_dim), ")");
        cos = rotary_cos->to(at::kFloat).contiguous();
        sin = rotary_sin->to(at::kFloat).contiguous();
    }
    check_options(q, batch, window_left, window_right, softcap, alibi_slopes, 0.0, std::nullopt);
    const int max_smem_per_block = check_device(q.get_device());
    const c10::cuda::CUDAGuard device_guard(q.device());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();

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
        ap.leftpad_k = cache_leftpad.has_value() ? cache_leftpad->data_ptr<int>() : nullptr;
        ap.kv_batch_idx = cache_batch_idx.has_value() ? cache_batch_idx->data_ptr<int>() : nullptr;
        ap.block_table = paged ? block_table->data_ptr<int>() : nullptr;
        ap.block_table_batch_stride = paged ? block_table->stride(0) : 0;
        ap.page_size = static_cast<int>(page_size);
        ap.capacity = static_cast<int>(cache_capacity), ap.num_cache_rows = static_cast<int>(k_cache.size(0));
        ap.rotary_cos = rotary_dim > 0 ? cos.data_ptr<float>() : nullptr;
        ap.rotary_sin = rotary_dim > 0 ? sin.data_ptr<float>() : nullptr;
        ap.rotary_rows = rotary_dim > 0 ? static_cast<int>(cos.size(0)) : 0;
        ap.rotary_dim = static_cast<int>(rotary_dim);
        ap.rotary_interleaved = rotary_interleaved;
        ap.q_positions_per_row = causal || window_left >= 0 || window_right >= 0;
        ap.batch = static_cast<int>(batch), ap.seqlen_q = static_cast<int>(seqlen_q);
        ap.seqlen_knew = static_cast<int>(seqlen_knew);
        ap.num_heads = static_cast<int>(num_heads), ap.num_heads_k = static_cast<int>(num_heads_k);
        ap.head_dim = static_cast<int>(head_dim);
        ap.dtype = q.scalar_type() == at::kBFloat16 ? flash::DType::kBFloat16 : flash::DType::kFloat16;
        if (seqlen_knew > 0 || rotary_dim > 0) {
            const cudaError_t err = flash::run_kvcache_append(ap, stream);
            TORCH_CHECK(err == cudaSuccess, "flashattn: the KV-cache append kernel failed to launch: ",
                        cudaGetErrorString(err));
        }
    }

    at::Tensor out = at::empty(q.sizes(), q.options());
    at::Tensor lse = at::empty({batch, num_heads, seqlen_q}, q.options().dtype(at::kFloat));
    if (batch == 0 || seqlen_q == 0) return {out, lse};

    flash::FwdParams params{};
    set_params(params, q_attn, k_cache, v_cache, out, lse, layout, batch, std::nullopt, std::nullopt, 0, 0,
               softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, 0.0, std::nullopt,
               max_smem_per_block);
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
    // Decoding with GQA: the group's query heads are the rows of one block (q and
    // out seen as [B, G, Hk, D], lse's (h, i) as (hk, g)).
    const int64_t group = num_heads / num_heads_k;
    params.pack_gqa = seqlen_q == 1 && group > 1 && !alibi_slopes.has_value();
    if (params.pack_gqa) {
        params.seqlen_q = static_cast<int>(group);
        params.num_heads = static_cast<int>(num_heads_k);
        params.heads_per_kv_head = 1;
        params.q_row_stride = q_attn.stride(2), params.q_head_stride = group * q_attn.stride(2);
        params.o_row_stride = out.stride(2), params.o_head_stride = group * out.stride(2);
        params.lse_head_stride = group;
        params.total_q = static_cast<int>(batch * group);
    }
    const flash::KvcachePlan plan =
        flash::kvcache_plan(params, static_cast<int>(cache_capacity), static_cast<int>(std::min<int64_t>(
                                                                          std::max<int64_t>(num_splits, 0), flash::kMaxKvSplits)));
    params.num_splits = plan.num_splits;
    params.decode_wide = plan.decode_wide;
    at::Tensor o_accum, lse_accum, counters;
    flash::CombineParams combine{};
    if (params.num_splits > 1) {
        o_accum = at::empty({params.num_splits, batch, num_heads, seqlen_q, head_dim}, q.options().dtype(at::kFloat));
        lse_accum = at::empty({params.num_splits, batch, num_heads, seqlen_q}, q.options().dtype(at::kFloat));
        params.o_accum_ptr = o_accum.data_ptr<float>();
        params.lse_accum_ptr = lse_accum.data_ptr<float>();
        if (params.seqlen_q <= flash::kDecodeRows) {
            counters = split_counters(q, static_cast<int64_t>(batch) * params.num_heads, stream);
            params.split_counters = reinterpret_cast<unsigned int*>(counters.data_ptr<int>());
        }
        combine = {o_accum.data_ptr<float>(), lse_accum.data_ptr<float>(), out.data_ptr(), lse.data_ptr<float>(),
                   out.stride(0), out.stride(1), out.stride(2), static_cast<int>(batch), static_cast<int>(seqlen_q),
                   static_cast<int>(num_heads), static_cast<int>(head_dim), params.num_splits};
    }
    check_launch(flash::run_fwd_kvcache(params, combine, stream), "KV-cache forward", q, params);
    return {out, lse};
}

}  // namespace

// The schema is mirrored in flashattn/ops.py (used when the extension is not
// built); tests/test_ops.py checks that the two agree.
TORCH_LIBRARY(flashattn, m) {
    m.def(
        "fwd(Tensor q, Tensor k, Tensor v, float softmax_scale, bool causal, bool deterministic=False, "
        "int window_left=-1, int window_right=-1, float softcap=0.0, Tensor? alibi_slopes=None, "
        "float dropout_p=0.0, Tensor? rng_state=None, Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, "
        "int max_seqlen_q=0, int max_seqlen_k=0) -> (Tensor out, Tensor softmax_lse)");
    m.def(
        "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, float softmax_scale, "
        "bool causal, bool deterministic, int window_left=-1, int window_right=-1, float softcap=0.0, "
        "Tensor? alibi_slopes=None, float dropout_p=0.0, Tensor? rng_state=None, Tensor? cu_seqlens_q=None, "
        "Tensor? cu_seqlens_k=None, int max_seqlen_q=0, int max_seqlen_k=0) -> (Tensor dq, Tensor dk, Tensor dv)");
    m.def(
        "fwd_kvcache(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k, Tensor? v, Tensor? rotary_cos, "
        "Tensor? rotary_sin, Tensor cache_seqlens, Tensor? cache_batch_idx, Tensor? cache_leftpad, "
        "Tensor? block_table, float softmax_scale, bool causal, int window_left, int window_right, float softcap, "
        "bool rotary_interleaved, Tensor? alibi_slopes, int num_splits) -> (Tensor out, Tensor softmax_lse)");
}

TORCH_LIBRARY_IMPL(flashattn, CUDA, m) {
    m.impl("fwd", &mha_fwd);
    m.impl("bwd", &mha_bwd);
    m.impl("fwd_kvcache", &mha_fwd_kvcache);
}

// `import flashattn._C` loads this library, which registers the operators
// above; the module itself is empty.
PyMODINIT_FUNC PyInit__C(void) {
    static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
    return PyModule_Create(&module);
}
