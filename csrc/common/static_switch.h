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

// The compiled head dims up to 256: 32, 64, 96, 128, 192, 256 (the list in
// csrc/generate_instantiations.py), which the KV-cache kernels and the sm90
// family's forward have. Smaller head dims run on the next larger kernel with
// the extra columns zero-filled on load.
#define FLASH_HEADDIM_SWITCH(HEADDIM, CONST_NAME, ...)                         \
    [&] {                                                                      \
        if ((HEADDIM) <= 32) { constexpr static int CONST_NAME = 32; return __VA_ARGS__(); }   \
        else if ((HEADDIM) <= 64) { constexpr static int CONST_NAME = 64; return __VA_ARGS__(); }   \
        else if ((HEADDIM) <= 96) { constexpr static int CONST_NAME = 96; return __VA_ARGS__(); }   \
        else if ((HEADDIM) <= 128) { constexpr static int CONST_NAME = 128; return __VA_ARGS__(); } \
        else if ((HEADDIM) <= 192) { constexpr static int CONST_NAME = 192; return __VA_ARGS__(); } \
        else { constexpr static int CONST_NAME = 256; return __VA_ARGS__(); }                    \
    }()

// The sm80 family's forward and backward add 512 (Gemma 4's global layers):
// head dims 257 to 512 run on it.
#define FLASH_HEADDIM_SWITCH_512(HEADDIM, CONST_NAME, ...)                                  \
    [&] {                                                                                   \
        if ((HEADDIM) > 256) { constexpr static int CONST_NAME = 512; return __VA_ARGS__(); } \
        return FLASH_HEADDIM_SWITCH(HEADDIM, CONST_NAME, __VA_ARGS__);                      \
    }()

namespace flash {

// The compiled (head dim, V head dim) of the kernel that serves a call: the head
// dim's (FLASH_HEADDIM_SWITCH, or FLASH_HEADDIM_SWITCH_512 for a family whose
// largest is 512: kLargest), and V's the narrower one a family compiles for it
// (narrow_v(kHeadDim); 0 where there is none) when v (so out, dout, dv) fits,
// else the head dim itself. f is called as f.template operator()<kHeadDim, kHeadDimV>().
template <int (*narrow_v)(int), int kLargest = 256, typename F>
auto head_dims_switch(int head_dim, int head_dim_v, F&& f) {
    static_assert(kLargest == 256 || kLargest == 512, "the compiled head dims end at 256 or 512");
    auto run = [&]<int kHeadDim>() {
        constexpr int kNarrowV = narrow_v(kHeadDim);
        if constexpr (kNarrowV > 0) {
            if (head_dim_v <= kNarrowV) return f.template operator()<kHeadDim, kNarrowV>();
        }
        return f.template operator()<kHeadDim, kHeadDim>();
    };
    if constexpr (kLargest == 512) {
        return FLASH_HEADDIM_SWITCH_512(head_dim, kHeadDim, [&] { return run.template operator()<kHeadDim>(); });
    } else {
        return FLASH_HEADDIM_SWITCH(head_dim, kHeadDim, [&] { return run.template operator()<kHeadDim>(); });
    }
}

}  // namespace flash
