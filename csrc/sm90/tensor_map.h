// Host side of the copy engine: the tensor maps (CUtensorMap) that describe q,
// k and v to the forward kernel's TMA loads, built per call from the params'
// pointers, sizes and strides (a few microseconds; no state is kept between
// calls but the driver entry point).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "common/flash.h"

namespace flash::sm90 {

// Tensor maps over q, k and v, each 4-D: (head dim, rows, heads, batch), the
// head dim contiguous, boxes of 64 columns x box_rows_q (q) or box_rows_kv (k,
// v) rows in the 128-byte swizzle. Variable-length batches get one batch entry
// and all total_q (total_k) rows; paged k and v (block_table) have the pages
// as the batch and page_size rows. Reads outside a tensor arrive as zeros.
// box_rows_kv 0: only q's map is made (the kernel gathers paged k and v).
// Returns the error of the driver call, or cudaErrorInvalidValue.
cudaError_t make_fwd_tensor_maps(const FwdParams& params, int box_rows_q, int box_rows_kv, CUtensorMap* q,
                                 CUtensorMap* k, CUtensorMap* v);

// FP8 (params.fp8): q, k and (v not null) v as above in 8 bits, boxes of 128
// columns (still 128 bytes) x box_rows_q or box_rows_kv rows.
cudaError_t make_fwd_fp8_tensor_maps(const FwdParams& params, int box_rows_q, int box_rows_kv, CUtensorMap* q,
                                     CUtensorMap* k, CUtensorMap* v);

// FP8's V^T in the family's workspace (params.vt_ptr; fp8_values.cuh) of
// vt_columns columns: boxes of box_cols_vt columns (keys, 128 or 64) x
// box_rows_vt head-dim rows in the swizzle of that many bytes.
cudaError_t make_fwd_fp8_value_map(const FwdParams& params, int box_rows_vt, int box_cols_vt, int64_t vt_columns,
                                   CUtensorMap* vt);

// The map of out for the forward's bulk stores of O: out's [head dim, rows,
// heads, batch] as q's, boxes of 64 columns x box_rows rows in the 128-byte
// swizzle; the copy engine writes nothing outside the tensor (columns past the
// head dim, rows past a padded batch's sequence). Only where o_tensor_map_fits.
cudaError_t make_fwd_o_tensor_map(const FwdParams& params, int box_rows, CUtensorMap* o);

// Tells compute-sanitizer's initcheck that the forward's bulk stores (queued on
// `stream`) wrote out: initcheck does not see bulk tensor stores
// (scripts/initcheck_tma_store.cu) and would report every later read of out,
// the backward's included, as a read of uninitialized memory. The span marked is
// out's view from its first element to its last, through NVTX's memory API (a
// no-op call when no tool is attached). Rows a call leaves unwritten by design
// (past seqused_q) are marked too: the tests' poisoned outputs cover those.
void mark_o_written(const FwdParams& params, cudaStream_t stream);

// Whether out can take bulk tensor stores: a 16-byte aligned start and strides
// that are multiples of 16 bytes (what a tensor map requires), none zero. The
// binding's out (allocated contiguous, the head dim a multiple of 8) always
// can; the launcher stores O from registers where it cannot, so that serves()
// does not depend on it.
bool o_tensor_map_fits(const FwdParams& params);

// The backward's maps beyond q, k and v: dout as q (boxes of box_rows_q rows)
// and dq_accum (fp32, boxes of 32 columns x box_rows_dq rows, the 128-byte
// swizzle), the target of the main kernel's bulk reduce-add, which skips the
// rows and columns outside the tensor; dq_accum null: dout's alone (the
// kernels that add no dQ by the copy engine).
cudaError_t make_bwd_tensor_maps(const BwdParams& params, int box_rows_q, int box_rows_dq, CUtensorMap* dout,
                                 CUtensorMap* dq_accum);

// Whether the tensor maps above can describe the params' layout: every stride
// of a dimension longer than one is non-zero (the copy engine walks distinct
// rows; a broadcast view goes to the sm80 family).
bool tensor_maps_fit(const FwdParams& params);
bool bwd_tensor_maps_fit(const BwdParams& params);  // q, k, v and dout

}  // namespace flash::sm90
