"""Where decoding time goes outside the kernels: one decode call (batch 1, H = 32, Hk = 8, D = 128,
bf16) timed three ways, for flashattn and SDPA: do_bench (an L2 flush before each call, as
benchmarks/decode.py times), 50 calls back to back between two events, and 20 calls replayed from a
CUDA graph (launch cost gone). Prints the header and one line per (cache length, implementation);
needs a GPU and triton.

    python -m benchmarks decode-overhead
"""
import sys

import torch
import torch.nn.functional as F

from benchmarks.environment import gpu_header, header_lines

PROG = "python -m benchmarks decode-overhead"
HELP = "GPU: one decode call timed by do_bench, back to back and from a CUDA graph (prints only)"
HEADS, HEAD_DIM = 32, 128
BACK_TO_BACK_CALLS = 50
GRAPH_CALLS = 20


def add_arguments(parser):
    pass


def run(args):
    if not torch.cuda.is_available():
        print(f"{PROG}: needs a CUDA GPU", file=sys.stderr)
        return 2
    from triton.testing import do_bench

    from flashattn import flash_attn_with_kvcache

    print("\n".join(header_lines(gpu_header("triton.testing.do_bench mean (warmup 25 ms, rep 100 ms)"))), flush=True)
    torch.manual_seed(0)
    for heads_k, seqlen in ((8, 65536), (8, 262144)):
        q = torch.randn(1, 1, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, seqlen, heads_k, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        cache_seqlens = torch.full((1,), seqlen, dtype=torch.int32, device="cuda")
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        fns = {"flashattn": lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=cache_seqlens),
               "sdpa": lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)}
        for name, fn in fns.items():
            eager = do_bench(fn, warmup=25, rep=100)
            loop = back_to_back_ms(fn)
            graph = captured(fn)
            replay = do_bench(lambda: graph.replay(), warmup=25, rep=100) / GRAPH_CALLS
            print(f"Hk={heads_k} S={seqlen} {name}: do_bench {eager * 1e3:.1f} us, "
                  f"back-to-back {loop * 1e3:.1f} us, graph {replay * 1e3:.1f} us", flush=True)
    return 0


def back_to_back_ms(fn):
    """Milliseconds per call of BACK_TO_BACK_CALLS calls queued between two events."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(BACK_TO_BACK_CALLS):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / BACK_TO_BACK_CALLS


def captured(fn):
    """A CUDA graph of GRAPH_CALLS calls of fn, after a warm-up on a side stream (as capture requires)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_CALLS):
            fn()
    return graph
