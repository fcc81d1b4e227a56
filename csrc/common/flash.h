// Parameter structs shared by the binding and every kernel family. Plain C++:
// no torch, no device code.
#pragma once

#include <cstdint>
#include <cuda_runtime_api.h>

namespace flash {

enum class DType : int { kFloat16 = 0, kBFloat16 = 1 };

// The arguments whose values only the device reads, for the host's message.
enum class IndexArgument : int {
    kCacheSeqlens = 1,
    kCacheLeftpad,
    kCacheBatchIdx,
    kBlockTable,
    kRotaryPosition,
    kSequsedQ,
    kSequsedK,
    kLeftpadK,
    kCuSeqlensK,  // a paged sequence's length (cu_seqlens_k) past its block table
};

// The first out-of-range index a device met, in host memory the kernels write
// through (mapped, pinned): `recorded` turns 1 once the other fields are written.
struct IndexFault {
    int recorded;
    int argument;  // IndexArgument
    int batch, entry;  // argument[batch] or argument[batch][entry] (entry -1: none)
    int value, lo, hi;
};

// Where kernels record faults: `claim` (device memory, zero while no fault is
// pending) elects the one thread that writes `record`.
struct FaultSink {
    unsigned int* claim;
    IndexFault* record;
};

// Forward attention over q [B, Sq, H, D], k [B, Sk, Hk, D], v [B, Sk, Hk, Dv]
// (Dv <= D: DeepSeek MLA's 192 / 128; any strides, last dim contiguous, rows
// 16-byte aligned), writing out [B, Sq, H, Dv] and the
// natural-log log-sum-exp lse [B, H, Sq] (contiguous fp32). Variable-length
// batches pack the sequences instead: q [total_q, H, D], k [total_k, Hk, D],
// v [total_k, Hk, Dv], out [total_q, H, Dv], lse [H, total_q], sequence b at rows [cu_seqlens[b],
// cu_seqlens[b + 1]); every rule below then holds per sequence.
struct FwdParams {
    const void* __restrict__ q_ptr;
    const void* __restrict__ k_ptr;
    const void* __restrict__ v_ptr;
    void* __restrict__ o_ptr;
    float* __restrict__ lse_ptr;

    // Strides in elements.
    int64_t q_batch_stride, q_row_stride, q_head_stride;
    int64_t k_batch_stride, k_row_stride, k_head_stride;
    int64_t v_batch_stride, v_row_stride, v_head_stride;
    int64_t o_batch_stride, o_row_stride, o_head_stride;

    int batch;
    int seqlen_q, seqlen_k;
    int num_heads, num_heads_k;
    int head_dim;           // q's and k's head dim: a multiple of 8, <= the kernel's kHeadDim
    int head_dim_v;         // v's, out's (and the backward's dout's and dv's): a multiple of 8, <= head_dim
                            // and <= the kernel's kHeadDimV; columns past it are read as zeros, never written
    int heads_per_kv_head;  // num_heads / num_heads_k (GQA group size)

    // Variable-length batches: cu_seqlens_q/k [B + 1] (int32, device), or nullptr
    // for the padded layout. With them, the *_batch_stride are 0, seqlen_q/k are
    // the longest sequences (the grid is sized from them) and total_q, total_k
    // are the numbers of q and k rows.
    const int* __restrict__ cu_seqlens_q;
    const int* __restrict__ cu_seqlens_k;
    int total_q;
    int total_k;
    // Variable-length batches only, each nullptr or int32 [B] (device): sequence
    // b uses its first seqused_q[b] queries (the rest of its rows are left
    // alone) and its keys [leftpad_k[b], seqused_k[b]) counted from its first
    // (the cu_seqlens lengths where nullptr; leftpad_k below). With block_table
    // (below) k and v are pages and cu_seqlens_k / seqused_k give the lengths
    // only: sequence b's key row r is row r of the pages its block-table row
    // lists. Out-of-range values are clamped and recorded (index_check.cuh).
    const int* __restrict__ seqused_q;
    const int* __restrict__ seqused_k;
    // lse (and the backward's D) of row i of head h of sequence b:
    // lse_ptr[b * lse_batch_stride + h * lse_head_stride + row_start + i].
    int64_t lse_batch_stride, lse_head_stride;

    // Visibility: query i sees key j iff i + Sk - Sq - window_left <= j <=
    // i + Sk - Sq + window_right; -1 leaves that side unbounded. Causal is
    // window_right = 0. is_local: some side is bounded (the kernels that mask by
    // the diagonal run).
    int window_left, window_right;
    bool is_local;

    // Scores. The kernels work in a "score unit" s with p = exp2(s * softmax_scale_log2 - offset):
    // without softcap s = q.k and softmax_scale_log2 = softmax_scale * log2(e); with
    // softcap > 0, s = tanh(q.k * softcap_inner_scale) (softcap_inner_scale =
    // softmax_scale / softcap) and softmax_scale_log2 = softcap * log2(e). ALiBi adds
    // -slope * alibi_scale * |i + Sk - Sq - j| in that unit (alibi_scale = 1 / the
    // unit's natural scale).
    float softmax_scale;       // applied to q.k; must be > 0
    float softmax_scale_log2;
    float softcap;             // 0: no capping
    float softcap_inner_scale;
    const float* __restrict__ alibi_slopes_ptr;  // [B or 1, H] fp32, or nullptr
    int64_t alibi_batch_stride;                  // 0 for slopes of shape (H,)
    float alibi_scale;

    // Dropout on the probabilities: an element is kept iff the 16-bit value its
    // Philox draw gives (csrc/philox.cuh) is >= dropout_threshold; the output
    // is rescaled by dropout_rescale = 1 / (1 - dropout_p). rng_state [2] (int64,
    // device): the Philox seed and offset. dropout_threshold = 0: no dropout.
    uint32_t dropout_threshold;
    float dropout_rescale;
    const int64_t* __restrict__ rng_state;

    // softcap, ALiBi or dropout is on: selects the kernels that implement them.
    bool has_extras;

    // Learnable sinks (FlashAttention-4's learnable_sink): per query head h, a
    // logit learnable_sink[h] (fp32, natural log, used as given: no
    // softmax_scale, softcap or ALiBi) that joins every row's softmax
    // denominator without a value: lse_i = log(sum_j exp(s_ij) + exp(sink_h)),
    // out_i = sum_j exp(s_ij - lse_i) v_j. A row that sees no key gets out 0 and
    // lse = sink_h. [H] (the call's query heads: with pack_gqa, the group's
    // rows index it, common/sink.cuh), or nullptr: none; a sink of -inf is none.
    // The forward reads it once per row, as the row's first column (a split-KV
    // partial result leaves it to the merge of the splits).
    const float* __restrict__ learnable_sink;

    // Keys read through a cache's indexing (the Is_kvcache kernels). For
    // flash_attn_with_kvcache (cache_seqlens set): batch b's keys are rows
    // [k_start, cache_seqlens[b] + seqlen_knew) of k/v's batch kv_batch_idx[b]
    // (b if nullptr), k_start = leftpad_k[b] (0 if nullptr), seqlen_k counted
    // from k_start. For a paged variable-length batch (cache_seqlens nullptr):
    // the lengths above, rows counted from 0. With block_table the keys are
    // paged: key row r of batch b lies in page block_table[b *
    // block_table_batch_stride + r / page_size] at row r % page_size, and
    // k/v_batch_stride step from page to page. leftpad_k also serves contiguous
    // variable-length batches (any kernel): keys [cu_seqlens_k[b] + leftpad_k[b],
    // cu_seqlens_k[b] + seqused_k[b]).
    const int* __restrict__ cache_seqlens;
    const int* __restrict__ leftpad_k;
    const int* __restrict__ kv_batch_idx;
    int seqlen_knew;
    const int* __restrict__ block_table;
    int64_t block_table_batch_stride;
    int page_size;
    // The ranges the kernels check those indices against where they read them
    // (index_check.cuh): the rows one sequence's cache holds (S_cache, or the
    // block table's pages x page_size) and k_cache.size(0) (sequences or pages).
    int kv_capacity;
    int kv_cache_batch;
    // Where an index out of those ranges is recorded (index_check.cuh).
    FaultSink faults;
    // The rest of the KV-cache fields are the family's plan (its plan_kvcache
    // sets them from the fields above; the binding only allocates the
    // KvcacheWorkspace the plan asks for and fills in its pointers).
    // pack_gqa -- decoding (Sq == 1) with GQA: a block's rows are the
    // heads_per_kv_head query heads of one KV head (seqlen_q = that group,
    // num_heads = num_heads_k, strides to match), so each KV tile is read once
    // for all.
    bool pack_gqa;
    // Split-KV: num_splits > 1 cuts each row's key tiles into num_splits ranges,
    // one block each, which write their partial out and lse (fp32, [splits, B, H,
    // Sq, head_dim_v] and [splits, B, H, Sq]) to be merged by their LSE.
    int num_splits;
    float* __restrict__ o_accum_ptr;
    float* __restrict__ lse_accum_ptr;
    // Merge counters of the decoding kernel, one per (batch, head): the last
    // split of a group to finish merges the group's rows. Zero before the call
    // and zero again after it; nullptr where a separate merge kernel runs.
    unsigned int* split_counters;
    // The decoding kernel's block shape (sm80: kernel_traits.h, DecodeTraits).
    bool decode_wide;

    // Shared memory a block may opt into on this device; head dims whose fastest
    // tile config needs more run a smaller one.
    int max_smem_per_block;

    // Counters the forward asks for (a family's fwd_counters, e.g. a tile
    // counter for dynamic scheduling): zero before the call and zero again
    // after it; the binding allocates them (nullptr where none were asked).
    unsigned int* fwd_counters;

    DType dtype;  // of q, k and v; with fp8, of out (q, k and v are e4m3)

    // FP8 attention (a family's run_fwd_fp8): q, k and v are float8_e4m3fn
    // and stand for stored value x descale, q_descale, k_descale and
    // v_descale fp32 [B, Hk] contiguous, or nullptr for 1 (a query head takes
    // its KV head's q_descale); out is `dtype` (16-bit). Only the forward;
    // no extras, sinks, pages or seqused. vt_ptr: the family's workspace
    // (fwd_fp8_workspace bytes) for v in the layout its kernel reads.
    bool fp8;
    // An FP8 KV cache (a family's run_fwd_kvcache, the decoding kernel): q
    // 16-bit (`dtype`, also out's), k and v (the cache) float8_e4m3fn standing
    // for stored value x k_descale / v_descale (fp32 [B, Hk] contiguous, or
    // nullptr for 1), the descale of the sequence that reads the rows.
    bool kv_fp8;
    const float* __restrict__ q_descale;
    const float* __restrict__ k_descale;
    const float* __restrict__ v_descale;
    void* __restrict__ vt_ptr;
};

// Backward over the same tensors as the forward (the FwdParams part: q, k, v,
// out, lse, read only), plus dout [B, Sq, H, Dv] and the gradients dq [B, Sq, H, D],
// dk [B, Sk, Hk, D] and dv [B, Sk, Hk, Dv]; dk/dv of a KV head sum its query heads' shares.
struct BwdParams : FwdParams {
    const void* __restrict__ do_ptr;
    void* __restrict__ dq_ptr;
    void* __restrict__ dk_ptr;
    void* __restrict__ dv_ptr;
    float* __restrict__ dsum_ptr;      // scratch in lse's layout: D = rowsum(dout * out), fp32
    float* __restrict__ dq_accum_ptr;  // [B, Sq, H, D] ([total_q, H, D]) fp32, zeroed by the preprocess (BwdWorkspace)
    int64_t dq_accum_batch_stride;     // Sq * H * D, 0 for variable-length batches
    // The family's ordered dQ adds (BwdWorkspace::semaphores; nullptr where it
    // asked for none): int32 counters, zero before the call and zero again
    // after it; the sm90 family's are [B, H, query tiles].
    int* __restrict__ dq_semaphore;
    // sm90, deterministic: how many of a (KV head, batch) pair's key tiles the
    // grid takes in a row before the next pair's (sm90/bwd_kernel.cuh:
    // BwdWork); set by the sm90 launcher, >= 1.
    int det_run;

    // The gradient of lse (fp32, in lse's layout and contiguous), or nullptr:
    // d lse_i / d s_ij = P_ij, so it folds into D: the preprocess writes
    // D_i - dlse_i into dsum_ptr (rows with lse -inf drop their dlse), and
    // every backward kernel reads that as D.
    const float* __restrict__ dlse_ptr;
    // With learnable_sink: its gradient, dsink [H] fp32 = -sum over the rows
    // of head h of exp(sink_h - lse_i) * (D_i - dlse_i) (the sink is a column
    // with no value: its dP is 0), summed in a fixed order (bitwise
    // reproducible): per head kDsinkPartials partial sums into
    // dsink_partial_ptr ([H, kDsinkPartials] fp32 scratch), then their sum.
    float* __restrict__ dsink_ptr;
    float* __restrict__ dsink_partial_ptr;

    int64_t do_batch_stride, do_row_stride, do_head_stride;
    int64_t dq_batch_stride, dq_row_stride, dq_head_stride;
    int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
    int64_t dv_batch_stride, dv_row_stride, dv_head_stride;

    // false: dQ is added up across key tiles with fp32 atomics inside the dK/dV
    // pass (fewer FLOPs, order-dependent rounding); true: bitwise reproducible,
    // by a separate dQ pass that owns each dQ row and recomputes S and dP (sm80)
    // or by adding the key tiles' dQ in a fixed order (sm90, dq_semaphore).
    bool deterministic;

    // sm90, without a mask: the items of the grid's last wave, from
    // tail_first on, run in tail_parts parts each, a block a part; the parts
    // hand their fp32 sums on in order through tail_partials, counted in
    // tail_flags (sm90/schedule.h: TailSplit; BwdWorkspace::partials and
    // ::flags). tail_parts 1: none. Set by the sm90 launcher for each of its
    // kernels. Last, so that the fields before keep their places in the
    // kernels' parameters.
    int64_t tail_first;
    int tail_parts;
    float* __restrict__ tail_partials;
    int* __restrict__ tail_flags;
};

// Writes the new keys and values of flash_attn_with_kvcache into the cache
// (rotary applied to the keys when rotary_dim > 0) and the rotated queries into
// q_rot. Layouts as FwdParams' KV cache; the new rows of batch b go to cache
// rows cache_seqlens[b] + j, at rotary position cache_seqlens[b] + j (the cache row,
// whatever the leftpad: flash-attn's convention).
struct AppendParams {
    const void* __restrict__ k_new_ptr;  // [B, Snew, Hk, D]
    const void* __restrict__ v_new_ptr;  // [B, Snew, Hk, Dv]
    int64_t knew_batch_stride, knew_row_stride, knew_head_stride;
    int64_t vnew_batch_stride, vnew_row_stride, vnew_head_stride;
    void* __restrict__ k_cache_ptr;  // [B_cache, S_cache, Hk, D] or pages [num_blocks, page_size, Hk, D]
    void* __restrict__ v_cache_ptr;  // the same with Dv
    int64_t kc_batch_stride, kc_row_stride, kc_head_stride;
    int64_t vc_batch_stride, vc_row_stride, vc_head_stride;
    const void* __restrict__ q_ptr;  // [B, Sq, H, D]
    void* __restrict__ q_rot_ptr;    // [B, Sq, H, D] contiguous, or nullptr: q needs no rotation
    int64_t q_batch_stride, q_row_stride, q_head_stride;
    const int* __restrict__ cache_seqlens;
    const int* __restrict__ kv_batch_idx;
    const int* __restrict__ block_table;
    int64_t block_table_batch_stride;
    int page_size;
    int capacity, num_cache_rows;  // as FwdParams' kv_capacity and kv_cache_batch
    FaultSink faults;              // as FwdParams' faults
    const float* __restrict__ rotary_cos;  // [rotary_rows, rotary_dim / 2] fp32, or nullptr
    const float* __restrict__ rotary_sin;
    int rotary_rows;
    int rotary_dim;
    bool rotary_interleaved;  // rotate pairs (2i, 2i + 1); else (i, i + rotary_dim / 2)
    bool q_positions_per_row;  // causal/local: query i at position cache_seqlens + i; else all at cache_seqlens
    int batch, seqlen_q, seqlen_knew, num_heads, num_heads_k, head_dim, head_dim_v;
    DType dtype;  // of q (and of the cache, unless kv_fp8)
    // An FP8 cache (FwdParams::kv_fp8): k_new and v_new are float8_e4m3fn too,
    // copied as they are; with rotary, a key is dequantised (x k_descale[b,
    // h], fp32 [B, Hk] or nullptr for 1), rotated, rounded to `dtype` and
    // stored re-quantised (/ k_descale, saturated at e4m3's largest).
    bool kv_fp8;
    const float* __restrict__ k_descale;
};

// flash_attn_combine: attention computed over disjoint sets of keys, merged by
// the parts' log-sum-exps (lse_merge.cuh): out = sum_s exp(lse_s - lse) out_s,
// lse = log sum_s exp(lse_s); a row whose every part is -inf gets out 0 and
// lse -inf. out_partial fp32 [splits, B, S, H, D] and lse_partial fp32
// [splits, B, S, H], any strides but out_partial's last (1); out [B, S, H, D]
// in out_dtype (last stride 1), lse fp32 [B, S, H] contiguous. vectorized:
// head_dim, the strides of out_partial and out, and their starts allow 4
// columns per load and store.
struct CombineParams {
    enum class OutType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };
    const float* __restrict__ out_partial_ptr;
    const float* __restrict__ lse_partial_ptr;
    void* __restrict__ out_ptr;
    float* __restrict__ lse_ptr;
    int64_t op_split_stride, op_batch_stride, op_row_stride, op_head_stride;
    int64_t lp_split_stride, lp_batch_stride, lp_row_stride, lp_head_stride;
    int64_t o_batch_stride, o_row_stride, o_head_stride;
    int num_splits, batch, seqlen, num_heads, head_dim;
    OutType out_type;
    bool vectorized;
};

// FP8 values dequantised (the 16-bit route of FP8 attention, flashattn/fp8.py):
// out[n, s, h, :] = in[n, s, h, :] x scale[n, h], e4m3 to fp32 exactly, the
// product rounded once to out's 16-bit type. in: e4m3 bytes, head dim
// contiguous; out: contiguous (rows, seqlen, heads, head_dim). vectorized: 16
// elements a thread (head_dim a multiple of 16, in's start and strides 16-byte
// aligned), else one.
struct DequantizeParams {
    enum class OutType : int { kFloat16 = 0, kBFloat16 = 1 };
    const uint8_t* __restrict__ in_ptr;
    const float* __restrict__ scale_ptr;
    void* __restrict__ out_ptr;
    int64_t in_row_stride, in_seq_stride, in_head_stride;  // in elements (bytes)
    int64_t scale_row_stride, scale_head_stride;
    int64_t rows, seqlen, heads;
    int head_dim;
    OutType out_type;
    bool vectorized;
};

// Head dims the kernels serve: q/k/v head dims up to kMaxHeadDim (the families
// pad smaller ones up to a compiled head dim); flash_attn_with_kvcache's
// kernels (sm80/kvcache/) up to kMaxKvcacheHeadDim.
constexpr int kMaxHeadDim = 512;
constexpr int kMaxKvcacheHeadDim = 256;

// flash_attn_with_kvcache's query rows per (batch, head) block: decoding (one
// query) with GQA packs the query heads of a KV head as the rows of one block
// (FwdParams::pack_gqa; not with ALiBi, whose slopes differ per query head).
constexpr bool kvcache_packs_gqa(int64_t seqlen_q, int64_t heads_per_kv_head, bool alibi) {
    return seqlen_q == 1 && heads_per_kv_head > 1 && !alibi;
}
constexpr int64_t kvcache_block_rows(int64_t seqlen_q, int64_t heads_per_kv_head, bool alibi) {
    return kvcache_packs_gqa(seqlen_q, heads_per_kv_head, alibi) ? heads_per_kv_head : seqlen_q;
}
// An FP8 cache (FwdParams::kv_fp8) is read by the decoding kernel only: up to
// this many block rows; its head dims are multiples of 16.
constexpr int kFp8KvcacheMaxRows = 16;

// The partial sums per head of the sink's gradient (BwdParams::dsink_partial_ptr):
// each head's rows are cut into this many ranges, one thread block each.
constexpr int kDsinkPartials = 32;

// The KV-cache forward's scratch, sized by a family's plan_kvcache and
// allocated by the binding: fp32 partial results of the splits (o_accum_ptr,
// lse_accum_ptr) and the decoding merge's counters (split_counters), which
// must be zero on entry and which every call leaves zero again.
struct KvcacheWorkspace {
    int64_t accum_floats;  // o_accum_ptr's length, 0: none
    int64_t lse_floats;    // lse_accum_ptr's length
    int64_t counters;      // split_counters' length, 0: none
};

// The backward's scratch beyond dsum, sized by a family's bwd_workspace (it
// depends on the family's algorithm: the sm80 deterministic path and the sm90
// d256 backward have a dQ pass of their own and need no dq_accum) and
// allocated by the binding.
struct BwdWorkspace {
    bool dq_accum;       // dq_accum_ptr: fp32 in q's shape, contiguous (the family's preprocess zeroes it)
    int64_t semaphores;  // dq_semaphore's length (int32, zero on entry and left zero), 0: none
    int64_t partials = 0;  // tail_partials' length (fp32, any contents on entry), 0: none
    int64_t flags = 0;     // tail_flags' length (int32, zero on entry and left zero), 0: none
};

}  // namespace flash
