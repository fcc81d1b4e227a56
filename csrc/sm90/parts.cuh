// The hand-on between the parts of a split item (schedule.h: TailSplit), one
// warpgroup at a time: the parts of an item are blocks next to each other in
// the grid, part k after part k - 1, and each warpgroup of part k holds the
// same fp32 sums (its accumulators, in the same fragment places) over its
// share of the item's steps. Part 0 stores its sums into the item's slot and
// counts itself on the warpgroup's flag; part k waits for the count k, adds
// the slot into its own sums (its own + the slot's: the same order on every
// run) and, but for the last part, stores the total back and counts itself;
// the last part resets the flag to zero for the next call and writes the
// item's results from the total. A part waits only for a block before it in
// the grid, which CUDA starts no later than it (the order the deterministic
// grids rely on too, schedule.h), so the wait always ends.
//
// A thread's values are in its own places of the warpgroup's region: value
// 4c .. 4c + 3 of thread i at float4 c * 128 + i, so that a warp's accesses
// are whole 512-byte rows, and no thread reads what another wrote.
#pragma once

#include <cstdint>

#include "common/flash.h"
#include "sm90/ptx.cuh"

namespace flash::sm90 {

template <int kValues>  // the fp32 values each thread hands on
struct PartHandOn {
    static_assert(kValues % 4 == 0, "whole float4s");
    float4* sums;  // this thread's first float4 in the warpgroup's region
    int* flag;
    int part, parts;

    // Warpgroup `warpgroup` of `warpgroups` handing on, of the item in tail
    // slot `slot`.
    __device__ __forceinline__ PartHandOn(const BwdParams& params, int slot, int part_, int parts_, int warpgroup,
                                          int warpgroups)
        : part(part_), parts(parts_) {
        const int64_t region = int64_t{slot} * warpgroups + warpgroup;
        sums = reinterpret_cast<float4*>(params.tail_partials + region * 128 * kValues) + threadIdx.x % 128;
        flag = params.tail_flags + region;
    }
    __device__ __forceinline__ bool last() const { return part == parts - 1; }

    // The parts before have handed on (part 0: nothing to wait for).
    __device__ __forceinline__ void wait() const {
        if (part > 0) wait_until_equal(flag, part);
    }
    // v (this thread's values from `first`) += the slot's.
    template <int N>
    __device__ __forceinline__ void add(float (&v)[N], int first) const {
        static_assert(N % 4 == 0, "whole float4s");
        if (part == 0) return;
#pragma unroll
        for (int c = 0; c < N / 4; ++c) {
            const float4 s = __ldcg(sums + (first / 4 + c) * 128);
            v[4 * c] += s.x, v[4 * c + 1] += s.y, v[4 * c + 2] += s.z, v[4 * c + 3] += s.w;
        }
    }
    template <int N>
    __device__ __forceinline__ void store(const float (&v)[N], int first) const {
#pragma unroll
        for (int c = 0; c < N / 4; ++c)
            __stcg(sums + (first / 4 + c) * 128, make_float4(v[4 * c], v[4 * c + 1], v[4 * c + 2], v[4 * c + 3]));
    }
    // After store (not the last part): the warpgroup's stores are visible
    // before the count. `barrier`: a named barrier of the warpgroup's 128
    // threads alone.
    __device__ __forceinline__ void count(int barrier) const {
        __threadfence();
        named_barrier_sync(barrier, 128);
        if (threadIdx.x % 128 == 0) red_release_add(flag, 1);
    }
    // The last part, after wait: every thread has seen the count; zero again.
    __device__ __forceinline__ void reset(int barrier) const {
        named_barrier_sync(barrier, 128);
        if (threadIdx.x % 128 == 0) store_relaxed(flag, 0);
    }
};

}  // namespace flash::sm90
