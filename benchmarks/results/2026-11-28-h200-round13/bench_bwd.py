"""Backward-only timing of flashattn against SDPA's cuDNN backend and FlashAttention-4 (when it
imports: FLASHATTN_FA4_DIR, benchmarks/backends.py), one process, rounds interleaved (round 13; run
from the repository root on the GPU machine: python benchmarks/results/2026-11-28-h200-round13/bench_bwd.py 64 128 256).

Shapes as hopper.md's bar: bf16, B * S = 16k tokens, H * D = 2048. Each backend is timed three times
in turn (triton do_bench median) and keeps its best median; FLOPs 2.5 x 4 B H S^2 D, halved causal.
A backend that refuses a shape (or fails to compile it) leaves n/a in its cell."""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import flashattn
from benchmarks.backends import flash_attention_4

ROUNDS = 3
head_dims = [int(a) for a in sys.argv[1:]] or [128]
fa4, fa4_missing = flash_attention_4()
print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  family {flashattn.kernel_family()}  "
      f"FA4: {'imported' if fa4 is not None else fa4_missing}")
print("| d | S | causal | flashattn ms (TFLOP/s) | cuDNN ms (TFLOP/s) | FA4 ms (TFLOP/s) | ours / cuDNN | ours / FA4 |")
print("|---|---|---|---|---|---|---|---|")
for d in head_dims:
    heads = 2048 // d
    for seqlen in (2048, 8192):
        batch = 16384 // seqlen
        for causal in (False, True):
            q, k, v = (torch.randn(batch, seqlen, heads, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            dout = torch.randn_like(q)
            out = flashattn.flash_attn_func(q, k, v, causal=causal)
            fns = {"ours": lambda out=out: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)}
            qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
            try:
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    o2 = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                fns["cudnn"] = lambda o2=o2: torch.autograd.grad(o2, (qt, kt, vt), dout.transpose(1, 2),
                                                                 retain_graph=True)
            except RuntimeError as exc:
                print(f"cuDNN d{d} S{seqlen} causal={causal}: {exc}", file=sys.stderr)
            if fa4 is not None:
                q4, k4, v4 = (x.detach().clone().requires_grad_() for x in (q, k, v))
                try:
                    o4 = fa4(q4, k4, v4, softmax_scale=d**-0.5, causal=causal)
                    o4 = o4[0] if isinstance(o4, tuple) else o4
                    torch.autograd.grad(o4, (q4, k4, v4), dout, retain_graph=True)  # compiles its backward
                    fns["fa4"] = lambda o4=o4, q4=q4, k4=k4, v4=v4: torch.autograd.grad(o4, (q4, k4, v4), dout,
                                                                                       retain_graph=True)
                except Exception as exc:  # a shape it refuses
                    print(f"FA4 d{d} S{seqlen} causal={causal}: {type(exc).__name__}: {exc}"[:300], file=sys.stderr)
            best = {}
            for _ in range(ROUNDS):
                for name, fn in fns.items():
                    ms = do_bench(fn, warmup=10, rep=50, return_mode="median")
                    best[name] = min(best.get(name, ms), ms)
            flops = 2.5 * 4 * batch * heads * seqlen * seqlen * d / (2 if causal else 1)
            cell = lambda n: f"{best[n]:.3f} ({flops / best[n] / 1e9:.0f})" if n in best else "n/a"
            ratio = lambda n: f"{best[n] / best['ours']:.2f}x" if n in best else "n/a"
            print(f"| {d} | {seqlen} | {'yes' if causal else 'no'} | {cell('ours')} | {cell('cudnn')} | "
                  f"{cell('fa4')} | {ratio('cudnn')} | {ratio('fa4')} |", flush=True)
            del fns, q, k, v, out
            torch.cuda.empty_cache()
