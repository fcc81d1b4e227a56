// The KV-cache index check (its kernel here, the one place that launches it)
// and the append (and rotary) launch, whose kernel is in kvcache.cuh.
#include <cstdio>

#include "flash.h"
#include "kvcache.cuh"
#include "static_switch.h"

namespace flash {

// The index tensors' ranges, before any kernel reads through them: a value out
// of range prints which argument and traps (the stream stops; the error
// surfaces at the next synchronisation as a launch failure). One block; the
// threads stride over the batch and the used block-table entries.
__global__ void __launch_bounds__(256) kvcache_check_kernel(const AppendParams p, int capacity, int num_cache_rows) {
    for (int b = threadIdx.x; b < p.batch; b += blockDim.x) {
        const int seqlen = p.cache_seqlens[b];
        const int end = seqlen + p.seqlen_knew;
        if (seqlen < 0 || end > capacity) {
            printf("flashattn: cache_seqlens[%d] + seqlen_new = %d is outside the cache's %d rows\n", b, end, capacity);
            __trap();
        }
        if (p.leftpad_k != nullptr && (p.leftpad_k[b] < 0 || p.leftpad_k[b] > end)) {
            printf("flashattn: cache_leftpad[%d] = %d is outside [0, cache_seqlens + seqlen_new = %d]\n", b,
                   p.leftpad_k[b], end);
            __trap();
        }
        if (p.kv_batch_idx != nullptr && (p.kv_batch_idx[b] < 0 || p.kv_batch_idx[b] >= num_cache_rows)) {
            printf("flashattn: cache_batch_idx[%d] = %d is outside [0, %d)\n", b, p.kv_batch_idx[b], num_cache_rows);
            __trap();
        }
        if (p.block_table != nullptr) {
            for (int j = 0; j * p.page_size < end; ++j) {
                const int page = p.block_table[b * p.block_table_batch_stride + j];
                if (page < 0 || page >= num_cache_rows) {
                    printf("flashattn: block_table[%d][%d] = %d is outside [0, num_blocks = %d)\n", b, j, page,
                           num_cache_rows);
                    __trap();
                }
            }
        }
    }
}


cudaError_t run_kvcache_check(const AppendParams& params, int capacity, int num_cache_rows, cudaStream_t stream) {
    kvcache_check_kernel<<<1, 256, 0, stream>>>(params, capacity, num_cache_rows);
    return cudaGetLastError();
}

cudaError_t run_kvcache_append(const AppendParams& params, cudaStream_t stream) {
    const int64_t pairs = params.head_dim / 2;
    const int64_t threads =
        static_cast<int64_t>(params.batch) * params.seqlen_knew * params.num_heads_k * pairs +
        (params.q_rot_ptr == nullptr ? 0 : static_cast<int64_t>(params.batch) * params.seqlen_q * params.num_heads * pairs);
    if (threads == 0) return cudaSuccess;
    return FLASH_DTYPE_SWITCH(params.dtype, Element, [&] {
        kvcache_append_kernel<Element><<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream>>>(params);
        return cudaGetLastError();
    });
}

}  // namespace flash
