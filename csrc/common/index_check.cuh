// Range checks on index values that live on the GPU (cache_seqlens, a block
// table, ...), made by the kernel that reads them, right before the read they
// guard. A value out of range never traps (a trap would take the user's whole
// CUDA context down): the kernel records the first such value of the device in
// an IndexFault and goes on with the value clamped into range, so nothing is
// read or written out of bounds (the call's results are then meaningless).
// The binding raises the recorded fault, naming the argument, at the next call
// into flashattn or at flashattn.check_faults() (csrc/api/faults.h).
#pragma once

#include <cstdint>

#include "common/flash.h"

namespace flash {

// Inline: a call (ABI) would make the callers save the registers live across it.
__device__ __forceinline__ void record_index_fault(const FaultSink& sink, IndexArgument argument, int batch,
                                                       int entry, int value, int lo, int hi) {
    if (sink.record == nullptr || atomicCAS(sink.claim, 0u, 1u) != 0u) return;
    volatile IndexFault* record = sink.record;
    record->argument = static_cast<int>(argument);
    record->batch = batch, record->entry = entry;
    record->value = value, record->lo = lo, record->hi = hi;
    __threadfence_system();  // the fields reach host memory before the flag that says they are there
    record->recorded = 1;
}

// `value` if lo <= value <= hi (the binding makes sure lo <= hi); otherwise the
// fault is recorded and the nearest bound returned.
__device__ __forceinline__ int checked_index(int value, int lo, int hi, const FaultSink& sink,
                                             IndexArgument argument, int batch, int entry = -1) {
    if (value >= lo && value <= hi) return value;
    record_index_fault(sink, argument, batch, entry, value, lo, hi);
    return value < lo ? lo : hi;
}
}  // namespace flash
