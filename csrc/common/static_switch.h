// Where runtime values become template arguments: each family's dispatch
// (sm80/dispatch.cu, sm80/kvcache/kvcache.cu) switches through these macros.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define FLASH_BOOL_SWITCH(COND, CONST_NAME, ...) \
    [&] {                                        \
        if (COND) {                              \
            constexpr static bool CONST_NAME = true; \
            return __VA_ARGS__();                \
        } else {                                 \
            constexpr static bool CONST_NAME = false; \
            return __VA_ARGS__();                \
        }                                        \
    }()

#define FLASH_DTYPE_SWITCH(DTYPE, TYPE_NAME, ...)              \
    [&] {                                                      \
        if ((DTYPE) == ::flash::DType::kBFloat16) {            \
            using TYPE_NAME = __nv_bfloat16;                   \
            return __VA_ARGS__();                              \
        } else {                                               \
            using TYPE_NAME = __half;                          \
            return __VA_ARGS__();                              \
        }                                                      \
    }()

// The sm80 family's compiled head dims: 32, 64, 96, 128, 192, 256 (the list in
// csrc/generate_instantiations.py). Smaller head dims run on the next larger
// kernel with the extra columns zero-filled on load.
#define FLASH_HEADDIM_SWITCH(HEADDIM, CONST_NAME, ...)                         \
    [&] {                                                                      \
        if ((HEADDIM) <= 32) { constexpr static int CONST_NAME = 32; return __VA_ARGS__(); }   \
        else if ((HEADDIM) <= 64) { constexpr static int CONST_NAME = 64; return __VA_ARGS__(); }   \
        else if ((HEADDIM) <= 96) { constexpr static int CONST_NAME = 96; return __VA_ARGS__(); }   \
        else if ((HEADDIM) <= 128) { constexpr static int CONST_NAME = 128; return __VA_ARGS__(); } \
        else if ((HEADDIM) <= 192) { constexpr static int CONST_NAME = 192; return __VA_ARGS__(); } \
        else { constexpr static int CONST_NAME = 256; return __VA_ARGS__(); }                    \
    }()

namespace flash {

// The compiled (head dim, V head dim) of the kernel that serves a call: the head
// dim's (FLASH_HEADDIM_SWITCH), and V's the narrower one a family compiles for it
// (narrow_v(kHeadDim); 0 where there is none) when v (so out, dout, dv) fits,
// else the head dim itself. f is called as f.template operator()<kHeadDim, kHeadDimV>().
template <int (*narrow_v)(int), typename F>
auto head_dims_switch(int head_dim, int head_dim_v, F&& f) {
    return FLASH_HEADDIM_SWITCH(head_dim, kHeadDim, [&] {
        constexpr int kNarrowV = narrow_v(kHeadDim);
        if constexpr (kNarrowV > 0) {
            if (head_dim_v <= kNarrowV) return f.template operator()<kHeadDim, kNarrowV>();
        }
        return f.template operator()<kHeadDim, kHeadDim>();
    });
}

}  // namespace flash
