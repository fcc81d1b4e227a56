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
#include <string>

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
    for (int d = 0; d < 3; ++d) {
        if (t.size(d) > 1 && t.stride(d) % kAlignElems != 0) return false;
    }
    return true;
}

bool start_aligned(const at::Tensor& t) {
    return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 || t.numel() == 0;
}

// Device, dtype and rank: what every tensor argument must have.
void check_tensor(const at::Tensor& t, const char* name, const at::Tensor& q) {
    TORCH_CHECK(t.is_cuda(), "flashattn: ", name, " must be a CUDA tensor (got device ", t.device().str(), ")");
    TORCH_CHECK(t.device() == q.device(), "flashattn: ", name, " is on ", t.device().str(), " but q is on ",
                q.device().str(), "; all inputs must be on one device");
    TORCH_CHECK(t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16, "flashattn: ", name,
                " must be float16 or bfloat16 (got ", t.scalar_type(), ")");
    TORCH_CHECK(t.scalar_type() == q.scalar_type(), "flashattn: ", name, " has dtype ", t.scalar_type(),
                " but q has ", q.scalar_type(), "; q, k and v must share a dtype");
    TORCH_CHECK(t.dim() == 4, "flashattn: ", name, " must be 4-D (batch, seqlen, heads, head_dim), got ",
                str(t.dim()), "-D of shape ", str(t.sizes()));
}

// check_tensor, and a layout the kernels read in place.
void check_input(const at::Tensor& t, const char* name, const at::Tensor& q) {
    check_tensor(t, name, q);
    TORCH_CHECK(t.stride(-1) == 1, "flashattn: the last dimension of ", name,
                " must be contiguous (stride 1, got ", str(t.stride(-1)), "); call .contiguous()");
    TORCH_CHECK(strides_aligned(t), "flashattn: ", name, " stride ", str(t.strides()), " must be a multiple of ",
                str(kAlignElems), " elements in every dimension but the last (flash_attn_func copies such inputs)");
    TORCH_CHECK(start_aligned(t), "flashattn: ", name,
                " must start at a 16-byte aligned address (flash_attn_func copies such inputs)");
}

// The checks q, k, v get in both passes; returns the device's shared-memory limit.
int check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double softmax_scale) {
    check_input(q, "q", q);
    check_input(k, "k", q);
    check_input(v, "v", q);
    const int64_t batch = q.size(0), num_heads = q.size(2), head_dim = q.size(3), num_heads_k = k.size(2);
    TORCH_CHECK(k.size(0) == batch && v.size(0) == batch, "flashattn: batch sizes differ: q ", str(q.sizes()),
                ", k ", str(k.sizes()), ", v ", str(v.sizes()));
    TORCH_CHECK(k.sizes() == v.sizes(), "flashattn: k ", str(k.sizes()), " and v ", str(v.sizes()),
                " must have the same shape");
    TORCH_CHECK(k.size(3) == head_dim, "flashattn: head_dim of q (", str(head_dim), ") and k/v (",
                str(k.size(3)), ") must match");
    TORCH_CHECK(head_dim <= flash::kMaxHeadDim, "flashattn: head_dim ", str(head_dim),
                " is not supported; the maximum is ", str(flash::kMaxHeadDim));
    TORCH_CHECK(head_dim % kAlignElems == 0, "flashattn: the kernel needs head_dim to be a multiple of ",
                str(kAlignElems), " (got ", str(head_dim), "); flash_attn_func pads it for you");
    TORCH_CHECK(num_heads_k > 0 && num_heads % num_heads_k == 0, "flashattn: the number of query heads (",
                str(num_heads), ") must be a multiple of the number of key/value heads (", str(num_heads_k),
                ")");
    TORCH_CHECK(std::isfinite(softmax_scale) && softmax_scale > 0, "flashattn: softmax_scale must be a ",
                "positive finite number (got ", str_real(softmax_scale), ")");
    TORCH_CHECK(batch <= 65535 && num_heads <= 65535, "flashattn: batch (", str(batch), ") and heads (",
                str(num_heads), ") must each be at most 65535");
    TORCH_CHECK(q.size(1) <= INT32_MAX && k.size(1) <= INT32_MAX, "flashattn: sequence lengths must fit in int32");
    return check_device(q.get_device());
}

// Fills the params both passes share. out and lse are written by the forward
// and read by the backward.
void set_params(flash::FwdParams& params, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const at::Tensor& out, const at::Tensor& lse, double softmax_scale, bool causal,
                int max_smem_per_block) {
    params.q_ptr = q.data_ptr();
    params.k_ptr = k.data_ptr();
    params.v_ptr = v.data_ptr();
    params.o_ptr = out.data_ptr();
    params.lse_ptr = lse.data_ptr<float>();
    params.q_batch_stride = q.stride(0), params.q_row_stride = q.stride(1), params.q_head_stride = q.stride(2);
    params.k_batch_stride = k.stride(0), params.k_row_stride = k.stride(1), params.k_head_stride = k.stride(2);
    params.v_batch_stride = v.stride(0), params.v_row_stride = v.stride(1), params.v_head_stride = v.stride(2);
    params.o_batch_stride = out.stride(0), params.o_row_stride = out.stride(1),
    params.o_head_stride = out.stride(2);
    params.batch = static_cast<int>(q.size(0));
    params.seqlen_q = static_cast<int>(q.size(1));
    params.seqlen_k = static_cast<int>(k.size(1));
    params.num_heads = static_cast<int>(q.size(2));
    params.num_heads_k = static_cast<int>(k.size(2));
    params.head_dim = static_cast<int>(q.size(3));
    params.heads_per_kv_head = params.num_heads / params.num_heads_k;
    constexpr double kLog2e = 1.4426950408889634;  // exp(x) = exp2(x * log2(e))
    params.softmax_scale = static_cast<float>(softmax_scale);
    params.softmax_scale_log2 = static_cast<float>(softmax_scale * kLog2e);
    params.dtype = q.scalar_type() == at::kBFloat16 ? flash::DType::kBFloat16 : flash::DType::kFloat16;
    params.is_causal = causal;
    params.max_smem_per_block = max_smem_per_block;
}

void check_launch(cudaError_t err, const char* pass, const at::Tensor& q, bool causal, int max_smem_per_block) {
    TORCH_CHECK(err == cudaSuccess, "flashattn: ", pass, " kernel (head_dim ",
                str(flash::fwd_kernel_head_dim(static_cast<int>(q.size(3)))), ", ", q.scalar_type(),
                causal ? ", causal" : "", ") failed to launch: ", cudaGetErrorString(err), " (the device allows ",
                str(max_smem_per_block), " bytes of shared memory per block)");
}

// `deterministic` is in the schema for the backward, which autograd runs with
// the forward's arguments; the forward is deterministic either way.
std::tuple<at::Tensor, at::Tensor> mha_fwd(const at::Tensor& q,  // [B, Sq, H, D]
                                           const at::Tensor& k,  // [B, Sk, Hk, D]
                                           const at::Tensor& v,  // [B, Sk, Hk, D]
                                           double softmax_scale, bool causal, bool /*deterministic*/) {
    const int max_smem_per_block = check_qkv(q, k, v, softmax_scale);
    const c10::cuda::CUDAGuard device_guard(q.device());
    const int64_t batch = q.size(0), seqlen_q = q.size(1), num_heads = q.size(2), head_dim = q.size(3);
    at::Tensor out = at::empty({batch, seqlen_q, num_heads, head_dim}, q.options());
    at::Tensor lse = at::empty({batch, num_heads, seqlen_q}, q.options().dtype(at::kFloat));
    if (batch == 0 || seqlen_q == 0 || num_heads == 0) return {out, lse};

    flash::FwdParams params{};
    set_params(params, q, k, v, out, lse, softmax_scale, causal, max_smem_per_block);
    check_launch(flash::run_fwd(params, c10::cuda::getCurrentCUDAStream().stream()), "forward", q, causal,
                 max_smem_per_block);
    return {out, lse};
}

// The gradients of the forward above. deterministic=true: bitwise reproducible
// (no atomics); false: dQ is summed with fp32 atomics where that is faster.
// dout may have any strides: it is whatever the consumer of out produced (the
// gradient of out.sum() is a broadcast of stride 0, a slice of a larger
// gradient starts anywhere), and it is copied when the kernels cannot read it
// in place.
std::tuple<at::Tensor, at::Tensor, at::Tensor> mha_bwd(const at::Tensor& dout,  // [B, Sq, H, D]
                                                       const at::Tensor& q,     // [B, Sq, H, D]
                                                       const at::Tensor& k,     // [B, Sk, Hk, D]
                                                       const at::Tensor& v,     // [B, Sk, Hk, D]
                                                       const at::Tensor& out,   // [B, Sq, H, D]
                                                       const at::Tensor& lse,   // [B, H, Sq], fp32
                                                       double softmax_scale, bool causal, bool deterministic) {
    const int max_smem_per_block = check_qkv(q, k, v, softmax_scale);
    check_tensor(dout, "dout", q);
    check_input(out, "out", q);
    TORCH_CHECK(dout.sizes() == q.sizes() && out.sizes() == q.sizes(), "flashattn: dout ", str(dout.sizes()),
                " and out ", str(out.sizes()), " must have the shape of q ", str(q.sizes()));
    const int64_t batch = q.size(0), seqlen_q = q.size(1), num_heads = q.size(2);
    TORCH_CHECK(lse.is_cuda() && lse.device() == q.device() && lse.scalar_type() == at::kFloat &&
                    lse.is_contiguous() && lse.dim() == 3 && lse.size(0) == batch && lse.size(1) == num_heads &&
                    lse.size(2) == seqlen_q,
                "flashattn: softmax_lse must be the forward's contiguous float32 tensor of shape (", str(batch),
                ", ", str(num_heads), ", ", str(seqlen_q), ") on q's device, got ", str(lse.sizes()), " ",
                lse.scalar_type(), " on ", lse.device().str());
    const c10::cuda::CUDAGuard device_guard(q.device());
    at::Tensor dq = at::empty(q.sizes(), q.options());
    at::Tensor dk = at::empty(k.sizes(), k.options());
    at::Tensor dv = at::empty(v.sizes(), v.options());
    if (k.size(1) == 0 || batch == 0 || num_heads == 0) {  // no key: every gradient is 0
        return {dq.zero_(), dk.zero_(), dv.zero_()};
    }
    if (seqlen_q == 0) return {dq, dk.zero_(), dv.zero_()};
    at::Tensor dsum = at::empty({batch, num_heads, seqlen_q}, q.options().dtype(at::kFloat));
    at::Tensor dq_accum;
    if (!deterministic) dq_accum = at::zeros({batch, seqlen_q, num_heads, q.size(3)}, q.options().dtype(at::kFloat));

    const bool dout_readable = dout.stride(-1) == 1 && strides_aligned(dout) && start_aligned(dout);
    const at::Tensor dout_rows = dout_readable ? dout : dout.clone(at::MemoryFormat::Contiguous);

    flash::BwdParams params{};
    set_params(params, q, k, v, out, lse, softmax_scale, causal, max_smem_per_block);
    params.do_ptr = dout_rows.data_ptr();
    params.dq_ptr = dq.data_ptr();
    params.dk_ptr = dk.data_ptr();
    params.dv_ptr = dv.data_ptr();
    params.dsum_ptr = dsum.data_ptr<float>();
    params.dq_accum_ptr = deterministic ? nullptr : dq_accum.data_ptr<float>();
    params.deterministic = deterministic;
    params.do_batch_stride = dout_rows.stride(0), params.do_row_stride = dout_rows.stride(1),
    params.do_head_stride = dout_rows.stride(2);
    params.dq_batch_stride = dq.stride(0), params.dq_row_stride = dq.stride(1), params.dq_head_stride = dq.stride(2);
    params.dk_batch_stride = dk.stride(0), params.dk_row_stride = dk.stride(1), params.dk_head_stride = dk.stride(2);
    params.dv_batch_stride = dv.stride(0), params.dv_row_stride = dv.stride(1), params.dv_head_stride = dv.stride(2);
    check_launch(flash::run_bwd(params, c10::cuda::getCurrentCUDAStream().stream()), "backward", q, causal,
                 max_smem_per_block);
    return {dq, dk, dv};
}

}  // namespace

// The schema is mirrored in flashattn/ops.py (used when the extension is not
// built); tests/test_ops.py checks that the two agree.
TORCH_LIBRARY(flashattn, m) {
    m.def(
        "fwd(Tensor q, Tensor k, Tensor v, float softmax_scale, bool causal, bool deterministic=False) "
        "-> (Tensor out, Tensor softmax_lse)");
    m.def(
        "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, float softmax_scale, "
        "bool causal, bool deterministic) -> (Tensor dq, Tensor dk, Tensor dv)");
}

TORCH_LIBRARY_IMPL(flashattn, CUDA, m) {
    m.impl("fwd", &mha_fwd);
    m.impl("bwd", &mha_bwd);
}

// `import flashattn._C` loads this library, which registers the operators
// above; the module itself is empty.
PyMODINIT_FUNC PyInit__C(void) {
    static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
    return PyModule_Create(&module);
}
