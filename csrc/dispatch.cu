// Runtime (dtype, head dim, local, extras) -> one compiled instantiation.
#include "flash.h"
#include "static_switch.h"

namespace flash {

// Defined in instantiations/*.cu.
template <typename Element, int kHeadDim, bool Is_local, bool Has_extras>
cudaError_t run_fwd_(const FwdParams& params, cudaStream_t stream);
template <typename Element, int kHeadDim, bool Is_local, bool Has_extras>
cudaError_t run_bwd_(const BwdParams& params, cudaStream_t stream);

template <typename Element, int kHeadDim>
cudaError_t run_fwd_kvcache_(const FwdParams& params, const CombineParams& combine, cudaStream_t stream);

int fwd_kernel_head_dim(int head_dim) {
    return FLASH_HEADDIM_SWITCH(head_dim, kHeadDim, [&] { return kHeadDim; });
}

cudaError_t run_fwd(const FwdParams& params, cudaStream_t stream) {
    return FLASH_DTYPE_SWITCH(params.dtype, Element, [&] {
        return FLASH_HEADDIM_SWITCH(params.head_dim, kHeadDim, [&] {
            return FLASH_BOOL_SWITCH(params.is_local, Is_local, [&] {
                return FLASH_BOOL_SWITCH(params.has_extras, Has_extras, [&] {
                    return run_fwd_<Element, kHeadDim, Is_local, Has_extras>(params, stream);
                });
            });
        });
    });
}

cudaError_t run_bwd(const BwdParams& params, cudaStream_t stream) {
    return FLASH_DTYPE_SWITCH(params.dtype, Element, [&] {
        return FLASH_HEADDIM_SWITCH(params.head_dim, kHeadDim, [&] {
            return FLASH_BOOL_SWITCH(params.is_local, Is_local, [&] {
                return FLASH_BOOL_SWITCH(params.has_extras, Has_extras, [&] {
                    return run_bwd_<Element, kHeadDim, Is_local, Has_extras>(params, stream);
                });
            });
        });
    });
}

cudaError_t run_fwd_kvcache(const FwdParams& params, const CombineParams& combine, cudaStream_t stream) {
    return FLASH_DTYPE_SWITCH(params.dtype, Element, [&] {
        return FLASH_HEADDIM_SWITCH(params.head_dim, kHeadDim, [&] {
            return run_fwd_kvcache_<Element, kHeadDim>(params, combine, stream);
        });
    });
}

}  // namespace flash
