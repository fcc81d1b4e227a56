// The binding's checks of the tensors an operator receives (device, dtype,
// rank, shapes, strides, index tensors), each with a message that names the
// argument, and the range checks of the option values that the binding
// converts for the kernels. Included by flash_api.cpp only; which layer checks
// what is tabled in README.md ("Where each argument is checked").
//
// flashattn/cpu.py makes the same checks of CPU tensors with the same messages
// and exception types (TORCH_CHECK_TYPE: TypeError, TORCH_CHECK_VALUE:
// ValueError, TORCH_CHECK: RuntimeError), so a test of one holds for both; the
// public Python functions check only their Python arguments. A message that
// changes here changes there too.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/flash.h"

namespace flashattn_api {

constexpr int64_t kAlignElems = 8;  // the kernels move 16-byte chunks of 16-bit elements

// Error messages are assembled from strings only. Streaming a number into the
// message (c10::str / operator<< of an int or an IntArrayRef, instantiated in
// this library) segfaulted on the H100 machine inside ostream::_M_insert<long>,
// reaching a foreign locale facet: the compiler that builds the extension and
// the libstdc++ that torch's process loads disagree. std::to_string and
// snprintf use no facet. Values print as Python prints them, as flashattn/cpu.py's
// messages do.
std::string str(int64_t value) { return std::to_string(value); }

// A double as Python's repr writes it: the shortest digits that read back the
// same, with ".0" on a whole number (1.0, -0.1, nan, inf).
std::string str_real(double value) {
    char buf[32];
    for (int digits = 1; digits <= 17; ++digits) {
        std::snprintf(buf, sizeof(buf), "%.*g", digits, value);
        if (std::strtod(buf, nullptr) == value) break;
    }
    std::string out = buf;
    if (out.find_first_of(".eni") == std::string::npos) out += ".0";
    return out;
}

std::string str(c10::IntArrayRef values) {
    std::string out = "(";
    for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + std::to_string(values[i]);
    return out + (values.size() == 1 ? ",)" : ")");
}

std::string str(at::ScalarType dtype) { return "torch." + std::string(c10::getDtypeNames(dtype).first); }

// The kernels read rows of 16-byte chunks: every stride but the last a multiple
// of 8 elements, and a 16-byte aligned start.
// (FP8: 16 elements.)
bool strides_aligned(const at::Tensor& t) {
    const int64_t align = 16 / t.element_size();
    for (int64_t d = 0; d + 1 < t.dim(); ++d) {
        if (t.size(d) > 1 && t.stride(d) % align != 0) return false;
    }
    return true;
}

// Whether t repeats elements along a dimension (stride 0 over more than one
// index: a broadcast, such as the gradient of out.sum()).
bool broadcasts(const at::Tensor& t) {
    for (int64_t d = 0; d < t.dim(); ++d) {
        if (t.size(d) > 1 && t.stride(d) == 0) return true;
    }
    return false;
}

// Whether the kernels can read t's rows in place: aligned strides and a 16-byte
// aligned start (flash_api.cpp's aligned() copies q, k, v and out otherwise).
bool readable_in_place(const at::Tensor& t) {
    return t.numel() == 0 || (strides_aligned(t) && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0);
}

// The layouts: padded (batch, seqlen, heads, head_dim) or, with cu_seqlens,
// packed (total, heads, head_dim); a packed batch with a block table (paged)
// has k and v as pages (num_blocks, page_block_size, heads_k, head_dim).
struct Layout {
    bool varlen;
    bool paged = false;
    static bool is_kv(const std::string& name) { return name == "k" || name == "v"; }
    int64_t rank(const std::string& name = "q") const { return varlen && !(paged && is_kv(name)) ? 3 : 4; }
    // The shape the tensor called `name` must have, in the words of the Python API.
    std::string shape(const std::string& name) const {
        if (name == "k_cache" || name == "v_cache") return "(batch_cache, seqlen_cache, nheads_k, headdim)";
        if (name == "q" || name == "out" || name == "dout") {
            return varlen ? "(total_q, nheads, headdim)" : "(batch, seqlen_q, nheads, headdim)";
        }
        if (paged) return "(num_blocks, page_block_size, nheads_k, headdim)";
        return varlen ? "(total_k, nheads_k, headdim)" : "(batch, seqlen_k, nheads_k, headdim)";
    }
    // Pages step by their stride like a padded batch's sequences.
    int64_t batch_stride(const at::Tensor& t) const { return t.dim() == 4 ? t.stride(0) : 0; }
    // Rows of one sequence (padded), of the whole batch (packed), or of every page.
    int64_t rows(const at::Tensor& t) const { return t.dim() == 4 ? (varlen ? t.size(0) * t.size(1) : t.size(1)) : t.size(0); }
};

void check_same_device(const at::Tensor& t, const char* name, const at::Tensor& q) {
    TORCH_CHECK(t.device() == q.device(), "flashattn: ", name, " is on ", t.device().str(), " but q is on ",
                q.device().str(), "; they must be on one device");
}

// Rank, device and dtype: what every data tensor must have (q: a dtype of the
// kernels, float8_e4m3fn for the FP8 operator (fp8); the others: q's).
// own_dtype: the dtype t must have where it is not q's (an FP8 KV cache's tensors).
void check_tensor(const at::Tensor& t, const char* name, const at::Tensor& q, const Layout& layout,
                  bool fp8 = false, std::optional<at::ScalarType> own_dtype = std::nullopt) {
    TORCH_CHECK_VALUE(t.dim() == layout.rank(name), "flashattn: ", name, " must be ", str(layout.rank(name)), "-D ",
                      layout.shape(name), ", got shape ", str(t.sizes()));
    check_same_device(t, name, q);
    TORCH_CHECK(t.is_cuda(), "flashattn: ", name, " must be a CUDA tensor (got device ", t.device().str(), ")");
    if (t.is_same(q) && fp8) {
        TORCH_CHECK_TYPE(q.scalar_type() == at::kFloat8_e4m3fn, "flashattn: q has dtype ", str(q.scalar_type()),
                         "; the FP8 operator takes torch.float8_e4m3fn");
    } else if (t.is_same(q)) {
        TORCH_CHECK_TYPE(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16, "flashattn: q has dtype ",
                         str(q.scalar_type()), "; accepted on cuda: torch.float16, torch.bfloat16");
    } else if (own_dtype.has_value()) {
        TORCH_CHECK_TYPE(t.scalar_type() == *own_dtype, "flashattn: ", name, " has dtype ", str(t.scalar_type()),
                         "; ", name, " must be a ", str(*own_dtype), " tensor");
    } else {
        TORCH_CHECK_TYPE(t.scalar_type() == q.scalar_type(), "flashattn: ", name, " has dtype ", str(t.scalar_type()),
                         " but q has ", str(q.scalar_type()), "; ", name, " must be a ", str(q.scalar_type()),
                         " tensor");
    }
}

void check_last_dim_contiguous(const at::Tensor& t, const char* name) {
    TORCH_CHECK_VALUE(t.stride(-1) == 1, "flashattn: the last dimension of ", name,
                      " must be contiguous (stride 1), got strides ", str(t.strides()),
                      "; call .contiguous() on it first");
}

// check_tensor, and rows the kernels read in place (tensors the binding does
// not copy: the KV cache, which is written in place, and what it is read with).
void check_input(const at::Tensor& t, const char* name, const at::Tensor& q, const Layout& layout,
                 std::optional<at::ScalarType> own_dtype = std::nullopt) {
    check_tensor(t, name, q, layout, /*fp8=*/false, own_dtype);
    check_last_dim_contiguous(t, name);
    TORCH_CHECK_VALUE(strides_aligned(t), "flashattn: ", name, " stride ", str(t.strides()),
                      " must be a multiple of ", str(static_cast<int64_t>(16 / t.element_size())),
                      " elements in every dimension but the last");
}

// cu_seqlens_q/k: both or neither; int32 [B + 1] on q's device, contiguous.
// Their values (0 first, nondecreasing, last = the row count, max_seqlen at
// least every length) are the caller's promise: reading them would wait for
// the GPU (flashattn/cpu.py reads those of CPU tensors). max_seqlen_q/k are in
// the range of the kernels' int.
Layout check_varlen(const at::Tensor& q, const std::optional<at::Tensor>& cu_seqlens_q,
                    const std::optional<at::Tensor>& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k) {
    TORCH_CHECK(cu_seqlens_q.has_value() == cu_seqlens_k.has_value(),
                "flashattn: cu_seqlens_q and cu_seqlens_k must be given together (variable-length batch) or not "
                "at all");
    if (!cu_seqlens_q.has_value()) return {false};
    constexpr const char* kAccepted = "an int32 tensor of shape (batch + 1,): the offsets of the sequences";
    for (const auto& [name, cu] : {std::pair<const char*, const at::Tensor&>{"cu_seqlens_q", *cu_seqlens_q},
                                   std::pair<const char*, const at::Tensor&>{"cu_seqlens_k", *cu_seqlens_k}}) {
        TORCH_CHECK_TYPE(cu.scalar_type() == at::kInt, "flashattn: ", name, " must be ", kAccepted, ", got dtype ",
                         str(cu.scalar_type()));
        TORCH_CHECK_VALUE(cu.dim() == 1 && cu.size(0) >= 1, "flashattn: ", name, " must be ", kAccepted,
                          ", got shape ", str(cu.sizes()));
        check_same_device(cu, name, q);
        TORCH_CHECK_VALUE(cu.is_contiguous(), "flashattn: ", name, " must be contiguous");
    }
    TORCH_CHECK_VALUE(cu_seqlens_q->size(0) == cu_seqlens_k->size(0), "flashattn: cu_seqlens_q ",
                      str(cu_seqlens_q->sizes()), " and cu_seqlens_k ", str(cu_seqlens_k->sizes()),
                      " must have the same length (batch + 1)");
    TORCH_CHECK_VALUE(
        max_seqlen_q >= 0 && max_seqlen_k >= 0 && max_seqlen_q <= INT32_MAX && max_seqlen_k <= INT32_MAX,
        "flashattn: max_seqlen_q (", str(max_seqlen_q), ") and max_seqlen_k (", str(max_seqlen_k),
        ") must be in [0, 2^31)");
    return {true};
}

// v's head dim dv: 1 to q's and k's (DeepSeek MLA's 192 / 128), not more
// (flashattn/cpu.py: check_v_head_dim, the same words). names: how q, k and v
// are called in the message (the KV cache's too).
void check_v_head_dim(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const std::array<const char*, 3>& names) {
    const int64_t head_dim = q.size(-1), v_head_dim = v.size(-1);
    TORCH_CHECK_VALUE(v_head_dim >= 1 && v_head_dim <= head_dim, "flashattn: ", names[2], " has headdim ",
                      str(v_head_dim), " (", names[0], " ", str(q.sizes()), ", ", names[1], " ", str(k.sizes()), ", ",
                      names[2], " ", str(v.sizes()), "); accepted: 1 to ", str(head_dim), ", the headdim of ",
                      names[0], " and ", names[1], " (", names[2], "'s may be smaller, not larger)");
}

// The checks q, k, v get in both passes. Rows the kernels cannot read in place
// are copied (flash_api.cpp's aligned()); a head dim that is not a multiple of
// 8 is refused here and zero-padded by flash_attn_func. softmax_scale is the
// public functions' to check (a Python argument).
// fp8: the FP8 operator's (float8_e4m3fn, head dims multiples of 16).
void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Layout& layout,
               bool fp8 = false) {
    // k or v on another device than q first: with q on the CPU and k on the GPU,
    // the call lands here, and the error names the tensor that differs.
    check_same_device(k, "k", q);
    check_same_device(v, "v", q);
    check_tensor(q, "q", q, layout, fp8);
    check_tensor(k, "k", q, layout, fp8);
    check_tensor(v, "v", q, layout, fp8);
    const int64_t num_heads = q.size(-2), head_dim = q.size(-1), num_heads_k = k.size(-2);
    const std::string shapes = "q " + str(q.sizes()) + ", k " + str(k.sizes()) + ", v " + str(v.sizes());
    if (!layout.varlen) {
        TORCH_CHECK_VALUE(k.size(0) == q.size(0) && v.size(0) == q.size(0), "flashattn: batch sizes differ (", shapes,
                          "); they must be equal");
    }
    TORCH_CHECK_VALUE(k.sizes().slice(0, k.dim() - 1) == v.sizes().slice(0, v.dim() - 1),
                      "flashattn: k and v must have the same shape ", layout.shape("k"), ", got ", shapes);
    TORCH_CHECK_VALUE(k.size(-1) == head_dim, "flashattn: head dims differ (", shapes,
                      "); q and k must share one headdim");
    TORCH_CHECK_VALUE(head_dim >= 1 && head_dim <= flash::kMaxHeadDim, "flashattn: headdim ", str(head_dim), " (",
                      shapes, ") is not supported; accepted: 1 to ", str(flash::kMaxHeadDim));
    check_v_head_dim(q, k, v, {"q", "k", "v"});
    const std::string heads_dim = str(layout.rank("q") - 2), heads_dim_k = str(layout.rank("k") - 2);
    // Heads that disagree but agree read as SDPA's (batch, nheads, seqlen, headdim): say so
    // (the same words as flashattn/cpu.py's _sdpa_layout_hint).
    const bool sdpa_layout = !layout.varlen && k.size(1) > 0 && q.size(1) % k.size(1) == 0;
    const std::string sdpa_hint =
        sdpa_layout ? "; q looks like SDPA's (batch, nheads, seqlen, headdim) layout (q.shape[1] = " +
                          str(q.size(1)) + " heads, k.shape[1] = " + str(k.size(1)) +
                          "): flashattn takes (batch, seqlen, nheads, headdim), e.g. q.transpose(1, 2)"
                    : std::string();
    TORCH_CHECK_VALUE(num_heads_k > 0 && num_heads % num_heads_k == 0,
                      "flashattn: the number of query heads (q.shape[", heads_dim, "] = ", str(num_heads),
                      ") must be a multiple of the number of key/value heads (k.shape[", heads_dim_k,
                      "] = ", str(num_heads_k), ")", sdpa_hint);
    check_last_dim_contiguous(q, "q");
    check_last_dim_contiguous(k, "k");
    check_last_dim_contiguous(v, "v");
    // What only the kernels need comes last, so that the checks cpu.py shares come in its order.
    const int64_t align = 16 / q.element_size();  // a row of 16-byte chunks
    TORCH_CHECK_VALUE(head_dim % align == 0 && v.size(-1) % align == 0,
                      "flashattn: the kernel needs head_dim to be a multiple of ", str(align), " (got ",
                      str(head_dim), v.size(-1) == head_dim ? "" : ", v's " + str(v.size(-1)),
                      fp8 ? "); flash_attn_func runs other FP8 head dims dequantised"
                          : "); flash_attn_func pads it for you");
    TORCH_CHECK_VALUE(num_heads <= 65535 && (layout.varlen || q.size(0) <= 65535), "flashattn: batch and heads (",
                      str(num_heads), ") must each be at most 65535");
    TORCH_CHECK_VALUE(layout.rows(q) <= INT32_MAX && layout.rows(k) <= INT32_MAX,
                      "flashattn: sequence lengths must fit in int32");
}

// The ALiBi slopes and dropout's rng_state (tensors), and the range of the
// option values the binding converts for the kernels: window sides to int,
// dropout_p to a 16-bit threshold. The values' meaning (window_size, softcap,
// dropout_p, softmax_scale) is the public functions' to check.
void check_options(const at::Tensor& q, int64_t batch, int64_t window_left, int64_t window_right,
                   const std::optional<at::Tensor>& alibi_slopes, double dropout_p,
                   const std::optional<at::Tensor>& rng_state) {
    TORCH_CHECK_VALUE(
        window_left >= -1 && window_right >= -1 && window_left <= INT32_MAX && window_right <= INT32_MAX,
        "flashattn: window_left and window_right must be ints >= -1 (-1: unbounded), got (", str(window_left), ", ",
        str(window_right), ")");
    if (alibi_slopes.has_value()) {
        const at::Tensor& slopes = *alibi_slopes;
        const int64_t num_heads = q.size(-2);
        const std::string accepted = "a float32 tensor of shape (nheads,) = (" + str(num_heads) +
                                     ",) or (batch, nheads) = (" + str(batch) + ", " + str(num_heads) + ")";
        TORCH_CHECK_TYPE(slopes.scalar_type() == at::kFloat, "flashattn: alibi_slopes must be ", accepted,
                         ", got dtype ", str(slopes.scalar_type()));
        TORCH_CHECK_VALUE((slopes.dim() == 1 && slopes.size(0) == num_heads) ||
                              (slopes.dim() == 2 && slopes.size(0) == batch && slopes.size(1) == num_heads),
                          "flashattn: alibi_slopes must be ", accepted, ", got shape ", str(slopes.sizes()));
        check_same_device(slopes, "alibi_slopes", q);
        TORCH_CHECK_VALUE(slopes.is_contiguous(), "flashattn: alibi_slopes must be contiguous");
    }
    TORCH_CHECK_VALUE(dropout_p >= 0 && dropout_p < 1, "flashattn: dropout_p must be in [0, 1), got ",
                      str_real(dropout_p));
    if (dropout_p > 0) {
        TORCH_CHECK(rng_state.has_value(), "flashattn: dropout_p > 0 needs rng_state (int64 seed and offset)");
        TORCH_CHECK(rng_state->device() == q.device() && rng_state->scalar_type() == at::kLong &&
                        rng_state->numel() == 2 && rng_state->is_contiguous(),
                    "flashattn: rng_state must be a contiguous int64 tensor of 2 elements on q's device, got ",
                    str(rng_state->scalar_type()), " of shape ", str(rng_state->sizes()), " on ",
                    rng_state->device().str());
    }
}

// An FP8 descale (q_descale, k_descale, v_descale): float32 (batch, nheads_k)
// on q's device, or none (1).
void check_descale(const std::optional<at::Tensor>& descale, const char* name, const at::Tensor& q, int64_t batch,
                   int64_t num_heads_k) {
    if (!descale.has_value()) return;
    const std::string accepted =
        "a float32 tensor of shape (batch, nheads_k) = (" + str(batch) + ", " + str(num_heads_k) + ")";
    TORCH_CHECK_TYPE(descale->scalar_type() == at::kFloat, "flashattn: ", name, " must be ", accepted,
                     ", got dtype ", str(descale->scalar_type()));
    TORCH_CHECK_VALUE(descale->dim() == 2 && descale->size(0) == batch && descale->size(1) == num_heads_k,
                      "flashattn: ", name, " must be ", accepted, ", got shape ", str(descale->sizes()));
    check_same_device(*descale, name, q);
}

// learnable_sink: float32 (nheads,) on q's device (the binding passes the
// kernels a contiguous copy where it is strided).
void check_learnable_sink(const std::optional<at::Tensor>& learnable_sink, const at::Tensor& q) {
    if (!learnable_sink.has_value()) return;
    const at::Tensor& sink = *learnable_sink;
    const int64_t num_heads = q.size(-2);
    const std::string accepted = "a float32 tensor of shape (nheads,) = (" + str(num_heads) + ",)";
    TORCH_CHECK_TYPE(sink.scalar_type() == at::kFloat, "flashattn: learnable_sink must be ", accepted,
                     ", got dtype ", str(sink.scalar_type()));
    TORCH_CHECK_VALUE(sink.dim() == 1 && sink.size(0) == num_heads, "flashattn: learnable_sink must be ", accepted,
                      ", got shape ", str(sink.sizes()));
    check_same_device(sink, "learnable_sink", q);
}

// dlse, the gradient of softmax_lse: float32 of its shape on its device (the
// binding passes the kernels a contiguous copy where it is strided).
void check_dlse(const std::optional<at::Tensor>& dlse, const at::Tensor& lse) {
    if (!dlse.has_value()) return;
    TORCH_CHECK(dlse->scalar_type() == at::kFloat && dlse->sizes() == lse.sizes() && dlse->device() == lse.device(),
                "flashattn: dlse must be a float32 tensor of softmax_lse's shape ", str(lse.sizes()), " on ",
                lse.device().str(), ", got ", str(dlse->sizes()), " ", str(dlse->scalar_type()), " on ",
                dlse->device().str());
}

// flash_attn_combine's partial results: out_partial fp32 (num_splits, batch,
// seqlen, nheads, headdim) with a contiguous last dimension, lse_partial fp32
// (num_splits, batch, seqlen, nheads), on one CUDA device; out_dtype float32,
// float16 or bfloat16 (the same messages as flashattn/cpu.py's check_combine).
void check_combine(const at::Tensor& out_partial, const at::Tensor& lse_partial, at::ScalarType out_dtype) {
    TORCH_CHECK_VALUE(out_partial.dim() == 5, "flashattn: out_partial must be 5-D (num_splits, batch, seqlen, "
                      "nheads, headdim), got shape ", str(out_partial.sizes()));
    TORCH_CHECK_VALUE(out_partial.size(0) > 0, "flashattn: out_partial must hold at least one split, got "
                      "num_splits = 0");
    const std::vector<int64_t> lse_shape(out_partial.sizes().begin(), out_partial.sizes().end() - 1);
    TORCH_CHECK_VALUE(lse_partial.sizes() == c10::IntArrayRef(lse_shape), "flashattn: lse_partial must have shape "
                      "(num_splits, batch, seqlen, nheads) = ", str(c10::IntArrayRef(lse_shape)), ", got ",
                      str(lse_partial.sizes()));
    TORCH_CHECK_TYPE(out_partial.scalar_type() == at::kFloat, "flashattn: out_partial must be float32, got ",
                     str(out_partial.scalar_type()));
    TORCH_CHECK_TYPE(lse_partial.scalar_type() == at::kFloat, "flashattn: lse_partial must be float32, got ",
                     str(lse_partial.scalar_type()));
    TORCH_CHECK(lse_partial.device() == out_partial.device(), "flashattn: lse_partial is on ",
                lse_partial.device().str(), " but out_partial is on ", out_partial.device().str(),
                "; they must be on one device");
    TORCH_CHECK(out_partial.is_cuda(), "flashattn: out_partial must be a CUDA tensor (got device ",
                out_partial.device().str(), ")");
    TORCH_CHECK_TYPE(out_dtype == at::kFloat || out_dtype == at::kHalf || out_dtype == at::kBFloat16,
                     "flashattn: out_dtype must be one of torch.float32, torch.float16, torch.bfloat16, got ",
                     str(out_dtype));
    check_last_dim_contiguous(out_partial, "out_partial");
    TORCH_CHECK_VALUE(out_partial.size(1) <= 65535 && out_partial.size(2) * out_partial.size(3) <= INT32_MAX,
                      "flashattn: flash_attn_combine takes a batch of at most 65535 and seqlen x nheads in int32, "
                      "got ", str(out_partial.sizes()));
}

// The dequantising route's values (flashattn/fp8.py: times): t float8_e4m3fn
// (rows, seqlen, nheads, headdim), headdim contiguous, on a CUDA device; scale
// fp32 (rows, nheads) on t's device; out_dtype float16 or bfloat16 (the same
// messages as flashattn/ops.py's check for the CPU).
void check_dequantize_fp8(const at::Tensor& t, const at::Tensor& scale, at::ScalarType out_dtype) {
    TORCH_CHECK_VALUE(t.dim() == 4, "flashattn: t must be 4-D (rows, seqlen, nheads, headdim), got shape ",
                      str(t.sizes()));
    TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat8_e4m3fn, "flashattn: t must be float8_e4m3fn, got ",
                     str(t.scalar_type()));
    TORCH_CHECK(t.is_cuda(), "flashattn: t must be a CUDA tensor (got device ", t.device().str(), ")");
    TORCH_CHECK_VALUE(scale.dim() == 2 && scale.size(0) == t.size(0) && scale.size(1) == t.size(2),
                      "flashattn: scale must have shape (rows, nheads) = (", str(t.size(0)), ", ",
                      str(t.size(2)), "), got ", str(scale.sizes()));
    TORCH_CHECK_TYPE(scale.scalar_type() == at::kFloat, "flashattn: scale must be float32, got ",
                     str(scale.scalar_type()));
    TORCH_CHECK(scale.device() == t.device(), "flashattn: scale is on ", scale.device().str(), " but t is on ",
                t.device().str(), "; they must be on one device");
    TORCH_CHECK_TYPE(out_dtype == at::kHalf || out_dtype == at::kBFloat16,
                     "flashattn: out_dtype must be torch.float16 or torch.bfloat16, got ", str(out_dtype));
    check_last_dim_contiguous(t, "t");
}

// An optional int32 [rows] (or with `matrix` [rows, cols]) tensor on q's
// device, contiguous.
void check_index_tensor(const std::optional<at::Tensor>& t, const char* name, const at::Tensor& q, int64_t rows,
                        bool matrix) {
    if (!t.has_value()) return;
    TORCH_CHECK_TYPE(t->scalar_type() == at::kInt, "flashattn: ", name, " must be int32, got ",
                     str(t->scalar_type()));
    TORCH_CHECK_VALUE(t->dim() == (matrix ? 2 : 1) && t->size(0) == rows, "flashattn: ", name, " must have shape ",
                      matrix ? "(" + str(rows) + ", max_blocks_per_seq)" : "(" + str(rows) + ",)", ", got ",
                      str(t->sizes()));
    check_same_device(*t, name, q);
    TORCH_CHECK_VALUE(t->is_contiguous(), "flashattn: ", name, " must be contiguous");
}

// The per-sequence tensors of a variable-length batch: seqused_q, seqused_k,
// leftpad_k (int32 [B]) and block_table (int32 [B, max_blocks_per_seq]), each
// needing cu_seqlens; with block_table, k and v are pages, shared by q's
// batch (check_qkv has checked their shapes agree). Their values are checked
// where the kernels read them (common/mask.cuh, sm80/kvcache/kv_rows.cuh).
void check_sequences(const at::Tensor& q, const at::Tensor& k, const Layout& layout, int64_t batch,
                     const std::optional<at::Tensor>& seqused_q, const std::optional<at::Tensor>& seqused_k,
                     const std::optional<at::Tensor>& leftpad_k, const std::optional<at::Tensor>& block_table) {
    check_index_tensor(seqused_q, "seqused_q", q, batch, false);
    check_index_tensor(seqused_k, "seqused_k", q, batch, false);
    check_index_tensor(leftpad_k, "leftpad_k", q, batch, false);
    check_index_tensor(block_table, "block_table", q, batch, true);
    TORCH_CHECK_VALUE(!(block_table.has_value() && leftpad_k.has_value()),
                      "flashattn: leftpad_k cannot be combined with block_table (a paged KV cache)");
    if (block_table.has_value()) {
        TORCH_CHECK_VALUE(batch == 0 || block_table->size(1) == 0 || k.size(0) > 0,
                          "flashattn: k holds no page but block_table lists ", str(block_table->size(1)),
                          " per sequence");
        TORCH_CHECK_VALUE(block_table->size(1) * k.size(1) <= INT32_MAX,
                          "flashattn: block_table's pages x page_block_size must fit in int32");
    }
}

// seqused_q, seqused_k, leftpad_k and block_table are for variable-length
// batches only (before check_qkv: block_table changes k's expected rank).
void check_needs_varlen(const Layout& layout, const std::optional<at::Tensor>& seqused_q,
                        const std::optional<at::Tensor>& seqused_k, const std::optional<at::Tensor>& leftpad_k,
                        const std::optional<at::Tensor>& block_table) {
    for (const auto& [name, t] : {std::pair<const char*, const std::optional<at::Tensor>&>{"seqused_q", seqused_q},
                                  {"seqused_k", seqused_k}, {"leftpad_k", leftpad_k}, {"block_table", block_table}}) {
        TORCH_CHECK_VALUE(!t.has_value() || layout.varlen, "flashattn: ", name,
                          " needs a variable-length batch (cu_seqlens_q and cu_seqlens_k)");
    }
}

// flash_attn_with_kvcache's tensors: q, the cache (written in place, so read
// in place: aligned strides and start), the new keys and values, the rotary
// tables and the index tensors (their values are checked where the kernels
// read them).
void check_kvcache(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                   const std::optional<at::Tensor>& k_new, const std::optional<at::Tensor>& v_new,
                   const std::optional<at::Tensor>& rotary_cos, const std::optional<at::Tensor>& rotary_sin,
                   const at::Tensor& cache_seqlens, const std::optional<at::Tensor>& cache_batch_idx,
                   const std::optional<at::Tensor>& cache_leftpad, const std::optional<at::Tensor>& block_table,
                   bool kv_fp8 = false) {
    const Layout layout{false};
    // An FP8 cache: k_cache, v_cache, k and v float8_e4m3fn, q 16-bit.
    const std::optional<at::ScalarType> kv_dtype =
        kv_fp8 ? std::optional<at::ScalarType>(at::kFloat8_e4m3fn) : std::nullopt;
    check_input(q, "q", q, layout);
    check_input(k_cache, "k_cache", q, layout, kv_dtype);
    // v_cache's head dim before its strides: an empty one (dv 0) has no row to align.
    if (q.dim() == 4 && k_cache.dim() == 4 && v_cache.dim() == 4) {
        check_v_head_dim(q, k_cache, v_cache, {"q", "k_cache", "v_cache"});
    }
    check_input(v_cache, "v_cache", q, layout, kv_dtype);
    TORCH_CHECK_VALUE(readable_in_place(k_cache) && readable_in_place(v_cache),
                      "flashattn: k_cache and v_cache must start at 16-byte aligned addresses (they are written "
                      "in place)");
    TORCH_CHECK_VALUE(k_cache.sizes().slice(0, 3) == v_cache.sizes().slice(0, 3), "flashattn: k_cache ",
                      str(k_cache.sizes()), " and v_cache ", str(v_cache.sizes()), " must have the same shape");
    const int64_t batch = q.size(0), num_heads = q.size(2), head_dim = q.size(3);
    const int64_t num_heads_k = k_cache.size(2);
    TORCH_CHECK_VALUE(k_cache.size(3) == head_dim, "flashattn: head dims differ: q ", str(q.sizes()), ", k_cache ",
                      str(k_cache.sizes()));
    TORCH_CHECK_VALUE(head_dim >= 1 && head_dim <= flash::kMaxKvcacheHeadDim,
                      "flashattn: headdim ", str(head_dim), " is not supported by flash_attn_with_kvcache; "
                      "accepted: 1 to ", str(flash::kMaxKvcacheHeadDim));
    const int64_t align = kv_fp8 ? 16 : kAlignElems;  // 16-byte chunks of the cache's rows
    TORCH_CHECK_VALUE(head_dim % align == 0 && v_cache.size(3) % align == 0,
                      "flashattn: the KV-cache kernels need head_dim to be a multiple of ", str(align),
                      kv_fp8 ? " with an FP8 cache" : "", " (got ", str(head_dim),
                      v_cache.size(3) == head_dim ? "" : ", v_cache's " + str(v_cache.size(3)), ")");
    TORCH_CHECK_VALUE(num_heads_k > 0 && num_heads % num_heads_k == 0, "flashattn: the number of query heads (",
                      str(num_heads), ") must be a multiple of the number of key/value heads in k_cache (",
                      str(num_heads_k), ")");
    check_index_tensor(cache_seqlens, "cache_seqlens", q, batch, false);
    check_index_tensor(cache_batch_idx, "cache_batch_idx", q, batch, false);
    check_index_tensor(cache_leftpad, "cache_leftpad", q, batch, false);
    check_index_tensor(block_table, "block_table", q, batch, true);
    TORCH_CHECK_VALUE(!(block_table.has_value() && cache_batch_idx.has_value()),
                      "flashattn: cache_batch_idx cannot be combined with block_table (a paged cache)");
    TORCH_CHECK_VALUE(block_table.has_value() || cache_batch_idx.has_value() || k_cache.size(0) >= batch,
                      "flashattn: k_cache holds ", str(k_cache.size(0)), " sequences but q has a batch of ",
                      str(batch));
    TORCH_CHECK_VALUE(k_new.has_value() == v_new.has_value(), "flashattn: k and v must be given together");
    if (k_new.has_value()) {
        for (const auto& [name, t, cache] :
             {std::tuple<const char*, const at::Tensor&, const at::Tensor&>{"k", *k_new, k_cache},
              std::tuple<const char*, const at::Tensor&, const at::Tensor&>{"v", *v_new, v_cache}}) {
            check_input(t, name, q, layout, kv_dtype);
            TORCH_CHECK_VALUE(t.size(0) == batch && t.size(2) == num_heads_k && t.size(3) == cache.size(3),
                              "flashattn: ", name, " must have shape (", str(batch), ", seqlen_new, ",
                              str(num_heads_k), ", ", str(cache.size(3)), "), got ", str(t.sizes()));
        }
        TORCH_CHECK_VALUE(k_new->size(1) == v_new->size(1), "flashattn: k ", str(k_new->sizes()), " and v ",
                          str(v_new->sizes()), " must have the same seqlen_new");
    }
    // The kernels clamp a bad index into its range (common/index_check.cuh): every range must hold a value.
    const int64_t capacity = block_table.has_value() ? block_table->size(1) * k_cache.size(1) : k_cache.size(1);
    const int64_t seqlen_new = k_new.has_value() ? k_new->size(1) : 0;
    TORCH_CHECK_VALUE(seqlen_new <= capacity, "flashattn: k has ", str(seqlen_new), " new rows, more than the "
                      "cache's ", str(capacity), " rows per sequence", block_table.has_value() ? " (block_table)" : "");
    TORCH_CHECK_VALUE(batch == 0 || k_cache.size(0) > 0, "flashattn: k_cache holds no ",
                      block_table.has_value() ? "page" : "sequence");
    TORCH_CHECK_VALUE(rotary_cos.has_value() == rotary_sin.has_value(),
                      "flashattn: rotary_cos and rotary_sin must be given together");
    if (rotary_cos.has_value()) {
        check_same_device(*rotary_cos, "rotary_cos", q);
        check_same_device(*rotary_sin, "rotary_sin", q);
        TORCH_CHECK_VALUE(rotary_cos->dim() == 2 && rotary_cos->sizes() == rotary_sin->sizes() &&
                              2 * rotary_cos->size(1) <= head_dim,
                          "flashattn: rotary_cos and rotary_sin must be (seqlen_ro, rotary_dim / 2) with rotary_dim "
                          "<= headdim (", str(head_dim), "), got ", str(rotary_cos->sizes()), " and ",
                          str(rotary_sin->sizes()));
        TORCH_CHECK_VALUE(rotary_cos->size(0) > 0, "flashattn: rotary_cos and rotary_sin have no rows");
    }
}

}  // namespace flashattn_api
