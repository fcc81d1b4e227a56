// The binding's checks of the tensors an operator receives (device, dtype,
// rank, shapes, strides, index tensors) and of the option values the kernels
// rely on, each with a message that names the argument. Included by
// flash_api.cpp only; which layer checks what is tabled in README.md ("Where
// each argument is checked").
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>

#include "common/flash.h"

namespace flashattn_api {

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

// The checks q, k, v get in both passes.
void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double softmax_scale,
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

}  // namespace flashattn_api
