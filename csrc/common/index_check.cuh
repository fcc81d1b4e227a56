// Range checks on index values that live on the GPU (cache_seqlens, a block
// table, ...), made by the kernel that reads them, right before the read they
// guard: a value out of range prints which argument it was and traps, so the
// stream stops before anything is read or written out of bounds (the error then
// surfaces at the next synchronisation, and the CUDA context is unusable).
#pragma once

#include <cstdio>

namespace flash {

// Out of line, so that the printf's arguments and call stay out of the
// callers' registers.
static __device__ __noinline__ void index_out_of_range(const char* name, int batch, int entry, int value, int lo,
                                                       int hi) {
    if (entry < 0) {
        printf("flashattn: %s[%d] = %d is outside [%d, %d]\n", name, batch, value, lo, hi);
    } else {
        printf("flashattn: %s[%d][%d] = %d is outside [%d, %d]\n", name, batch, entry, value, lo, hi);
    }
    __trap();
}

// `value` if lo <= value <= hi; otherwise reports name[batch] (or
// name[batch][entry] for entry >= 0) and traps.
__device__ __forceinline__ int checked_index(int value, int lo, int hi, const char* name, int batch,
                                             int entry = -1) {
    if (value < lo || value > hi) index_out_of_range(name, batch, entry, value, lo, hi);
    return value;
}

}  // namespace flash
