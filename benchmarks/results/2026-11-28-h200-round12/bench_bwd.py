"""Backward-only timing of flashattn against SDPA's cuDNN and flash backends, one process, rounds
interleaved (round 12; run from the repository root on the GPU machine:
python benchmarks/results/2026-11-28-h200-round12/bench_bwd.py 128 64).

Shapes as hopper.md's bar: bf16, B * S = 16k tokens, H * D = 2048. Each backend is timed three times
in turn (triton do_bench median) and keeps its best median; FLOPs 2.5 x 4 B H S^2 D, halved causal."""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import flashattn

ROUNDS = 3
head_dims = [int(a) for a in sys.argv[1:]] or [128]
print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  family {flashattn.kernel_family()}  {flashattn.__file__}")
print("| d | S | causal | flashattn ms (TFLOP/s) | cuDNN ms (TFLOP/s) | flash ms | ours / cuDNN | ours / flash |")
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
            qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
            fns = {"ours": lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)}
            for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
                try:
                    with sdpa_kernel(backend):
                        o2 = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                    fns[name] = (lambda o2=o2: torch.autograd.grad(o2, (qt, kt, vt), dout.transpose(1, 2),
                                                                  retain_graph=True))
                except RuntimeError:
                    pass
            best = {}
            for _ in range(ROUNDS):
                for name, fn in fns.items():
                    ms = do_bench(fn, warmup=10, rep=50, return_mode="median")
                    best[name] = min(best.get(name, ms), ms)
            flops = 2.5 * 4 * batch * heads * seqlen * seqlen * d / (2 if causal else 1)
            cell = lambda n: f"{best[n]:.3f} ({flops / best[n] / 1e9:.0f})" if n in best else "n/a"
            ratio = lambda n: f"{best[n] / best['ours']:.2f}x" if n in best else "n/a"
            print(f"| {d} | {seqlen} | {'yes' if causal else 'no'} | {cell('ours')} | {cell('cudnn')} | "
                  f"{cell('flash')} | {ratio('cudnn')} | {ratio('flash')} |", flush=True)
            del q, k, v, out, o2, qt, kt, vt
