// Runtime (dtype, head dim, causal) -> one compiled instantiation.
#include "flash.h"
#include "static_switch.h"

namespace flash {

// Defined in instantiations/*.cu.
template <typename Element, int kHeadDim, bool Is_causal>
cudaError_t run_fwd_(const FwdParams& params, cudaStream_t stream);
template <typename Element, int kHeadDim, bool Is_causal>
cudaError_t run_bwd_(const BwdParams& params, cudaStream_t stream);

int fwd_kernel_head_dim(int head_dim) {
    return FLASH_HEADDIM_SWITCH(head_dim, kHeadDim, [&] { return kHeadDim; });
}

cudaError_t run_fwd(const FwdParams& params, cudaStream_t stream) {
    return FLASH_DTYPE_SWITCH(params.dtype, Element, [&] {
        return FLASH_HEADDIM_SWITCH(params.head_dim, kHeadDim, [&] {
            return FLASH_BOOL_SWITCH(params.is_causal, Is_causal, [&] {
                return run_fwd_<Element, kHeadDim, Is_causal>(params, stream);
            });
        });
    });
}

cudaError_t run_bwd(const BwdParams& params, cudaStream_t stream) {
    return FLASH_DTYPE_SWITCH(params.dtype, Element, [&] {
        return FLASH_HEADDIM_SWITCH(params.head_dim, kHeadDim, [&] {
            return FLASH_BOOL_SWITCH(params.is_causal, Is_causal, [&] {
                return run_bwd_<Element, kHeadDim, Is_causal>(params, stream);
            });
        });
    });
}

}  // namespace flash
