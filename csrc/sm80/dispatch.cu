// The sm80 family's forward and backward entry points (sm80.h): runtime (dtype,
// head dim, local, extras; paged keys; the backward's V head dim) -> one
// compiled instantiation. Head dims up to 512 (FLASH_HEADDIM_SWITCH_512).
#include "common/flash.h"
#include "common/static_switch.h"
#include "sm80/kernel_traits.h"
#include "sm80/sm80.h"

namespace flash::sm80 {

// Defined in instantiations/sm80_{fwd,bwd}_*.cu.
template <typename Element, int kHeadDim, bool Is_local, bool Has_extras>
cudaError_t run_fwd_(const FwdParams& params, cudaStream_t stream);
template <typename Element, int kHeadDim, int kHeadDimV, bool Is_local, bool Has_extras>
cudaError_t run_bwd_(const BwdParams& params, cudaStream_t stream);
// Defined in instantiations/sm80_fwd_paged_*.cu.
template <typename Element, int kHeadDim, bool Has_extras>
cudaError_t run_fwd_paged_(const FwdParams& params, cudaStream_t stream);

int fwd_counters(const FwdParams&) { return 0; }

BwdWorkspace bwd_workspace(const BwdParams& params) { return {/*dq_accum=*/!params.deterministic, /*semaphores=*/0}; }

int kernel_head_dim(int head_dim) {
    return FLASH_HEADDIM_SWITCH_512(head_dim, kHeadDim, [&] { return kHeadDim; });
}

cudaError_t run_fwd(const FwdParams& params, cudaStream_t stream) {
    if (const cudaError_t err = run_fwd_unwritten_rows(params, stream); err != cudaSuccess) return err;
    return FLASH_DTYPE_SWITCH(params.dtype, Element, [&] {
        return FLASH_HEADDIM_SWITCH_512(params.head_dim, kHeadDim, [&] {
            return FLASH_BOOL_SWITCH(params.has_extras, Has_extras, [&] {
                if (params.block_table != nullptr) return run_fwd_paged_<Element, kHeadDim, Has_extras>(params, stream);
                return FLASH_BOOL_SWITCH(params.is_local, Is_local, [&] {
                    return run_fwd_<Element, kHeadDim, Is_local, Has_extras>(params, stream);
                });
            });
        });
    });
}

cudaError_t run_bwd(const BwdParams& params, cudaStream_t stream) {
    return FLASH_DTYPE_SWITCH(params.dtype, Element, [&] {
        // V's head dim: the narrower one compiled for the head dim where v, dout and dv fit it.
        auto run = [&]<int kHeadDim, int kHeadDimV>() {
            return FLASH_BOOL_SWITCH(params.is_local, Is_local, [&] {
                return FLASH_BOOL_SWITCH(params.has_extras, Has_extras, [&] {
                    return run_bwd_<Element, kHeadDim, kHeadDimV, Is_local, Has_extras>(params, stream);
                });
            });
        };
        return head_dims_switch<narrow_head_dim_v, 512>(params.head_dim, params.head_dim_v, run);
    });
}

}  // namespace flash::sm80
