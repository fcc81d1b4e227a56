// Does compute-sanitizer's initcheck count a TMA (bulk tensor) store as initialising global
// memory? (It does not: benchmarks/results/2026-11-24-h100-round7/initcheck-tma-store.md.)
// Not part of the library; on an sm_90 GPU:
//   nvcc -arch=sm_90a -O2 -o /tmp/tma_store scripts/initcheck_tma_store.cu
//   compute-sanitizer --tool initcheck /tmp/tma_store plain   # 0 errors
//   compute-sanitizer --tool initcheck /tmp/tma_store tma     # reads of the stored buffer flagged
// Case "tma": a 64x64 fp32 buffer written by cp.async.bulk.tensor from shared memory,
// then read by a plain kernel. Case "plain": the same buffer written by ordinary stores.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstring>

constexpr int kRows = 64, kCols = 64;

__global__ void tma_store(const __grid_constant__ CUtensorMap map) {
    __shared__ alignas(128) float tile[kRows * kCols];
    for (int i = threadIdx.x; i < kRows * kCols; i += blockDim.x) tile[i] = float(i);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned smem = static_cast<unsigned>(__cvta_generic_to_shared(tile));
        asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];"
                     :: "l"(&map), "r"(0), "r"(0), "r"(smem) : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    }
}

__global__ void plain_store(float* buf) {
    for (int i = threadIdx.x; i < kRows * kCols; i += blockDim.x) buf[i] = float(i);
}

__global__ void checksum(const float* buf, double* sum) {
    if (threadIdx.x == 0) {
        double s = 0;
        for (int i = 0; i < kRows * kCols; ++i) s += buf[i];
        *sum = s;
    }
}

using EncodeFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                              const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                              CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

int main(int argc, char** argv) {
    const bool tma = argc > 1 && std::strcmp(argv[1], "tma") == 0;
    float* buf;
    double* sum;
    cudaMalloc(&buf, kRows * kCols * sizeof(float));
    cudaMalloc(&sum, sizeof(double));
    if (tma) {
        void* fn = nullptr;
        cudaDriverEntryPointQueryResult q;
        cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &q);
        CUtensorMap map;
        cuuint64_t dims[2] = {kCols, kRows}, strides[1] = {kCols * sizeof(float)};
        cuuint32_t box[2] = {kCols, kRows}, elem[2] = {1, 1};  // one box: the whole buffer
        CUresult r = reinterpret_cast<EncodeFn>(fn)(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, buf, dims, strides, box,
                                                    elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                                    CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
        if (r != CUDA_SUCCESS) { std::printf("encode failed %d\n", int(r)); return 1; }
        tma_store<<<1, 128>>>(map);
    } else {
        plain_store<<<1, 128>>>(buf);
    }
    checksum<<<1, 32>>>(buf, sum);
    double h = 0;
    cudaMemcpy(&h, sum, sizeof(double), cudaMemcpyDeviceToHost);
    const double want = double(kRows * kCols) * (kRows * kCols - 1) / 2;
    std::printf("%s: checksum %.0f (want %.0f) %s, %s\n", tma ? "tma" : "plain", h, want, h == want ? "ok" : "WRONG",
                cudaGetErrorString(cudaGetLastError()));
    return h == want ? 0 : 1;
}
