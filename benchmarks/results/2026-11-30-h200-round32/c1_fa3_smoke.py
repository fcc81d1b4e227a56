"""Round 32, call 1: does scripts/stage_fa3.sh's FlashAttention-3 library compute attention? Its forward
(bf16 and FP8) and bf16 backward against the fp32 reference on small awkward shapes, each error printed
beside the error of our own kernel on the same data (the same call in bf16, or the FP8 call), then one
timed FP8 d128 S 8k call of each for a first read. Not a test: a check that the ctypes driver fills
FA3's parameters right before any of its figures are used."""
import torch

from benchmarks.backends import flash_attention_3
from flashattn import flash_attn_func
from flashattn.reference import attention_ref

fa3, why = flash_attention_3()
assert fa3 is not None, why
torch.manual_seed(0)


def err(a, b):
    return (a.float() - b.float()).abs().max().item()


for d in (64, 128, 256):
    for s, causal in ((1000, False), (1000, True), (333, True)):
        q, k, v, do = (torch.randn(2, s, 4, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        for t in (q, k, v):
            t.requires_grad_()
        ref = attention_ref(q, k, v, causal=causal, upcast=True)[0]
        g_ref = torch.autograd.grad(ref, (q, k, v), do)
        ours = flash_attn_func(q, k, v, causal=causal)
        g_ours = torch.autograd.grad(ours, (q, k, v), do)
        out3, lse3 = fa3.forward(q, k, v, causal, d**-0.5)
        g3 = fa3.backward(do, q, k, v, out3, lse3, causal, d**-0.5)
        print(f"bf16 d{d} S {s} causal={causal}: out fa3 {err(out3, ref):.2e} ours {err(ours, ref):.2e}; "
              + ", ".join(f"{n} fa3 {err(a, r):.2e} ours {err(b, r):.2e}"
                          for n, a, b, r in zip(("dq", "dk", "dv"), g3, g_ours, g_ref)), flush=True)
        # FP8: per-(batch, head) descales, as benchmarks/fp8.py quantises
        stored, scales = [], {}
        for name, t in zip(("q_descale", "k_descale", "v_descale"), (q, k, v)):
            descale = t.detach().float().abs().amax(dim=(1, 3)) / 448.0
            stored.append((t.detach().float() / descale[:, None, :, None]).to(torch.float8_e4m3fn))
            scales[name] = descale
        deq = [(x.float() * sc[:, None, :, None]) for x, sc in zip(stored, scales.values())]
        ref8 = attention_ref(*deq, causal=causal, upcast=True)[0]
        ours8 = flash_attn_func(*stored, causal=causal, **scales)
        fa3_8 = fa3.forward(*stored, causal, d**-0.5, scales)[0]
        print(f"  fp8 d{d} S {s} causal={causal}: fa3 {err(fa3_8, ref8):.2e} ours {err(ours8, ref8):.2e}",
              flush=True)

q, k, v = (torch.randn(2, 8192, 16, 128, device="cuda").to(torch.float8_e4m3fn) for _ in range(3))
ones = {n: torch.ones(2, 16, device="cuda") for n in ("q_descale", "k_descale", "v_descale")}
flops = 4 * 2 * 16 * 8192**2 * 128
for name, fn in (("ours", lambda: flash_attn_func(q, k, v, **ones)),
                 ("fa3", lambda: fa3.forward(q, k, v, False, 128**-0.5, ones))):
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(30):
        fn()
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / 30
    print(f"FP8 d128 S 8192 B 2 H 16 non-causal, {name}: {ms:.3f} ms, {flops / ms / 1e9:.0f} TFLOP/s", flush=True)
