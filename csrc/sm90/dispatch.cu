// The sm90 family's entry points (sm90.h): runtime (dtype, head dim, local,
// softcap; the backward's deterministic) -> one compiled forward or backward
// instantiation, or the sm80 family for what the sm90 kernels do not serve.

#include <cstdlib>
#include <cstring>

#include "common/flash.h"
#include "common/static_switch.h"
#include "sm80/sm80.h"
#include "sm90/bwd_grids.h"
#include "sm90/fp8_values.cuh"
#include "sm90/kernel_traits.h"
#include "sm90/schedule.h"
#include "sm90/sm90.h"
#include "sm90/tensor_map.h"

namespace flash::sm90 {

// Defined in instantiations/sm90_fwd_*.cu and sm90_bwd_*.cu.
template <typename Element, int kHeadDim, int kHeadDimV, bool Is_local, bool Has_softcap>
cudaError_t run_fwd_(const FwdParams& params, KeyCopy key_copy, cudaStream_t stream);
template <typename Element, int kHeadDim, int kHeadDimV, bool Is_local, bool Has_softcap, bool Is_deterministic>
cudaError_t run_bwd_(const BwdParams& params, cudaStream_t stream);
template <typename Out, int kHeadDim, bool Is_local>
cudaError_t run_fwd_fp8_(const FwdParams& params, cudaStream_t stream);

namespace {

// Head dims up to 32 have no sm90 kernel (serves() sends them to sm80 first).
template <int kHeadDim>
constexpr bool kHasKernel = kHeadDim > 32;

// The compiled (head dim, V head dim) of the forward kernel that serves a call
// (static_switch.h: head_dims_switch, with this family's narrow_head_dim_v).
template <typename F>
auto fwd_head_dims_switch(const FwdParams& params, F&& f) {
    return head_dims_switch<narrow_head_dim_v>(params.head_dim, params.head_dim_v, static_cast<F&&>(f));
}

// The forward's shared memory at a compiled head dim (the same for both dtypes).
template <int kHeadDim, int kHeadDimV>
int fwd_smem_bytes(bool is_local) {
    if constexpr (kHasKernel<kHeadDim>) {
        return is_local ? FwdTraitsFor<kHeadDim, __half, true, kHeadDimV>::kSmemBytes
                        : FwdTraitsFor<kHeadDim, __half, false, kHeadDimV>::kSmemBytes;
    } else {
        return 0;
    }
}

template <typename Element, int kHeadDim, int kHeadDimV>
cudaError_t run_fwd_head_dim(const FwdParams& params, KeyCopy key_copy, cudaStream_t stream) {
    if constexpr (kHasKernel<kHeadDim>) {
        return FLASH_BOOL_SWITCH(params.is_local, Is_local, [&] {
            return FLASH_BOOL_SWITCH(params.softcap > 0.f, Has_softcap, [&] {
                return run_fwd_<Element, kHeadDim, kHeadDimV, Is_local, Has_softcap>(params, key_copy, stream);
            });
        });
    } else {
        return sm80::run_fwd(params, stream);
    }
}

// Keys per tile at a head dim (0: no sm90 kernel).
template <int kHeadDim, int kHeadDimV>
int fwd_block_n(bool is_local) {
    if constexpr (kHasKernel<kHeadDim>) {
        return is_local ? FwdConfig<kHeadDim, true, kHeadDimV>::kBlockN : FwdConfig<kHeadDim, false, kHeadDimV>::kBlockN;
    } else {
        return 0;
    }
}

// FLASHATTN_SM90_PAGED_COPY, read at every call (unlike FLASHATTN_FAMILY,
// api/family.h, read once), so that one process can time both ways of copying
// paged keys on the same pages: how the forward copies paged keys (KeyCopy).
//   auto (or unset): gathered where a key tile would take more than one TMA box
//     per column block (gathers_keys), by TMA otherwise;
//   tma: TMA boxes wherever they fit; pages they do not fit (sizes that are no
//     multiple of 8 against the tile height) run on the sm80 family;
//   gather: every paged call gathered (KeyTileGather, 4 lanes a key row);
//   gather8: the same with 8 lanes a row (A/B runs).
// Any other value fails every call on sm90 with an error that names the
// variable (switch_error, which the binding checks first); a paged forward that
// still gets here refuses it (invalid argument).
enum class PagedCopy { kAuto, kTma, kGather, kGather8, kUnknown };

PagedCopy paged_copy_requested() {
    const char* env = std::getenv("FLASHATTN_SM90_PAGED_COPY");
    if (env == nullptr || std::strcmp(env, "") == 0 || std::strcmp(env, "auto") == 0) return PagedCopy::kAuto;
    if (std::strcmp(env, "tma") == 0) return PagedCopy::kTma;
    if (std::strcmp(env, "gather") == 0) return PagedCopy::kGather;
    if (std::strcmp(env, "gather8") == 0) return PagedCopy::kGather8;
    return PagedCopy::kUnknown;
}

// How this call's paged keys are copied, the tiles being block_n keys tall.
KeyCopy key_copy_for(const FwdParams& params, PagedCopy requested, int block_n) {
    switch (requested) {
        case PagedCopy::kTma: return KeyCopy::kTma;
        case PagedCopy::kGather: return KeyCopy::kGather;
        case PagedCopy::kGather8: return KeyCopy::kGather8;
        default: return gathers_keys(params.page_size, block_n) ? KeyCopy::kGather : KeyCopy::kTma;
    }
}

// Keys per tile of the kernel that serves a call's head dim (0: none).
int block_n_of(const FwdParams& params) {
    return fwd_head_dims_switch(params, [&]<int kHeadDim, int kHeadDimV>() {
        return fwd_block_n<kHeadDim, kHeadDimV>(params.is_local);
    });
}

// The head dim of the backward kernel that serves a call's (0: none). Head
// dims 65..96 run on the d128 kernel, padded as 97..127 already do
// (bwd_kernel.cuh): simpler than a d96 configuration, at the price of GEMM
// work on zeros, 4/3 of what a d96 call needs (1.6x at d80), in all five
// GEMMs (the forward's d96 kernel pads its P V alone).
constexpr int bwd_head_dim(int head_dim) {
    return head_dim <= 32    ? 0
           : head_dim <= 64  ? 64
           : head_dim <= 128 ? 128
           : head_dim <= 192 ? 192
           : head_dim <= 256 ? 256
                             : 0;
}
template <int kHeadDim>
constexpr bool kBwdMinHeadDimHolds = bwd_head_dim(BwdTraitsFor<kHeadDim, __half>::kMinHeadDim) == kHeadDim &&
                                     bwd_head_dim(BwdTraitsFor<kHeadDim, __half>::kMinHeadDim - 1) != kHeadDim;
static_assert(kBwdMinHeadDimHolds<64> && kBwdMinHeadDimHolds<128> && kBwdMinHeadDimHolds<192> &&
                  kBwdMinHeadDimHolds<256>,
              "BwdTraits::kMinHeadDim: the smallest head dim bwd_head_dim sends to each kernel");

// The compiled (head dim, V head dim) of the backward kernel that serves a
// call whose head dim bwd_head_dim serves: V at the head dim's width, or at
// 192 the narrower 128 (narrow_head_dim_v) where v fits it. The d64 and d128
// kernels run a narrower V padded to the head dim. f is called as
// f.template operator()<kHeadDim, kHeadDimV>().
template <typename F>
auto bwd_head_dims_switch(const BwdParams& params, F&& f) {
    switch (bwd_head_dim(params.head_dim)) {
        case 64: return f.template operator()<64, 64>();
        case 128: return f.template operator()<128, 128>();
        case 192:
            return params.head_dim_v <= narrow_head_dim_v(192) ? f.template operator()<192, narrow_head_dim_v(192)>()
                                                               : f.template operator()<192, 192>();
        default: return f.template operator()<256, 256>();
    }
}

template <typename Element, int kHeadDim, int kHeadDimV>
cudaError_t run_bwd_head_dim(const BwdParams& params, cudaStream_t stream) {
    return FLASH_BOOL_SWITCH(params.is_local, Is_local, [&] {
        return FLASH_BOOL_SWITCH(params.softcap > 0.f, Has_softcap, [&] {
            return FLASH_BOOL_SWITCH(params.deterministic, Is_deterministic, [&] {
                // At d256 a dQ kernel over query tiles serves both modes: one instantiation.
                constexpr bool kDet = Is_deterministic && BwdTraitsFor<kHeadDim, Element, kHeadDimV>::kDqInKernel;
                return run_bwd_<Element, kHeadDim, kHeadDimV, Is_local, Has_softcap, kDet>(params, stream);
            });
        });
    });
}

}  // namespace

bool serves(const FwdParams& params) {
    // The compiled head dims end at 256 (fwd_head_dims_switch); past them the sm80 family's 512 serves.
    if (params.head_dim > 256) return false;
    const int smem = fwd_head_dims_switch(params, [&]<int kHeadDim, int kHeadDimV>() {
        return fwd_smem_bytes<kHeadDim, kHeadDimV>(params.is_local);
    });
    // Paged keys: gathered rows take any page size; TMA boxes only pages whose
    // boxes are whole swizzle atoms (kv_box_rows). Keys are counted from each
    // sequence's first page (leftpad_k, which the block table cannot carry,
    // stays with sm80).
    const int block_n = block_n_of(params);
    const bool pages_fit =
        params.block_table == nullptr ||
        (params.leftpad_k == nullptr &&
         (key_copy_for(params, paged_copy_requested(), block_n) != KeyCopy::kTma ||
          kv_box_rows(params.page_size, block_n) > 0));
    return params.head_dim > 32 && params.alibi_slopes_ptr == nullptr && params.rng_state == nullptr && pages_fit &&
           smem <= params.max_smem_per_block && tensor_maps_fit(params);
}

const char* switch_error() {
    return paged_copy_requested() == PagedCopy::kUnknown
               ? "FLASHATTN_SM90_PAGED_COPY must be unset, empty, auto, tma, gather or gather8"
               : nullptr;
}

cudaError_t run_fwd(const FwdParams& params, cudaStream_t stream) {
    if (!serves(params)) return sm80::run_fwd(params, stream);
    const PagedCopy requested = paged_copy_requested();
    if (params.block_table != nullptr && requested == PagedCopy::kUnknown) return cudaErrorInvalidValue;
    const KeyCopy key_copy = key_copy_for(params, requested, block_n_of(params));
    if (const cudaError_t err = sm80::run_fwd_unwritten_rows(params, stream); err != cudaSuccess) return err;
    return FLASH_DTYPE_SWITCH(params.dtype, Element, [&] {
        return fwd_head_dims_switch(params, [&]<int kHeadDim, int kHeadDimV>() {
            return run_fwd_head_dim<Element, kHeadDim, kHeadDimV>(params, key_copy, stream);
        });
    });
}

// Head dims 33..256 (bwd_head_dim), softcap of the extras, deterministic=True
// (its own instantiations: bwd_kernel.cuh, bwd_dq_writer), and variable-length batches
// (cu_seqlens, seqused_q/k, leftpad_k) as the forward serves them: packed
// rows, each sequence's own lengths (bwd_kernel.cuh: BwdWork); each of these
// with any of the others. The backward has no block table (paged keys are
// gathered into a packed batch before it). Under a causal mask or a window,
// sequences of more tiles than the default grids' y holds (kMaxGridY: 4-8M
// keys or queries by head dim) go to sm80.
bool serves_bwd(const BwdParams& params) {
    const int head_dim = bwd_head_dim(params.head_dim);
    if (head_dim == 0) return false;
    const int smem = bwd_head_dims_switch(params, [&]<int kHeadDim, int kHeadDimV>() {
        return params.deterministic ? bwd_smem_bytes<BwdTraitsFor<kHeadDim, __half, kHeadDimV, true>>()
                                    : bwd_smem_bytes<BwdTraitsFor<kHeadDim, __half, kHeadDimV>>();
    });
    // Of the extras, softcap alone (ALiBi and dropout stay with sm80).
    const bool extras_fit = params.alibi_slopes_ptr == nullptr && params.rng_state == nullptr;
    // The default grids' shapes (bwd_launch.cuh; schedule.h: backward_grid):
    // the main kernel's key tiles and d256's dQ kernel's query tiles. Under a
    // mask their tiles are in y (kMaxGridY; the deterministic main kernel's
    // are in x); without one the grids are one dimension (kMaxGridX), their
    // items and a tail in parts, far past any call's memory.
    const bool grids_fit = bwd_head_dims_switch(params, [&]<int kHeadDim, int kHeadDimV>() {
        using Traits = BwdTraitsFor<kHeadDim, __half, kHeadDimV>;
        const auto tiles = [](int rows, int tile) { return (static_cast<int64_t>(rows) + tile - 1) / tile; };
        const int64_t key_tiles = tiles(params.seqlen_k, Traits::kBlockN);
        const int64_t query_tiles = tiles(params.seqlen_q, BwdDqTraits<__half>::kBlockM);
        if (params.is_local) {
            return ((params.deterministic && Traits::kDqInKernel) || key_tiles <= kMaxGridY) &&
                   (Traits::kDqInKernel || query_tiles <= kMaxGridY);
        }
        constexpr int64_t kMost = kMaxGridX / kMaxTailParts;
        return key_tiles * params.num_heads_k * params.batch <= kMost &&
               (Traits::kDqInKernel || query_tiles * params.num_heads * params.batch <= kMost);
    });
    return extras_fit && grids_fit && params.block_table == nullptr && smem <= params.max_smem_per_block &&
           bwd_tensor_maps_fit(params);
}

cudaError_t run_bwd(const BwdParams& params, cudaStream_t stream) {
    if (!serves_bwd(params)) return sm80::run_bwd(params, stream);
    return FLASH_DTYPE_SWITCH(params.dtype, Element, [&] {
        return bwd_head_dims_switch(params, [&]<int kHeadDim, int kHeadDimV>() {
            return run_bwd_head_dim<Element, kHeadDim, kHeadDimV>(params, stream);
        });
    });
}

// Deterministic: a semaphore per (batch, query head, query tile) orders the
// key tiles' dQ adds (bwd_kernel.cuh: bwd_dq_writer). At d256 dQ has a kernel
// of its own (bwd_dq_kernel.cuh), which needs neither semaphores nor dq_accum.
// Without a mask, the parts of the grids' split tails hand their sums on
// through partials and flags (bwd_launch.cuh: bwd_grids).
BwdWorkspace bwd_workspace(const BwdParams& params) {
    if (!serves_bwd(params)) return sm80::bwd_workspace(params);
    return bwd_head_dims_switch(params, [&]<int kHeadDim, int kHeadDimV>() {
        const auto workspace = [&]<typename Traits>() {
            const BwdGrids grids =
                bwd_grids<Traits>(params, params.is_local, params.deterministic, current_device_sms());
            BwdWorkspace scratch{/*dq_accum=*/Traits::kDqInKernel, /*semaphores=*/0};
            if (Traits::kDqInKernel && params.deterministic) {
                const int64_t query_tiles = (params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
                scratch.semaphores = static_cast<int64_t>(params.batch) * params.num_heads * query_tiles;
            }
            scratch.partials = grids.main_partials + grids.dq_partials;
            scratch.flags = grids.main_flags + grids.dq_flags;
            return scratch;
        };
        using DetTraits = BwdTraitsFor<kHeadDim, __half, kHeadDimV, /*Is_deterministic=*/true>;
        return params.deterministic ? workspace.template operator()<DetTraits>()
                                    : workspace.template operator()<BwdTraitsFor<kHeadDim, __half, kHeadDimV>>();
    });
}

KvcacheWorkspace plan_kvcache(FwdParams& params, int64_t requested_splits) {
    return sm80::plan_kvcache(params, requested_splits);
}

cudaError_t run_kvcache_append(const AppendParams& params, cudaStream_t stream) {
    return sm80::run_kvcache_append(params, stream);
}

cudaError_t run_fwd_kvcache(const FwdParams& params, cudaStream_t stream) {
    return sm80::run_fwd_kvcache(params, stream);
}

int fwd_counters(const FwdParams& params) {
    return (params.fp8 || serves(params)) && params.is_local ? kWorkCounterInts : 0;
}

bool serves_fp8(const FwdParams& params) {
    const int head_dim = fp8_head_dim(params.head_dim);
    if (head_dim == 0 || params.head_dim_v > params.head_dim || params.has_extras ||
        params.learnable_sink != nullptr || params.block_table != nullptr || params.seqused_q != nullptr ||
        params.seqused_k != nullptr || params.leftpad_k != nullptr || !tensor_maps_fit(params)) {
        return false;
    }
    const int smem = head_dim == 128 ? Fp8FwdTraitsFor<128, __half, false>::kSmemBytes
                                     : Fp8FwdTraitsFor<256, __half, false>::kSmemBytes;
    return smem <= params.max_smem_per_block;
}

// v transposed before the kernel, into the workspace, where the kernel does not transpose its tiles.
int64_t fwd_fp8_workspace(const FwdParams& params) {
    const bool in_kernel = fp8_head_dim(params.head_dim) == 128 ? Fp8FwdTraitsFor<128, __half, false>::kValuesInKernel
                                                                : Fp8FwdTraitsFor<256, __half, false>::kValuesInKernel;
    return in_kernel ? 0 : value_bytes(params);
}

cudaError_t run_fwd_fp8(const FwdParams& params, cudaStream_t stream) {
    if (!params.fp8 || !serves_fp8(params) || (params.vt_ptr == nullptr && fwd_fp8_workspace(params) > 0)) {
        return cudaErrorInvalidValue;
    }
    if (const cudaError_t err = sm80::run_fwd_unwritten_rows(params, stream); err != cudaSuccess) return err;
    return FLASH_DTYPE_SWITCH(params.dtype, Out, [&] {
        return FLASH_BOOL_SWITCH(params.is_local, Is_local, [&] {
            return fp8_head_dim(params.head_dim) == 128 ? run_fwd_fp8_<Out, 128, Is_local>(params, stream)
                                                        : run_fwd_fp8_<Out, 256, Is_local>(params, stream);
        });
    });
}

// The sm90 forward kernels round head dims as the sm80 ones do (32 is sm80's alone).
int kernel_head_dim(int head_dim) { return sm80::kernel_head_dim(head_dim); }

cudaError_t run_combine(const CombineParams& params, cudaStream_t stream) { return sm80::run_combine(params, stream); }
cudaError_t run_dequantize_fp8(const DequantizeParams& params, cudaStream_t stream) {
    return sm80::run_dequantize_fp8(params, stream);
}

}  // namespace flash::sm90
