// Index faults the kernels record (common/index_check.cuh) instead of
// trapping, raised here as a catchable error that names the argument: at the
// start of the next flashattn operator call on the device, or when the user
// calls flashattn.check_faults(). The call that met the bad index returned
// normally (its outputs and appended cache rows are not valid); the CUDA
// context stays usable.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <string>

#include "common/flash.h"

namespace flashattn_api {

// Whether `stream` is being captured into a CUDA graph: nothing may be
// allocated or set on the side then.
inline bool capturing(cudaStream_t stream) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
    return status != cudaStreamCaptureStatusNone;
}

// The device's sink: a zeroed claim word in device memory and the record in
// mapped, pinned host memory (read here without synchronising). Allocated on
// the first call outside a graph capture and kept for the process (the kernels
// of any call may write it); a call captured before that records nothing (its
// indices are still clamped).
inline std::mutex& sinks_mutex() {
    static std::mutex mutex;
    return mutex;
}

inline std::map<int, flash::FaultSink>& sinks() {
    static auto* sinks = new std::map<int, flash::FaultSink>();  // never destroyed: alive past CUDA's shutdown
    return *sinks;
}

inline flash::FaultSink fault_sink(int device, cudaStream_t stream) {
    const std::lock_guard<std::mutex> lock(sinks_mutex());
    auto it = sinks().find(device);
    if (it != sinks().end()) return it->second;
    if (capturing(stream)) return {};
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    flash::FaultSink sink{};
    C10_CUDA_CHECK(cudaMalloc(&sink.claim, sizeof(unsigned int)));
    C10_CUDA_CHECK(cudaMemset(sink.claim, 0, sizeof(unsigned int)));
    C10_CUDA_CHECK(cudaHostAlloc(&sink.record, sizeof(flash::IndexFault), cudaHostAllocMapped));
    *static_cast<volatile int*>(&sink.record->recorded) = 0;
    flash::IndexFault* device_record = nullptr;
    C10_CUDA_CHECK(cudaHostGetDevicePointer(&device_record, sink.record, 0));
    const flash::FaultSink for_kernels{sink.claim, device_record};
    sinks()[device] = for_kernels;
    return for_kernels;
}

inline const char* argument_name(int argument) {
    switch (static_cast<flash::IndexArgument>(argument)) {
        case flash::IndexArgument::kCacheSeqlens: return "cache_seqlens";
        case flash::IndexArgument::kCacheLeftpad: return "cache_leftpad";
        case flash::IndexArgument::kCacheBatchIdx: return "cache_batch_idx";
        case flash::IndexArgument::kBlockTable: return "block_table";
        case flash::IndexArgument::kRotaryPosition: return "rotary_cos/rotary_sin row of sequence";
        case flash::IndexArgument::kSequsedQ: return "seqused_q";
        case flash::IndexArgument::kSequsedK: return "seqused_k";
        case flash::IndexArgument::kLeftpadK: return "leftpad_k";
        case flash::IndexArgument::kCuSeqlensK: return "the length (cu_seqlens_k[b + 1] - cu_seqlens_k[b]) of sequence";
    }
    return "an index";
}

// Raises the fault recorded on `device`, if any, and clears it for the next
// (outside a graph capture, where it cannot be cleared).
inline void raise_recorded_fault(int device, cudaStream_t stream) {
    flash::FaultSink sink{};
    {
        const std::lock_guard<std::mutex> lock(sinks_mutex());
        auto it = sinks().find(device);
        if (it == sinks().end()) return;  // no KV-cache call yet: nothing recorded
        sink = it->second;
    }
    volatile flash::IndexFault* record = sink.record;
    if (record->recorded == 0 || capturing(stream)) return;
    const std::string where = "[" + std::to_string(record->batch) + "]" +
                              (record->entry >= 0 ? "[" + std::to_string(record->entry) + "]" : std::string());
    const std::string message = std::string("flashattn: an earlier call on cuda:") + std::to_string(device) +
                                " read " + argument_name(record->argument) + where + " = " +
                                std::to_string(record->value) + ", outside [" + std::to_string(record->lo) + ", " +
                                std::to_string(record->hi) +
                                "]; that call read and wrote only in-range memory, but its outputs (and the cache "
                                "rows it appended) are not valid. The CUDA context is unaffected.";
    record->recorded = 0;
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    C10_CUDA_CHECK(cudaMemset(sink.claim, 0, sizeof(unsigned int)));
    TORCH_CHECK(false, message);
}

}  // namespace flashattn_api
