// Tiny named wrappers around the Hopper (sm_90a) instructions the sm90 family
// uses: mbarriers, the bulk tensor copy (TMA), per-thread cp.async, warpgroup
// MMA (wgmma), register reallocation and the shared-memory matrix descriptors.
// One PTX instruction (or one fixed idiom) each; the note above each says which.
#pragma once

#include <cuda.h>  // CUtensorMap (a type only: nothing here calls the driver)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

namespace flash::sm90 {

// ---- mbarriers (shared memory, 64 bit) --------------------------------------

// mbarrier.init: a barrier whose phase completes after `count` arrivals (and,
// once a thread has announced them, the transaction bytes a copy delivers).
__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// fence.mbarrier_init: makes the initialised barriers visible to the copy
// engine (the async proxy) before any copy may complete on them.
__device__ __forceinline__ void fence_barrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// mbarrier.arrive.expect_tx: arrive once and announce `bytes` bytes that copies
// will deliver to this phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// mbarrier.arrive: one arrival.
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// mbarrier.try_wait.parity in a loop: returns once the phase of parity `parity`
// has completed (phases alternate 0, 1, 0, ...; a fresh barrier is in phase 0).
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile(
            "{\n.reg .pred p;\n"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}

// ---- the bulk tensor copy (TMA) -------------------------------------------

// prefetch.tensormap: brings a tensor map (a __grid_constant__ kernel
// parameter) into the copy engine's cache ahead of its first use.
__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// cp.async.bulk.tensor.4d (global -> shared, tile mode): copies the box of `map`
// at coordinates (c0 innermost .. c3) to `dst`; the bytes complete on `bar`.
// Elements outside the tensor arrive as zeros.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1,
                                            int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
        : "memory");
}

// cp.async.bulk.tensor.4d (shared -> global, tile mode): copies the box at `src`
// into the tensor of `map` at coordinates (c0 innermost .. c3); elements outside
// the tensor are not written. Completes in the issuing thread's bulk
// async-group (commit below).
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group"
        " [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(reinterpret_cast<uint64_t>(map)),
        "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src)
        : "memory");
}

// cp.reduce.async.bulk.tensor.4d (shared -> global, tile mode, add): adds the
// box at `src` element-wise into the tensor of `map` at coordinates (c0
// innermost .. c3), atomically per element; elements outside the tensor are
// skipped. Completes in the issuing thread's bulk async-group (commit below).
__device__ __forceinline__ void tma_reduce_add_4d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2,
                                                  int c3) {
    asm volatile(
        "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group"
        " [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(reinterpret_cast<uint64_t>(map)),
        "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src)
        : "memory");
}

// cp.async.bulk.commit_group: closes this thread's group of bulk copies issued
// since the last commit.
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// cp.async.bulk.wait_group.read: waits until at most kPending of this thread's
// committed groups still read their shared-memory source (it may be rewritten).
template <int kPending>
__device__ __forceinline__ void bulk_wait_group_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}

// cp.async.bulk.wait_group: waits until at most kPending of this thread's
// committed groups are incomplete (their writes done).
template <int kPending>
__device__ __forceinline__ void bulk_wait_group() {
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// fence.proxy.async.global: orders this thread's earlier generic-proxy view of
// global memory (what an acquire made visible to it) before its later bulk
// copies (async proxy), which would otherwise not be ordered by the acquire.
__device__ __forceinline__ void fence_proxy_async_global() {
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// ---- programmatic dependent launch -----------------------------------------------

// griddepcontrol.launch_dependents: this block lets the kernel launched after
// it with programmatic stream serialization start (once every block of this
// grid has said so or finished): its blocks then fill the SMs this grid's last
// wave leaves idle. Only for a next kernel that reads nothing this one writes.
__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

// griddepcontrol.wait: returns once the grids this one was launched behind
// have completed and their writes are visible. A dependent kernel that reads
// none of them calls it last, so that it never completes before them (what
// follows it in the stream then follows them too).
__device__ __forceinline__ void wait_for_prerequisite_grids() {
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

// ---- counters that order blocks (global memory) -------------------------------

// ld.acquire.gpu in a loop, with nanosleep between tries: returns once
// *counter == value; the writes released before that value was stored are
// visible to this thread. The back-off starts at kMinNs and doubles up to
// kMaxNs, which bounds the lag it adds after the release.
template <int kMinNs = 32, int kMaxNs = 256>
__device__ __forceinline__ void wait_until_equal(const int* counter, int value) {
    int ns = kMinNs;
    while (true) {
        int seen;
        asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(counter) : "memory");
        if (seen == value) return;
        __nanosleep(ns);
        ns = ns < kMaxNs ? 2 * ns : kMaxNs;
    }
}

// red.release.gpu.global.add.s32: adds `value` once this thread's earlier
// writes (and those it has observed) are visible at GPU scope.
__device__ __forceinline__ void red_release_add(int* counter, int value) {
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(counter), "r"(value) : "memory");
}

// st.relaxed.gpu.global.b32: a plain store to a counter that no thread waits on
// any more (a reset for the next kernel, which the launch boundary orders).
__device__ __forceinline__ void store_relaxed(int* counter, int value) {
    asm volatile("st.relaxed.gpu.global.b32 [%0], %1;\n" ::"l"(counter), "r"(value) : "memory");
}

// ---- per-thread asynchronous copies (cp.async) ---------------------------------
// A thread hands its copies to other threads through an mbarrier without waiting
// for them (cp_async_arrive_noinc). wgmma (the async proxy) reads what they wrote
// to shared memory only after the reader's wait on that barrier and its
// fence_proxy_async_shared.

// cp.async.cg.shared.global (16 bytes, cached in L2 only): copies 16 bytes from
// `src` to `dst`, or, with fill_zeros, reads nothing and writes 16 zero bytes
// (src-size 0).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool fill_zeros) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(fill_zeros ? 0 : 16)
                 : "memory");
}

// cp.async.mbarrier.arrive.noinc: this thread's arrival on `bar`, made by the
// hardware once every cp.async the thread issued before it is complete (noinc:
// it is one of the arrivals the barrier was initialised to expect).
__device__ __forceinline__ void cp_async_arrive_noinc(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// cp.async.wait_all: waits until every cp.async this thread issued is complete.
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// ---- warp specialisation ------------------------------------------------------

// setmaxnreg.dec / .inc: hand registers back to the pool (the producer) or take
// them (the consumers); every warp of the warpgroup executes it.
template <int kRegs>
__device__ __forceinline__ void release_registers() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

template <int kRegs>
__device__ __forceinline__ void claim_registers() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// ---- shared-memory matrix descriptors -----------------------------------------

// The wgmma descriptor of a tile stored in the 128-byte swizzle (the layout TMA
// writes with CU_TENSOR_MAP_SWIZZLE_128B): rows of 128 bytes, 8-row atoms of
// 1024 bytes whose 16-byte chunks are XOR-permuted by the row index; the atom
// must start 1024-byte aligned (base offset 0). Fields: start address >> 4
// (bits 0-13), leading byte offset >> 4 (16-29), stride byte offset >> 4
// (32-45), swizzle mode 1 = 128 B (62-63).
//   K-major operand (Q, K; the backward's K, V, Q, dO of S^T and dP^T): the
//   stride offset steps 8 rows (1024 B); the leading offset is unused (the
//   k16 slice lies within one 128-byte row: kUnusedLeadingBytes).
//   MN-major operand (V read transposed; the backward's dO, Q, K and its dS^T
//   tile): the stride offset steps 8 rows of the K dimension (1024 B), the
//   leading offset steps 64 columns of the MN dimension (from one
//   128-byte-wide column block to the next); the next k16 step is 16 rows on.
constexpr uint32_t kUnusedLeadingBytes = 16;

__device__ __forceinline__ uint64_t smem_descriptor_sw128(uint32_t addr, uint32_t leading_bytes,
                                                          uint32_t stride_bytes) {
    return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(leading_bytes >> 4) << 16) |
           (static_cast<uint64_t>(stride_bytes >> 4) << 32) | (1ull << 62);
}

// A K-major operand in the 64-byte swizzle (swizzle mode 2; FP8's V^T): rows
// of 64 bytes, 8-row atoms of 512 (the stride offset), each k32 slice inside
// one row (the leading offset unused). The tile starts 512-byte aligned.
__device__ __forceinline__ uint64_t smem_descriptor_sw64(uint32_t addr) {
    return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(kUnusedLeadingBytes >> 4) << 16) |
           (static_cast<uint64_t>(512 >> 4) << 32) | (2ull << 62);
}

// A descriptor moved `bytes` further into shared memory (bytes a multiple of 16,
// the address field does not overflow: shared memory is under 256 KB).
__device__ __forceinline__ uint64_t advance_descriptor(uint64_t desc, uint32_t bytes) {
    return desc + (bytes >> 4);
}

// ---- warpgroup MMA (wgmma) ---------------------------------------------------------

// wgmma.fence: orders this thread's earlier register writes (accumulators, the
// A fragment) before the wgmma that reads them.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

// wgmma.commit_group: closes the group of wgmma issued since the last commit.
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

// wgmma.wait_group: waits until at most kPending committed groups are in flight.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// The accumulator fragment of one warp, [1][n8 blocks][4], seen as the flat
// register list a wgmma of N = 8 * kNTiles columns takes.
template <int kNTiles>
__device__ __forceinline__ float (&flat(float (&frag)[1][kNTiles][4]))[kNTiles * 4] {
    return reinterpret_cast<float(&)[kNTiles * 4]>(frag);
}

// Pins registers at this point of the program: the compiler may neither read
// an accumulator before the wgmma_wait that completes it nor move a write after
// the wgmma that reads it (the asynchronous MMA is invisible to it otherwise).
template <int kRegs>
__device__ __forceinline__ void pin_registers(float (&r)[kRegs]) {
#pragma unroll
    for (int i = 0; i < kRegs; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// The same for A fragments: keeps registers an issued wgmma still reads live
// (unreused) until this point, after the wait that completes it.
template <int kRows>
__device__ __forceinline__ void pin_registers(uint32_t (&r)[kRows][4]) {
#pragma unroll
    for (int i = 0; i < kRows; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

// The value, through an empty asm: what is derived from it (the descriptors of
// a GEMM's k16 steps) is computed again at each use rather than hoisted out of
// a loop and held in registers across it, where registers are scarcer than
// the few integer adds.
__device__ __forceinline__ uint64_t recompute_per_use(uint64_t v) {
    asm volatile("" : "+l"(v));
    return v;
}

// ---- generic writes that the async proxy reads ------------------------------

// st.shared.v4 of 16 zero bytes at a shared-memory address.
__device__ __forceinline__ void store_zero_16(uint32_t addr) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0) : "memory");
}

// st.shared.b32 / st.shared.f32 / st.shared.v2.f32 at a shared-memory address.
__device__ __forceinline__ void store_shared_b32(uint32_t addr, uint32_t v) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void store_shared_f32(uint32_t addr, float v) {
    asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}
__device__ __forceinline__ void store_shared_f32x2(uint32_t addr, float lo, float hi) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(lo), "f"(hi) : "memory");
}

// st.shared.v2.b64 / ld.shared.b64 at a shared-memory address (16- / 8-byte aligned).
__device__ __forceinline__ void store_shared_u64x2(uint32_t addr, uint64_t lo, uint64_t hi) {
    asm volatile("st.shared.v2.b64 [%0], {%1, %2};\n" ::"r"(addr), "l"(lo), "l"(hi) : "memory");
}
__device__ __forceinline__ uint64_t load_shared_u64(uint32_t addr) {
    uint64_t v;
    asm volatile("ld.shared.b64 %0, [%1];\n" : "=l"(v) : "r"(addr) : "memory");
    return v;
}

// ld.shared.f32 / ld.shared.v2.f32 at a shared-memory address (4- / 8-byte aligned).
__device__ __forceinline__ float load_shared_f32(uint32_t addr) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
    return v;
}
__device__ __forceinline__ float2 load_shared_f32x2(uint32_t addr) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
    return v;
}

// st.shared.v4.f32 / ld.shared.v4.f32 at a shared-memory address (16-byte aligned).
__device__ __forceinline__ void store_shared_f32x4(uint32_t addr, float a, float b, float c, float d) {
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(a), "f"(b), "f"(c), "f"(d)
                 : "memory");
}
__device__ __forceinline__ float4 load_shared_f32x4(uint32_t addr) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(addr)
                 : "memory");
    return v;
}

// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16: the warp loads four 8 x 8
// matrices of 16-bit elements, each transposed: lanes 8j .. 8j + 7 give the
// shared addresses of matrix j's rows (16 bytes each), and lane i receives in rj
// elements i / 4 of rows 2 (i % 4) and 2 (i % 4) + 1 of matrix j (low half, high
// half).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                                  uint32_t& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr)
                 : "memory");
}

// stmatrix.sync.aligned.m8n8.x4.shared.b16: the warp stores four 8 x 8 matrices
// of 16-bit elements. In matrix j (register rj) lane i holds row i / 4, elements
// 2 (i % 4) and 2 (i % 4) + 1 (an mma.m16n8 accumulator's pairs, packed);
// lanes 8j .. 8j + 7 give the shared addresses of matrix j's rows (16 bytes each).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
                 "r"(r2), "r"(r3)
                 : "memory");
}

// The same with .trans: matrix j is stored transposed, so that the row whose
// address lane 8j + r gives receives column r of the matrix as the lanes hold
// it (element r of every lane's row): a fragment with keys as rows lands with
// queries as rows.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                                  uint32_t r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0),
                 "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}

// stmatrix .x2 .trans: the same for two matrices (registers r0, r1; lanes 0 ..
// 15 give the rows' addresses).
__device__ __forceinline__ void stmatrix_x2_trans(uint32_t addr, uint32_t r0, uint32_t r1) {
    asm volatile("stmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [%0], {%1, %2};\n" ::"r"(addr), "r"(r0), "r"(r1)
                 : "memory");
}

// red.global.add.v4.f32: adds (a, b, c, d) to the four fp32 values at `addr`
// (16-byte aligned, global memory), without returning them (sm_90).
__device__ __forceinline__ void red_add_f32x4(float* addr, float a, float b, float c, float d) {
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(addr), "f"(a), "f"(b), "f"(c), "f"(d)
                 : "memory");
}

// fence.proxy.async: this thread's earlier shared-memory writes become visible
// to the async proxy (wgmma's operand reads, the copy engine) that is ordered
// after it (through a barrier).
__device__ __forceinline__ void fence_proxy_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// ---- named barriers ----------------------------------------------------------

// bar.sync: waits until `threads` threads (a multiple of 32; this warp's count
// included) have arrived at barrier `id` (1..15; 0 is __syncthreads').
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// barrier.sync without .aligned: the same wait, for a barrier whose blocking
// participants reach it through different barrier instructions (roles
// compiled apart, e.g. the backward's two consumer warpgroups: bwd_consumer
// instantiated per role). bar.sync is barrier.sync.aligned, which promises
// that all of a generation's blocking threads execute the same instruction;
// compute-sanitizer's synccheck reports "Divergent thread(s) in block" where
// they do not.
__device__ __forceinline__ void named_barrier_sync_unaligned(int id, int threads) {
    asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// bar.arrive: counts this warp's arrival at barrier `id` without waiting.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// cvt.rn.satfinite.e4m3x2.f32, twice: four fp32 values rounded to e4m3 (to
// nearest; beyond +-448 saturated to it) in one 32-bit register, `b0` in the
// lowest byte, `b3` in the highest.
__device__ __forceinline__ uint32_t pack4_e4m3(float b0, float b1, float b2, float b3) {
    uint32_t r;
    asm("{\n.reg .b16 lo, hi;\n"
        "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"
        "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
        "mov.b32 %0, {lo, hi};\n}\n"
        : "=r"(r)
        : "f"(b0), "f"(b1), "f"(b2), "f"(b3));
    return r;
}

// wgmma.mma_async m64nNk16 with fp32 accumulators d[N / 2] (the warpgroup's
// 64 x N tile; warp w holds rows 16w..16w+15 in the layout of mma.m16n8
// accumulators, n8 block j at d[4j..4j+3]). `ss`: A and B from shared memory
// (descriptors), K-major, or MN-major where kTransA / kTransB is 1 (the
// transpose bits; 16-bit types only). `rs`: A from registers (4 x 32 bits: the
// m16k16 A fragment of mma.m16n8k16), B from shared memory MN-major (the
// transpose bit).
// scale_d = 0 overwrites d, 1 accumulates.
template <int N>
struct Wgmma;

#define FLASH_ACC_8(i)                                                                                        \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
        "+f"(d[i + 7])

// The accumulator operands of m64nNk16, "%0" .. "%(N/2 - 1)", and their constraints.
#define FLASH_ACC_4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define FLASH_ACC_OPERANDS_40 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19"
#define FLASH_ACC_CONSTRAINTS_40 FLASH_ACC_8(0), FLASH_ACC_8(8), FLASH_ACC_4(16)
#define FLASH_ACC_OPERANDS_64                                                                                   \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
    "%23, %24, %25, %26, %27, %28, %29, %30, %31"
#define FLASH_ACC_CONSTRAINTS_64 FLASH_ACC_8(0), FLASH_ACC_8(8), FLASH_ACC_8(16), FLASH_ACC_8(24)
#define FLASH_ACC_OPERANDS_80 FLASH_ACC_OPERANDS_64 ", %32, %33, %34, %35, %36, %37, %38, %39"
#define FLASH_ACC_CONSTRAINTS_80 FLASH_ACC_CONSTRAINTS_64, FLASH_ACC_8(32)
#define FLASH_ACC_OPERANDS_96 FLASH_ACC_OPERANDS_80 ", %40, %41, %42, %43, %44, %45, %46, %47"
#define FLASH_ACC_CONSTRAINTS_96 FLASH_ACC_CONSTRAINTS_80, FLASH_ACC_8(40)
#define FLASH_ACC_OPERANDS_112 FLASH_ACC_OPERANDS_96 ", %48, %49, %50, %51, %52, %53, %54, %55"
#define FLASH_ACC_CONSTRAINTS_112 FLASH_ACC_CONSTRAINTS_96, FLASH_ACC_8(48)
#define FLASH_ACC_OPERANDS_128 FLASH_ACC_OPERANDS_112 ", %56, %57, %58, %59, %60, %61, %62, %63"
#define FLASH_ACC_CONSTRAINTS_128 FLASH_ACC_CONSTRAINTS_112, FLASH_ACC_8(56)
#define FLASH_ACC_OPERANDS_144 FLASH_ACC_OPERANDS_128 ", %64, %65, %66, %67, %68, %69, %70, %71"
#define FLASH_ACC_CONSTRAINTS_144 FLASH_ACC_CONSTRAINTS_128, FLASH_ACC_8(64)
#define FLASH_ACC_OPERANDS_160 FLASH_ACC_OPERANDS_144 ", %72, %73, %74, %75, %76, %77, %78, %79"
#define FLASH_ACC_CONSTRAINTS_160 FLASH_ACC_CONSTRAINTS_144, FLASH_ACC_8(72)
#define FLASH_ACC_OPERANDS_176 FLASH_ACC_OPERANDS_160 ", %80, %81, %82, %83, %84, %85, %86, %87"
#define FLASH_ACC_CONSTRAINTS_176 FLASH_ACC_CONSTRAINTS_160, FLASH_ACC_8(80)
#define FLASH_ACC_OPERANDS_192 FLASH_ACC_OPERANDS_176 ", %88, %89, %90, %91, %92, %93, %94, %95"
#define FLASH_ACC_CONSTRAINTS_192 FLASH_ACC_CONSTRAINTS_176, FLASH_ACC_8(88)
#define FLASH_ACC_OPERANDS_256                                                                                  \
    FLASH_ACC_OPERANDS_192                                                                                      \
    ", %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, " \
    "%114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define FLASH_ACC_CONSTRAINTS_256 \
    FLASH_ACC_CONSTRAINTS_192, FLASH_ACC_8(96), FLASH_ACC_8(104), FLASH_ACC_8(112), FLASH_ACC_8(120)

// SS: the operands after the accumulators are %R (desc_a), %R+1 (desc_b),
// %R+2 (scale_d), %R+3 and %R+4 (the transpose bits, immediates); RS: %R..%R+3
// (a), %R+4 (desc_b), %R+5 (scale_d); R = N / 2.
#define FLASH_WGMMA_SS_ASM(N, TYPE, R0, R1, R2, R3, R4)                                                      \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" R2 ", 0;\n"                                          \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " {" FLASH_ACC_OPERANDS_##N \
                 "}, %" R0 ", %" R1 ", p, 1, 1, %" R3 ", %" R4 ";\n}\n"                                      \
                 : FLASH_ACC_CONSTRAINTS_##N                                                                \
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransA), "n"(kTransB))
#define FLASH_WGMMA_RS_ASM(N, TYPE, R0, R1, R2, R3, R4, R5)                                                  \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" R5 ", 0;\n"                                          \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " {" FLASH_ACC_OPERANDS_##N \
                 "}, {%" R0 ", %" R1 ", %" R2 ", %" R3 "}, %" R4 ", p, 1, 1, 1;\n}\n"                       \
                 : FLASH_ACC_CONSTRAINTS_##N                                                                \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d))
// FP8 (e4m3): m64nNk32, both operands K-major (8-bit types have no transpose
// bits); the register A operand is the m16n8k32 A fragment of mma.sync
// (4 x 32 bits: row lane / 4 k 4 (lane % 4) .. + 3, row + 8 the same, then
// both again 16 further in k, the lowest k in the lowest byte).
#define FLASH_WGMMA_SS_FP8_ASM(N, R0, R1, R2)                                                                \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" R2 ", 0;\n"                                          \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 {" FLASH_ACC_OPERANDS_##N         \
                 "}, %" R0 ", %" R1 ", p, 1, 1;\n}\n"                                                       \
                 : FLASH_ACC_CONSTRAINTS_##N                                                                \
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d))
#define FLASH_WGMMA_RS_FP8_ASM(N, R0, R1, R2, R3, R4, R5)                                                    \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" R5 ", 0;\n"                                          \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 {" FLASH_ACC_OPERANDS_##N         \
                 "}, {%" R0 ", %" R1 ", %" R2 ", %" R3 "}, %" R4 ", p, 1, 1;\n}\n"                          \
                 : FLASH_ACC_CONSTRAINTS_##N                                                                \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d))
#define FLASH_DEFINE_WGMMA(N, R0, R1, R2, R3, R4, R5)                                                          \
    template <>                                                                                               \
    struct Wgmma<N> {                                                                                         \
        template <typename Element, int kTransA = 0, int kTransB = 0>                                         \
        __device__ __forceinline__ static void ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b,        \
                                                  int scale_d) {                                              \
            if constexpr (sizeof(Element) == 1) {                                                             \
                static_assert(kTransA == 0 && kTransB == 0, "8-bit operands are K-major");                    \
                FLASH_WGMMA_SS_FP8_ASM(N, R0, R1, R2);                                                        \
            } else if constexpr (std::is_same_v<Element, __nv_bfloat16>) {                                   \
                FLASH_WGMMA_SS_ASM(N, "bf16", R0, R1, R2, R3, R4);                                            \
            } else {                                                                                          \
                FLASH_WGMMA_SS_ASM(N, "f16", R0, R1, R2, R3, R4);                                             \
            }                                                                                                 \
        }                                                                                                     \
        template <typename Element>                                                                           \
        __device__ __forceinline__ static void rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, \
                                                  int scale_d) {                                              \
            if constexpr (sizeof(Element) == 1) {                                                             \
                FLASH_WGMMA_RS_FP8_ASM(N, R0, R1, R2, R3, R4, R5);                                            \
            } else if constexpr (std::is_same_v<Element, __nv_bfloat16>) {                                   \
                FLASH_WGMMA_RS_ASM(N, "bf16", R0, R1, R2, R3, R4, R5);                                        \
            } else {                                                                                          \
                FLASH_WGMMA_RS_ASM(N, "f16", R0, R1, R2, R3, R4, R5);                                         \
            }                                                                                                 \
        }                                                                                                     \
    };

FLASH_DEFINE_WGMMA(40, "20", "21", "22", "23", "24", "25")
FLASH_DEFINE_WGMMA(64, "32", "33", "34", "35", "36", "37")
FLASH_DEFINE_WGMMA(80, "40", "41", "42", "43", "44", "45")
FLASH_DEFINE_WGMMA(96, "48", "49", "50", "51", "52", "53")
FLASH_DEFINE_WGMMA(112, "56", "57", "58", "59", "60", "61")
FLASH_DEFINE_WGMMA(128, "64", "65", "66", "67", "68", "69")
FLASH_DEFINE_WGMMA(144, "72", "73", "74", "75", "76", "77")
FLASH_DEFINE_WGMMA(160, "80", "81", "82", "83", "84", "85")
FLASH_DEFINE_WGMMA(176, "88", "89", "90", "91", "92", "93")
FLASH_DEFINE_WGMMA(192, "96", "97", "98", "99", "100", "101")
FLASH_DEFINE_WGMMA(256, "128", "129", "130", "131", "132", "133")

#undef FLASH_DEFINE_WGMMA
#undef FLASH_WGMMA_RS_FP8_ASM
#undef FLASH_WGMMA_SS_FP8_ASM
#undef FLASH_WGMMA_RS_ASM
#undef FLASH_WGMMA_SS_ASM

}  // namespace flash::sm90
