// Host code (compiled with the sm90 family, for its launchers): see tensor_map.h.
#include "sm90/tensor_map.h"

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <nvtx3/nvToolsExtMemCudaRt.h>  // nvtxMemCudaMarkInitialized (header-only)

#include <algorithm>
#include <cstdint>

#include "sm90/kernel_traits.h"

namespace flash::sm90 {

namespace {

constexpr int kElementBytes = 2;  // fp16 and bf16: q, k, v, dout
constexpr int kAccumBytes = 4;    // fp32: dq_accum

// cuTensorMapEncodeTiled through the runtime's driver entry point, so that the
// extension needs no link against libcuda.
PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
    static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void* ptr = nullptr;
        cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
        const cudaError_t err =
            cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &found);
        return err == cudaSuccess && found == cudaDriverEntryPointSuccess
                   ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr)
                   : nullptr;
    }();
    return fn;
}

struct View {
    const void* ptr;
    int64_t rows, heads, batches;
    int64_t row_stride, head_stride, batch_stride;  // elements
    int64_t cols;  // the head dim: q's and k's (and dq_accum's), or v's (and out's, dout's)
};

// A dimension of extent 1 is never stepped: any stride the encoder accepts.
uint64_t stride_bytes(int64_t extent, int64_t stride, int element_bytes) {
    return extent > 1 ? static_cast<uint64_t>(stride) * element_bytes : 16;
}

// The map of a view of `data_type` elements: boxes of box_cols x box_rows in
// the 128-byte swizzle (box_cols * element_bytes = 128), or the 64-byte one
// (64: FP8's V^T).
cudaError_t encode(CUtensorMap* map, const FwdParams& params, const View& view, CUtensorMapDataType data_type,
                   int element_bytes, int box_cols, int box_rows) {
    const CUtensorMapSwizzle swizzle =
        box_cols * element_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B;
    if (view.rows == 0) return cudaSuccess;  // no row to copy: the kernel never reads this map
    const auto fn = encode_tiled();
    if (fn == nullptr) return cudaErrorSymbolNotFound;
    const cuuint64_t dims[4] = {static_cast<cuuint64_t>(view.cols), static_cast<cuuint64_t>(view.rows),
                                static_cast<cuuint64_t>(view.heads), static_cast<cuuint64_t>(view.batches)};
    const cuuint64_t strides[3] = {stride_bytes(view.rows, view.row_stride, element_bytes),
                                   stride_bytes(view.heads, view.head_stride, element_bytes),
                                   stride_bytes(view.batches, view.batch_stride, element_bytes)};
    const cuuint32_t box[4] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows), 1, 1};
    const cuuint32_t element_strides[4] = {1, 1, 1, 1};
    const CUresult result =
        fn(map, data_type, 4, const_cast<void*>(view.ptr), dims, strides, box, element_strides,
           CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
           CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return result == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// A map of FP8 q or k (e4m3, bytes to the copy engine), box_cols columns a box
// (128; V^T's 64).
cudaError_t encode_fp8(CUtensorMap* map, const FwdParams& params, const View& view, int box_rows,
                       int box_cols = kSwizzleBytes) {
    return encode(map, params, view, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, box_cols, box_rows);
}

// A map of q, k, v or dout (the params' dtype), 64 columns a box.
cudaError_t encode(CUtensorMap* map, const FwdParams& params, const View& view, int box_rows) {
    const CUtensorMapDataType data_type =
        params.dtype == DType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    return encode(map, params, view, data_type, kElementBytes, kSwizzleCols, box_rows);
}

View q_view(const FwdParams& params) {
    const bool varlen = params.cu_seqlens_q != nullptr;
    return {params.q_ptr, varlen ? params.total_q : params.seqlen_q, params.num_heads, varlen ? 1 : params.batch,
            params.q_row_stride, params.q_head_stride, params.q_batch_stride, params.head_dim};
}

View o_view(const FwdParams& params) {
    const bool varlen = params.cu_seqlens_q != nullptr;
    return {params.o_ptr, varlen ? params.total_q : params.seqlen_q, params.num_heads, varlen ? 1 : params.batch,
            params.o_row_stride, params.o_head_stride, params.o_batch_stride, params.head_dim_v};
}

// Paged keys: (head dim, row in page, head, page), the pages as the batch.
View kv_view(const FwdParams& params, const void* ptr, int64_t row_stride, int64_t head_stride,
             int64_t batch_stride, int cols) {
    if (params.block_table != nullptr) {
        return {ptr, params.page_size, params.num_heads_k, params.kv_cache_batch, row_stride, head_stride,
                batch_stride, cols};
    }
    const bool varlen = params.cu_seqlens_k != nullptr;
    return {ptr, varlen ? params.total_k : params.seqlen_k, params.num_heads_k, varlen ? 1 : params.batch,
            row_stride, head_stride, batch_stride, cols};
}

View k_view(const FwdParams& params) {
    return kv_view(params, params.k_ptr, params.k_row_stride, params.k_head_stride, params.k_batch_stride,
                   params.head_dim);
}

View v_view(const FwdParams& params) {
    return kv_view(params, params.v_ptr, params.v_row_stride, params.v_head_stride, params.v_batch_stride,
                   params.head_dim_v);
}

bool fits(const View& view) {
    return (view.rows <= 1 || view.row_stride != 0) && (view.heads <= 1 || view.head_stride != 0) &&
           (view.batches <= 1 || view.batch_stride != 0);
}

// A view the copy engine can store into: `fits`, with its start and every
// stride it steps on 16 bytes.
bool aligned_16(const View& view, int element_bytes) {
    const auto stride_ok = [&](int64_t extent, int64_t stride) {
        return extent <= 1 || (stride * element_bytes) % 16 == 0;
    };
    return fits(view) && reinterpret_cast<uintptr_t>(view.ptr) % 16 == 0 && stride_ok(view.rows, view.row_stride) &&
           stride_ok(view.heads, view.head_stride) && stride_ok(view.batches, view.batch_stride);
}

// dout in q's layout with its own strides; dq_accum: fp32 [B, Sq, H, D]
// ([total_q, H, D]) contiguous but for its batch stride (flash.h).
View dout_view(const BwdParams& params) {
    const bool varlen = params.cu_seqlens_q != nullptr;
    return {params.do_ptr, varlen ? params.total_q : params.seqlen_q, params.num_heads, varlen ? 1 : params.batch,
            params.do_row_stride, params.do_head_stride, params.do_batch_stride, params.head_dim_v};
}

View dq_accum_view(const BwdParams& params) {
    const bool varlen = params.cu_seqlens_q != nullptr;
    return {params.dq_accum_ptr, varlen ? params.total_q : params.seqlen_q, params.num_heads,
            varlen ? 1 : params.batch, static_cast<int64_t>(params.num_heads) * params.head_dim, params.head_dim,
            params.dq_accum_batch_stride, params.head_dim};
}

}  // namespace

cudaError_t make_fwd_tensor_maps(const FwdParams& params, int box_rows_q, int box_rows_kv, CUtensorMap* q,
                                 CUtensorMap* k, CUtensorMap* v) {
    cudaError_t err = encode(q, params, q_view(params), box_rows_q);
    if (box_rows_kv == 0) return err;  // k and v gathered, without maps
    if (err == cudaSuccess) {
        err = encode(k, params, k_view(params), box_rows_kv);
    }
    if (err == cudaSuccess) {
        err = encode(v, params, v_view(params), box_rows_kv);
    }
    return err;
}

cudaError_t make_fwd_fp8_tensor_maps(const FwdParams& params, int box_rows_q, int box_rows_kv, CUtensorMap* q,
                                     CUtensorMap* k, CUtensorMap* v) {
    cudaError_t err = encode_fp8(q, params, q_view(params), box_rows_q);
    if (err == cudaSuccess) err = encode_fp8(k, params, k_view(params), box_rows_kv);
    if (err == cudaSuccess && v != nullptr) err = encode_fp8(v, params, v_view(params), box_rows_kv);
    return err;
}

cudaError_t make_fwd_fp8_value_map(const FwdParams& params, int box_rows_vt, int box_cols_vt, int64_t vt_columns,
                                   CUtensorMap* vt) {
    // V^T (fp8_values.cuh): [KV head][head_dim_v rows][vt_columns], as (columns, rows, heads, one batch),
    // boxes of box_cols_vt columns (keys) by box_rows_vt head-dim rows, in the swizzle of that many bytes.
    const View vt_view{params.vt_ptr, params.head_dim_v, params.num_heads_k, 1, vt_columns,
                       params.head_dim_v * vt_columns, 0, vt_columns};
    return encode_fp8(vt, params, vt_view, box_rows_vt, box_cols_vt);
}

cudaError_t make_fwd_o_tensor_map(const FwdParams& params, int box_rows, CUtensorMap* o) {
    return encode(o, params, o_view(params), box_rows);
}

bool o_tensor_map_fits(const FwdParams& params) { return aligned_16(o_view(params), kElementBytes); }

void mark_o_written(const FwdParams& params, cudaStream_t stream) {
    const View view = o_view(params);
    if (view.rows == 0 || view.heads == 0 || view.batches == 0) return;
    const int64_t elements = (view.batches - 1) * view.batch_stride + (view.rows - 1) * view.row_stride +
                             (view.heads - 1) * view.head_stride + view.cols;
    nvtxMemVirtualRangeDesc_t range{};
    range.ptr = view.ptr;
    range.size = static_cast<size_t>(elements) * kElementBytes;
    nvtxMemMarkInitializedBatch_t batch{};
    batch.extCompatID = NVTX_EXT_COMPATID_MEM;
    batch.structSize = sizeof(batch);
    batch.regionType = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
    batch.regionDescCount = 1;
    batch.regionDescElementSize = sizeof(range);
    batch.regionDescElements = &range;
    static const nvtxDomainHandle_t domain = nvtxDomainCreateA("flashattn");
    nvtxMemCudaMarkInitialized(domain, stream, /*isPerThreadStream=*/0, &batch);
}

cudaError_t make_bwd_tensor_maps(const BwdParams& params, int box_rows_q, int box_rows_dq, CUtensorMap* dout,
                                 CUtensorMap* dq_accum) {
    const cudaError_t err = encode(dout, params, dout_view(params), box_rows_q);
    if (err != cudaSuccess || dq_accum == nullptr) return err;
    return encode(dq_accum, params, dq_accum_view(params), CU_TENSOR_MAP_DATA_TYPE_FLOAT32, kAccumBytes,
                  kSwizzleBytes / kAccumBytes, box_rows_dq);
}

bool tensor_maps_fit(const FwdParams& params) {
    return fits(q_view(params)) && fits(k_view(params)) && fits(v_view(params));
}

bool bwd_tensor_maps_fit(const BwdParams& params) { return tensor_maps_fit(params) && fits(dout_view(params)); }

}  // namespace flash::sm90
