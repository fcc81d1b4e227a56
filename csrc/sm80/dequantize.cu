// FP8 values dequantised to 16 bits (sm80.h: run_dequantize_fp8), for the
// route of FP8 attention that runs the 16-bit kernels (flashattn/fp8.py): one
// pass, e4m3 bytes in and 16-bit values out, where PyTorch's e4m3 conversion
// and its broadcast multiply took two passes at a fifth of the bandwidth
// (NOTES.md, round 28). Every e4m3 value is an fp16 value, so the conversion is
// exact; the product with the fp32 scale is rounded once to fp32 and once to
// the output type (round to nearest even), as (in.float() * scale).to(out)
// rounds it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

#include "common/flash.h"
#include "common/ptx.cuh"
#include "sm80/sm80.h"

namespace flash::sm80 {
namespace {

constexpr int kDequantizeThreads = 256;
constexpr int kChunk = 16;  // e4m3 values a thread converts per 16-byte load (vectorized)

// Two e4m3 bytes (the low one first) as two exact fp32 values.
__device__ __forceinline__ float2 e4m3x2_to_float2(uint16_t pair) {
    const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3);
    return __half22float2(__half2(raw));
}

// Units of work: kVec values of one (row, seq, head) position's head dim each.
// A grid-stride loop over them, in out's (contiguous) order.
template <typename Out, bool kVectorized>
__global__ void __launch_bounds__(kDequantizeThreads)
    dequantize_fp8_kernel(const DequantizeParams params) {
    constexpr int kVec = kVectorized ? kChunk : 1;
    const int64_t units_per_position = params.head_dim / kVec;
    const int64_t units = params.rows * params.seqlen * params.heads * units_per_position;
    for (int64_t unit = blockIdx.x * int64_t{kDequantizeThreads} + threadIdx.x; unit < units;
         unit += int64_t{gridDim.x} * kDequantizeThreads) {
        const int64_t position = unit / units_per_position;
        const int col = static_cast<int>(unit - position * units_per_position) * kVec;
        const int64_t head = position % params.heads;
        const int64_t row_seq = position / params.heads;
        const int64_t seq = row_seq % params.seqlen, row = row_seq / params.seqlen;
        const uint8_t* in = params.in_ptr + row * params.in_row_stride + seq * params.in_seq_stride +
                            head * params.in_head_stride + col;
        const float scale = params.scale_ptr[row * params.scale_row_stride + head * params.scale_head_stride];
        Out* out = reinterpret_cast<Out*>(params.out_ptr) + position * params.head_dim + col;
        if constexpr (kVectorized) {
            const uint4 bytes = *reinterpret_cast<const uint4*>(in);
            const uint32_t words[4] = {bytes.x, bytes.y, bytes.z, bytes.w};
            uint32_t packed[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const float2 v = e4m3x2_to_float2(static_cast<uint16_t>(words[i / 2] >> (16 * (i % 2))));
                packed[i] = pack2<Out>(__fmul_rn(v.x, scale), __fmul_rn(v.y, scale));
            }
            uint4* dst = reinterpret_cast<uint4*>(out);
            dst[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
            dst[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
        } else {
            const __half_raw raw = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(*in), __NV_E4M3);
            *out = from_float<Out>(__fmul_rn(__half2float(__half(raw)), scale));
        }
    }
}

template <typename Out, bool kVectorized>
cudaError_t launch(const DequantizeParams& params, cudaStream_t stream) {
    const int64_t units =
        params.rows * params.seqlen * params.heads * (params.head_dim / (kVectorized ? kChunk : 1));
    if (units == 0) return cudaSuccess;
    int device = 0, sms = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err != cudaSuccess) return err;
    // Enough blocks to fill every SM several times over; the grid-stride loop takes the rest.
    const int64_t blocks = std::min<int64_t>((units + kDequantizeThreads - 1) / kDequantizeThreads, int64_t{sms} * 8);
    const auto grid = static_cast<unsigned int>(blocks);
    dequantize_fp8_kernel<Out, kVectorized><<<grid, kDequantizeThreads, 0, stream>>>(params);
    return cudaGetLastError();
}

template <typename Out>
cudaError_t launch_for(const DequantizeParams& params, cudaStream_t stream) {
    return params.vectorized ? launch<Out, true>(params, stream) : launch<Out, false>(params, stream);
}

}  // namespace

cudaError_t run_dequantize_fp8(const DequantizeParams& params, cudaStream_t stream) {
    return params.out_type == DequantizeParams::OutType::kBFloat16 ? launch_for<__nv_bfloat16>(params, stream)
                                                                    : launch_for<__half>(params, stream);
}

}  // namespace flash::sm80
