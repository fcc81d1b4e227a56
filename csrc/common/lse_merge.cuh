// Merging attention results computed over disjoint sets of keys by their
// log-sum-exps: with parts (out_s, lse_s), each out_s normalised over its own
// keys, the result over all the keys is
//     lse = log sum_s exp(lse_s),   out = sum_s exp(lse_s - lse) * out_s.
// A part that saw no key (lse_s = -inf) weighs 0; when no part saw a key the
// result is out = 0, lse = -inf. A NaN lse_s makes the result NaN.
//
// Every merge in the library uses this one type: split-KV partial results,
// the decoding kernel's warps, and the splits merged by the decoding kernel's
// last block or by the merge kernel. A learnable sink is a part with no value
// (add_sink), added once per row by whichever merge finishes it. Sums are taken against a reference, the
// largest lse_s so far, so no exp overflows; raising the reference rescales
// what was summed against the old one, as the online softmax does.
#pragma once

#include <cmath>

namespace flash {

struct LseMerge {
    float max_lse = -INFINITY;  // the reference: the largest lse_s so far
    float sum = 0.f;            // sum_s exp(lse_s - max_lse)

    // Makes `new_max` (>= max_lse) the reference; returns the factor by which
    // anything summed against the old reference must be multiplied.
    __device__ __forceinline__ float raise_max(float new_max) {
        const float factor = max_lse == -INFINITY ? 0.f : expf(max_lse - new_max);
        max_lse = new_max;
        sum *= factor;
        return factor;
    }

    // Adds one part (lse_s <= max_lse); returns its weight against the reference.
    __device__ __forceinline__ float add(float lse_s) {
        const float weight = lse_s == -INFINITY ? 0.f : expf(lse_s - max_lse);
        sum += weight;
        return weight;
    }

    // A learnable sink (flash.h): one more part, lse_s = sink, with no value
    // (its out_s is 0), added once after every real part. Returns the factor by
    // which what was summed against the old reference must be multiplied (1
    // without a sink: sink = -inf).
    __device__ __forceinline__ float add_sink(float sink) {
        if (sink == -INFINITY) return 1.f;
        const float factor = raise_max(fmaxf(max_lse, sink));
        add(sink);
        return factor;
    }

    // What sum_s weight_s * out_s is multiplied by to give out.
    __device__ __forceinline__ float inv_sum() const { return sum == 0.f ? 0.f : 1.f / sum; }

    __device__ __forceinline__ float lse() const { return sum == 0.f ? -INFINITY : max_lse + logf(sum); }

    // A part's weight in a merged result whose lse is known: exp(lse_s - lse).
    __device__ __forceinline__ static float share(float lse_s, float lse) {
        return lse_s == -INFINITY ? 0.f : expf(lse_s - lse);
    }
};

}  // namespace flash
