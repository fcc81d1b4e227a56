// The backward's row-wise passes as entry points of their own (sm80.h), for a
// family whose main backward kernel is another but keeps these scratch layouts.
#include "common/static_switch.h"
#include "sm80/bwd_launch.cuh"
#include "sm80/sm80.h"

namespace flash::sm80 {

cudaError_t run_bwd_preprocess(const BwdParams& params, cudaStream_t stream) {
    return FLASH_DTYPE_SWITCH(params.dtype, Element, [&] { return launch_dot_do_o<Element>(params, stream); });
}

cudaError_t run_bwd_convert_dq(const BwdParams& params, cudaStream_t stream) {
    return FLASH_DTYPE_SWITCH(params.dtype, Element, [&] { return launch_convert_dq<Element>(params, stream); });
}

}  // namespace flash::sm80
