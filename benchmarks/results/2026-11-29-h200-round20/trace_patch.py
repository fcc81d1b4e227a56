# Adds clock64 stamps of block (10,5,0)'s d128 split consumer steps to a tree's bwd_kernel.cuh (trace builds only).
import sys
root = sys.argv[1]
p = root + '/csrc/sm90/bwd_kernel.cuh'
s = open(p).read()
def rep(old, new, count=1):
    global s
    assert s.count(old) >= 1, old
    s = s.replace(old, new, count)
rep('''namespace flash::sm90 {

// The shared-memory addresses''', '''namespace flash::sm90 {

static __device__ long long g_bwd_trace[2][160][20];
static __device__ int g_bwd_trace_launch;
static __device__ int g_bwd_trace_printed;

static __global__ void bwd_trace_print(int steps) {
    if (g_bwd_trace_launch < 4 || g_bwd_trace_printed) return;
    g_bwd_trace_printed = 1;
    const long long t0 = g_bwd_trace[0][0][0];
    for (int c = 0; c < 2; ++c)
        for (int t = 0; t < steps && t < 160; ++t) {
            printf("TRACE c%d t%d", c, t);
            for (int id = 0; id < 20; ++id) printf(" %lld", g_bwd_trace[c][t][id] ? g_bwd_trace[c][t][id] - t0 : -1);
            printf("\\n");
        }
}

// The shared-memory addresses''')
rep('#include <cstdint>\n', '#include <cstdint>\n#include <cstdio>\n')
rep('''    const BwdWork<Traits, Is_local, Is_deterministic> work(params);
    const int n0 = work.n_block * kBlockN;
    const int thread_in_group = threadIdx.x % 128;''', '''    const BwdWork<Traits, Is_local, Is_deterministic> work(params);
    const int n0 = work.n_block * kBlockN;
    const int thread_in_group = threadIdx.x % 128;
    const bool traced = Traits::kDqSplit && blockIdx.x == 10 && blockIdx.y == 5 && blockIdx.z == 0 &&
                        *(volatile int*)&g_bwd_trace_launch == 3;
#define TR(id, t)                                                                                          \\
    do {                                                                                                   \\
        if (traced && thread_in_group == 0 && (t) < 160) g_bwd_trace[consumer][(t)][(id)] = clock64(); \\
    } while (0)''')
# scores
rep('''        wgmma_wait<1>();
        pin_registers(flat(s));
        if constexpr (Has_softcap) cap_scores(s);''', '''        wgmma_wait<1>();
        TR(13, t);
        pin_registers(flat(s));
        if constexpr (Has_softcap) cap_scores(s);''')
rep('''        wgmma_wait<0>();
        pin_registers(flat(dp));
        if constexpr (Has_softcap && Traits::kSoftcapChainInScores) softcap_chain(st.stage, s, dp);
        if constexpr (kDsInScores) finish_ds(st.stage, s, dp);''', '''        TR(14, t);
        wgmma_wait<0>();
        TR(15, t);
        pin_registers(flat(dp));
        if constexpr (Has_softcap && Traits::kSoftcapChainInScores) softcap_chain(st.stage, s, dp);
        if constexpr (kDsInScores) finish_ds(st.stage, s, dp);
        TR(16, t);''')
# gradients
rep('''        if constexpr (Traits::kDqSplit) wgmma_commit();''', '''        if constexpr (Traits::kDqSplit) wgmma_commit();
        TR(1, t);''')
rep('''        store_ds(ds_frag, ds_smem);''', '''        store_ds(ds_frag, ds_smem);
        TR(2, t);''')
rep('''        named_barrier_sync_unaligned(kDsBarrier, kConsumerThreads);
    };''', '''        named_barrier_sync_unaligned(kDsBarrier, kConsumerThreads);
        TR(4, t);
    };''')
# reduce_dq
rep('''    auto reduce_dq = [&](int t, float (&dq)[1][Traits::kNTilesDq][4]) {
        pin_registers(flat(dq));''', '''    auto reduce_dq = [&](int t, float (&dq)[1][Traits::kNTilesDq][4]) {
        pin_registers(flat(dq));
        TR(5, t);''')
rep('''            bulk_commit_group();
        }
    };''', '''            bulk_commit_group();
        }
        TR(11, t);
    };''')
rep('''            gradients_done(t, p_frag, ds_frag);''', '''            TR(7, t);
            gradients_done(t, p_frag, ds_frag);''')
rep('''            gradients(t, s, dp, p_frag, ds_frag);''', '''            TR(0, t);
            gradients(t, s, dp, p_frag, ds_frag);''')
rep('''            wait_tiles(t + 1);''', '''            wait_tiles(t + 1);
            TR(8, t);''')
rep('''    // Epilogue: dK takes the softmax scale; each thread writes its pairs of
    // columns of its two key rows''', '''    if (Traits::kDqSplit && consumer == 0 && thread_in_group == 0 && blockIdx.x == 10 && blockIdx.y == 5 &&
        blockIdx.z == 0) {
        atomicAdd(&g_bwd_trace_launch, 1);
    }
#undef TR
    // Epilogue: dK takes the softmax scale; each thread writes its pairs of
    // columns of its two key rows''')
open(p, 'w').write(s)
p = root + '/csrc/sm90/bwd_launch.cuh'
s = open(p).read()
rep('''        err = cudaGetLastError();
        if (err != cudaSuccess) return err;
    }''', '''        err = cudaGetLastError();
        if (err != cudaSuccess) return err;
        if (Traits::kDqSplit) bwd_trace_print<<<1, 1, 0, stream>>>((params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM);
    }''')
open(p, 'w').write(s)
print('patched', root)
