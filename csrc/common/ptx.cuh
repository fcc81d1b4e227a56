// Tiny named wrappers around the inline PTX that every kernel family uses
// (sm_80 and newer); each family's own instructions are in its folder's ptx.cuh.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace flash {

// v, opaque to the compiler: what is computed from the result is recomputed at
// each use instead of being hoisted out of a loop and held in registers.
__device__ __forceinline__ int opaque(int v) {
    asm volatile("" : "+r"(v));
    return v;
}

__device__ __forceinline__ uint32_t smem_addr(const void* ptr) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// atom.add.acq_rel.gpu on a global counter: the writes this thread made (and,
// after a barrier, its block's) are visible to any thread that later acquires
// the counter, and the writes released by earlier adders are visible here (and,
// after a barrier, to the block). One round trip instead of a fence and an add.
__device__ __forceinline__ unsigned int atomic_add_acq_rel(unsigned int* counter, unsigned int value) {
    unsigned int old;
    asm volatile("atom.add.acq_rel.gpu.u32 %0, [%1], %2;\n" : "=r"(old) : "l"(counter), "r"(value) : "memory");
    return old;
}

// ex2.approx.ftz.f32: 2^x on the special-function unit; ex2(-inf) = +0.
__device__ __forceinline__ float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// lg2.approx.ftz.f32: log2(x) on the special-function unit; lg2(0) = -inf, lg2(NaN) = NaN.
__device__ __forceinline__ float log2_approx(float x) {
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Two fp32 values rounded to one packed 16-bit pair (low half = `lo`).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
}

template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
}

// One packed 16-bit pair widened to two fp32 values (x = low half).
template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t bits);

template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t bits) {
    return __half22float2(*reinterpret_cast<const __half2*>(&bits));
}

template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t bits) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits));
}

// One 16-bit value to and from fp32 (round to nearest).
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);

template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
    return __float2half_rn(x);
}

template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

}  // namespace flash
