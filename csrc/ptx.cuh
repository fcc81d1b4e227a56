// Tiny named wrappers around the inline PTX the kernels use (sm_80+).
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

// cp.async.cg.shared.global: 16 bytes global -> shared, bypassing L1. When
// `valid` is false nothing is read and the 16 bytes are zero-filled (src-size 0).
__device__ __forceinline__ void cp_async_16B(uint32_t dst, const void* src, bool valid) {
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
}

// cp.async.ca.shared.global of 4 bytes (no alignment beyond 4): zero-filled
// when `valid` is false.
__device__ __forceinline__ void cp_async_4B(uint32_t dst, const void* src, bool valid) {
    const int src_bytes = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
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

// cp.async.commit_group: close the group of copies issued so far.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// cp.async.wait_group N: wait until at most N committed groups are in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// ldmatrix.sync.aligned.m8n8.x4.shared.b16: four 8x8 b16 matrices; lane i gives
// the row address of row i%8 of matrix i/8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16: as ldmatrix_x4, each matrix transposed.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}: d += a (16x16) * b (16x8), fp32 accumulate.
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[2]);

template <>
__device__ __forceinline__ void mma_m16n8k16<__half>(float (&d)[4], const uint32_t (&a)[4],
                                                     const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <>
__device__ __forceinline__ void mma_m16n8k16<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                            const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
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
