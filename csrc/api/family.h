// Which kernel family serves a device: chosen once per call, from the device's
// compute capability, before any params are filled. A family is a table of
// entry points; the binding calls nothing else of it.
//
// Families: sm90 (wgmma, TMA; sm_90 only, compiled in when the build includes
// 9.0a: FLASHATTN_HAS_SM90; the only one with an FP8 kernel), sm80 (mma.sync;
// every GPU from sm_80 on).
// FLASHATTN_FAMILY=sm80 forces a family on a GPU that has a newer one (A/B runs
// and tests); unset or "auto", each device gets the newest family built for it.
// A family may read switches of its own: FLASHATTN_SM90_PAGED_COPY=auto|tma|gather
// (how the sm90 forward copies paged keys; read at every call, sm90/dispatch.cu).
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/flash.h"
#include "sm80/sm80.h"
#ifdef FLASHATTN_HAS_SM90
#include "sm90/sm90.h"
#endif

namespace flashattn_api {

struct Family {
    const char* name;
    int min_major;  // the oldest compute capability (major) it runs on
    cudaError_t (*run_fwd)(const flash::FwdParams&, cudaStream_t);
    cudaError_t (*run_bwd)(const flash::BwdParams&, cudaStream_t);
    flash::KvcacheWorkspace (*plan_kvcache)(flash::FwdParams&, int64_t);
    cudaError_t (*run_kvcache_append)(const flash::AppendParams&, cudaStream_t);
    cudaError_t (*run_fwd_kvcache)(const flash::FwdParams&, cudaStream_t);
    int (*kernel_head_dim)(int);
    int (*fwd_counters)(const flash::FwdParams&);  // FwdParams::fwd_counters' length, 0: none
    flash::BwdWorkspace (*bwd_workspace)(const flash::BwdParams&);  // the scratch a backward asks for
    cudaError_t (*run_combine)(const flash::CombineParams&, cudaStream_t);
    cudaError_t (*run_dequantize_fp8)(const flash::DequantizeParams&, cudaStream_t);
    int max_major = INT_MAX;  // the newest compute capability (major) it runs on (sm_90a code runs on 9.x only)
    // What is wrong with the family's own switches (environment variables), or nullptr;
    // checked at every call, before anything runs (nullptr: the family has none).
    const char* (*switch_error)() = nullptr;
    // FP8 attention (FwdParams::fp8), nullptr where the family has no FP8 kernel:
    // whether it serves a call, the workspace bytes it asks for (FwdParams::vt_ptr),
    // and the call.
    bool (*serves_fp8)(const flash::FwdParams&) = nullptr;
    int64_t (*fwd_fp8_workspace)(const flash::FwdParams&) = nullptr;
    cudaError_t (*run_fwd_fp8)(const flash::FwdParams&, cudaStream_t) = nullptr;
};

inline constexpr Family kSm80{"sm80",
                              8,
                              &flash::sm80::run_fwd,
                              &flash::sm80::run_bwd,
                              &flash::sm80::plan_kvcache,
                              &flash::sm80::run_kvcache_append,
                              &flash::sm80::run_fwd_kvcache,
                              &flash::sm80::kernel_head_dim,
                              &flash::sm80::fwd_counters,
                              &flash::sm80::bwd_workspace,
                              &flash::sm80::run_combine,
                              &flash::sm80::run_dequantize_fp8};

#ifdef FLASHATTN_HAS_SM90
inline constexpr Family kSm90{"sm90",
                              9,
                              &flash::sm90::run_fwd,
                              &flash::sm90::run_bwd,
                              &flash::sm90::plan_kvcache,
                              &flash::sm90::run_kvcache_append,
                              &flash::sm90::run_fwd_kvcache,
                              &flash::sm90::kernel_head_dim,
                              &flash::sm90::fwd_counters,
                              &flash::sm90::bwd_workspace,
                              &flash::sm90::run_combine,
                              &flash::sm90::run_dequantize_fp8,
                              9,
                              &flash::sm90::switch_error,
                              &flash::sm90::serves_fp8,
                              &flash::sm90::fwd_fp8_workspace,
                              &flash::sm90::run_fwd_fp8};
#endif

// Newest first: a device gets the first family it can run.
inline constexpr const Family* kFamilies[] = {
#ifdef FLASHATTN_HAS_SM90
    &kSm90,
#endif
    &kSm80};

// The family a call on `device` runs, and the shared memory a block may opt
// into there. Refuses GPUs older than sm_80. FLASHATTN_MAX_SMEM_PER_BLOCK
// (bytes) lowers the shared-memory limit, so the tests can run the configs
// that GPUs with less shared memory (sm_86, sm_89) use.
struct DeviceKernels {
    const Family* family;
    int max_smem_per_block;
};

inline DeviceKernels device_kernels(int device) {
    int major = 0, minor = 0, smem = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    TORCH_CHECK(major >= 8, "flashattn: needs a GPU of compute capability 8.0 (Ampere) or newer; cuda:",
                std::to_string(device), " is ", std::to_string(major), ".", std::to_string(minor));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    static const int smem_cap = [] {
        const char* env = std::getenv("FLASHATTN_MAX_SMEM_PER_BLOCK");
        return env ? std::atoi(env) : INT_MAX;
    }();
    static const char* forced = [] {
        const char* env = std::getenv("FLASHATTN_FAMILY");
        return env == nullptr || std::strcmp(env, "") == 0 || std::strcmp(env, "auto") == 0 ? nullptr : env;
    }();
    for (const Family* family : kFamilies) {
        const bool runs_here = major >= family->min_major && major <= family->max_major;
        if (forced != nullptr ? std::strcmp(forced, family->name) != 0 : !runs_here) continue;
        TORCH_CHECK(runs_here, "flashattn: FLASHATTN_FAMILY=", forced, " needs compute capability ",
                    std::to_string(family->min_major), ".0 or newer",
                    family->max_major == INT_MAX ? "" : " (major " + std::to_string(family->max_major) + " at most)",
                    "; cuda:", std::to_string(device), " is ", std::to_string(major), ".", std::to_string(minor));
        const char* switch_error = family->switch_error ? family->switch_error() : nullptr;
        TORCH_CHECK_VALUE(switch_error == nullptr, "flashattn: ", switch_error);
        return {family, std::min(smem, smem_cap)};
    }
    std::string names;
    for (const Family* family : kFamilies) names += std::string(names.empty() ? "" : ", ") + family->name;
    TORCH_CHECK_VALUE(false, "flashattn: FLASHATTN_FAMILY=", forced, " names no kernel family of this build; accepted: "
                      "auto, ", names);
    return {};  // unreachable
}

}  // namespace flashattn_api
