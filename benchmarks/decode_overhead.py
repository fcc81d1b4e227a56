"""Where decoding time goes outside the kernels: one decode call (batch 1, H = 32, Hk = 8, D = 128,
bf16) timed three ways, for flashattn and SDPA: do_bench (an L2 flush before each call, as
bench_decode.py times), 50 calls back to back between two events, and 20 calls replayed from a
CUDA graph (launch cost gone). Prints one line per (cache length, implementation); needs a GPU.

    python benchmarks/decode_overhead.py
"""
import sys

import torch
import torch.nn.functional as F

from flashattn import flash_attn_with_kvcache


def main() -> int:
    if not torch.cuda.is_available():
        print("decode_overhead.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    from triton.testing import do_bench

    torch.manual_seed(0)
    for Hk, S in ((8, 65536), (8, 262144)):
        q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, S, Hk, 128, device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
        sl = torch.full((1,), S, dtype=torch.int32, device="cuda")
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        fns = {"flashattn": lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=sl),
               "sdpa": lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)}
        for name, fn in fns.items():
            eager = do_bench(fn, warmup=25, rep=100)
            fn(); torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(50): fn()
            b.record(); torch.cuda.synchronize()
            loop = a.elapsed_time(b) / 50
            s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3): fn()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(20): fn()
            graph = do_bench(lambda: g.replay(), warmup=25, rep=100) / 20
            print(f"Hk={Hk} S={S} {name}: do_bench {eager*1e3:.1f} us, back-to-back {loop*1e3:.1f} us, graph {graph*1e3:.1f} us", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
