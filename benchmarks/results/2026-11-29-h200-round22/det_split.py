"""deterministic=True on the sm90 split backward (head dims 192 and 256, MLA's (192, 128)): its
gradients against the default (atomic) mode's and the fp32 reference's, then its time against the
default's (bf16, B * S = 16k, H * D = 2048; MLA H 16). Run with the built tree on PYTHONPATH."""
import torch
from triton.testing import do_bench

from flashattn import flash_attn_func
from flashattn.reference import attention_ref


def grads(q, k, v, dout, causal, deterministic):
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out = flash_attn_func(*leaves, causal=causal, deterministic=deterministic)
    return torch.autograd.grad(out, leaves, dout)


def reference(q, k, v, dout, causal):
    leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
    out = attention_ref(*leaves, causal=causal)
    out = out[0] if isinstance(out, tuple) else out
    return torch.autograd.grad(out, leaves, dout.float())


gen = torch.Generator("cuda").manual_seed(0)
for d, dv, causal in ((256, 256, False), (256, 256, True), (192, 128, True), (200, 200, False)):
    q = torch.randn(2, 1000, 4, d, generator=gen, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 777, 2, d, generator=gen, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 777, 2, dv, generator=gen, device="cuda", dtype=torch.bfloat16)
    dout = torch.randn(2, 1000, 4, dv, generator=gen, device="cuda", dtype=torch.bfloat16)
    det, atomic, ref = (grads(q, k, v, dout, causal, True), grads(q, k, v, dout, causal, False),
                        reference(q, k, v, dout, causal))
    for name, a, b, r in zip(("dq", "dk", "dv"), det, atomic, ref):
        print(f"d{d}/{dv} causal={causal} {name}: |det - ref| {(a.float() - r).abs().max().item():.3g}, "
              f"|atomic - ref| {(b.float() - r).abs().max().item():.3g}, |det - atomic| "
              f"{(a.float() - b.float()).abs().max().item():.3g}", flush=True)

TOKENS, WIDTH = 16384, 2048
for d, dv in ((256, 256), (192, 128), (192, 192)):
    for seqlen in (2048, 8192):
        for causal in (False, True):
            heads = WIDTH // d if dv == d else 16
            q = torch.randn(TOKENS // seqlen, seqlen, heads, d, generator=gen, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(q.shape, generator=gen, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(*q.shape[:3], dv, generator=gen, device="cuda", dtype=torch.bfloat16)
            dout = torch.randn(*q.shape[:3], dv, generator=gen, device="cuda", dtype=torch.bfloat16)
            leaves = [x.requires_grad_() for x in (q, k, v)]
            ms = {}
            for det in (False, True):
                out = flash_attn_func(*leaves, causal=causal, deterministic=det)
                fn = lambda out=out: torch.autograd.grad(out, leaves, dout, retain_graph=True)
                ms[det] = min(do_bench(fn, warmup=10, rep=60, return_mode="median") for _ in range(2))
            flops = 2.5 * 4 * q.shape[0] * heads * seqlen**2 * (d + dv) / 2 / (2 if causal else 1)
            print(f"d{d}/{dv} S{seqlen} causal={causal}: default {flops / ms[False] / 1e9:.0f} TFLOP/s, "
                  f"deterministic {flops / ms[True] / 1e9:.0f} ({ms[True] / ms[False]:.2f}x the time)", flush=True)
