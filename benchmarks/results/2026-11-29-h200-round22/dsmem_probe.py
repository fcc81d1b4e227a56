"""Distributed shared memory on the H100/H200, for the d256 backward's design (issue 19;
benchmarks/NOTES.md, round 22: a cluster pair that splits the head dim and trades P and dS through
its peer's shared memory). Measures (1) the bandwidth of 16-byte stores into the peer CTA's shared
memory, every SM busy (clusters of 2), against the same stores into its own; (2) the round trip of
a flag between the pair (release store into the peer, acquire spin on one's own). Compiles its
kernels with torch.utils.cpp_extension.load_inline (sm_90a), about a minute. Run on the GPU:

    python benchmarks/results/2026-11-29-h200-round22/dsmem_probe.py
"""
import os

import torch
from torch.utils.cpp_extension import load_inline

CUDA = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <cooperative_groups.h>
#include <cstdint>
namespace cg = cooperative_groups;

// Each CTA of a pair stores `bytes` into its peer's shared memory (16 bytes a
// thread an instruction), then the pair syncs; `reps` times.
__global__ void __cluster_dims__(2, 1, 1) dsmem_push(int bytes, int reps, int* sink) {
    extern __shared__ uint4 buf[];
    cg::cluster_group cluster = cg::this_cluster();
    const unsigned rank = cluster.block_rank();
    uint4* peer = cluster.map_shared_rank(buf, rank ^ 1);
    const int n = bytes / 16;
    const uint4 v = make_uint4(threadIdx.x, rank, blockIdx.x, 0);
    cluster.sync();
    for (int r = 0; r < reps; ++r) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) peer[i] = v;
        cluster.sync();
    }
    if (threadIdx.x == 0) sink[blockIdx.x] = buf[rank].x;
}

// The same bytes into the CTA's own shared memory: the local baseline.
__global__ void __cluster_dims__(2, 1, 1) smem_push(int bytes, int reps, int* sink) {
    extern __shared__ uint4 buf[];
    cg::cluster_group cluster = cg::this_cluster();
    const int n = bytes / 16;
    const uint4 v = make_uint4(threadIdx.x, 0, blockIdx.x, 0);
    cluster.sync();
    for (int r = 0; r < reps; ++r) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = v;
        cluster.sync();
    }
    if (threadIdx.x == 0) sink[blockIdx.x] = buf[1].x;
}

// Round trips: rank 0 raises a flag in rank 1's shared memory (release), rank 1
// answers in rank 0's; one thread each; cycles per round trip into out.
__global__ void __cluster_dims__(2, 1, 1) dsmem_ping(int rounds, long long* out) {
    __shared__ int flag;
    cg::cluster_group cluster = cg::this_cluster();
    const unsigned rank = cluster.block_rank();
    if (threadIdx.x == 0) flag = -1;
    cluster.sync();
    if (threadIdx.x == 0) {
        int* peer = cluster.map_shared_rank(&flag, rank ^ 1);
        const long long t0 = clock64();
        for (int r = 0; r < rounds; ++r) {
            if (rank == 0) {
                asm volatile("st.release.cluster.s32 [%0], %1;" ::"l"(peer), "r"(r) : "memory");
                int seen;
                do { asm volatile("ld.acquire.cluster.s32 %0, [%1];" : "=r"(seen) : "l"(&flag) : "memory"); } while (seen != r);
            } else {
                int seen;
                do { asm volatile("ld.acquire.cluster.s32 %0, [%1];" : "=r"(seen) : "l"(&flag) : "memory"); } while (seen != r);
                asm volatile("st.release.cluster.s32 [%0], %1;" ::"l"(peer), "r"(r) : "memory");
            }
        }
        if (rank == 0) out[blockIdx.x / 2] = (clock64() - t0) / rounds;
    }
    cluster.sync();
}


void push(int64_t bytes, int64_t reps, int64_t blocks, bool remote, torch::Tensor sink) {
    auto kernel = remote ? dsmem_push : smem_push;
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    kernel<<<blocks, 256, bytes, c10::cuda::getCurrentCUDAStream()>>>(static_cast<int>(bytes), static_cast<int>(reps),
                                                                      sink.data_ptr<int>());
}

void ping(int64_t rounds, int64_t blocks, torch::Tensor out) {
    dsmem_ping<<<blocks, 32, 0, c10::cuda::getCurrentCUDAStream()>>>(static_cast<int>(rounds),
                                                                   reinterpret_cast<long long*>(out.data_ptr<int64_t>()));
}
"""
CPP = """
void push(int64_t bytes, int64_t reps, int64_t blocks, bool remote, torch::Tensor sink);
void ping(int64_t rounds, int64_t blocks, torch::Tensor out);
"""

os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0a")
ext = load_inline("dsmem_probe", CPP, cuda_sources=CUDA, functions=["push", "ping"],
                  extra_cuda_cflags=["-O3", "-gencode=arch=compute_90a,code=sm_90a"], verbose=False)
sms = torch.cuda.get_device_properties(0).multi_processor_count
blocks = sms // 2 * 2
sink = torch.zeros(blocks, dtype=torch.int32, device="cuda")
for bytes_ in (16384, 40960, 81920):
    reps = 2000
    row = []
    for remote in (False, True):
        ext.push(bytes_, 10, blocks, remote, sink)
        torch.cuda.synchronize()
        st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        st.record()
        ext.push(bytes_, reps, blocks, remote, sink)
        en.record()
        torch.cuda.synchronize()
        ms = st.elapsed_time(en)
        per_sm = bytes_ * reps / (ms / 1e3) / 1e9
        row.append(f"{'peer' if remote else 'own'} {per_sm:.0f} GB/s a CTA ({per_sm * blocks / 1e3:.2f} TB/s all, "
                   f"{ms / reps * 1e3:.2f} us a round)")
    print(f"{bytes_ // 1024} KB a round: " + "; ".join(row), flush=True)
out = torch.zeros(blocks // 2, dtype=torch.int64, device="cuda")
for blocks_ in (2, blocks):
    ext.ping(10000, blocks_, out)
    torch.cuda.synchronize()
    cycles = out[: blocks_ // 2].float()
    print(f"round trip between a pair ({blocks_ // 2} pairs at once): median {cycles.median().item():.0f} cycles, "
          f"max {cycles.max().item():.0f}", flush=True)
