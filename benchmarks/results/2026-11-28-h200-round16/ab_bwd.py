# One variant's backward rows (run from the repository root, the variant's tree first on
# PYTHONPATH): AB_CHECK=1 first checks dq, dk, dv of awkward causal shapes against an fp32
# reference (PyTorch's bf16 error beside); then TFLOP/s of ours and of cuDNN (SDPA) for the
# backward alone (autograd.grad of a saved forward), bf16, B * S = 16384, H * D = 2048, best of
# 3 x 10 calls. FLOPs 2.5 x 4 B H S^2 D, halved causal.
import math, os, sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import flashattn as _fa
from flashattn import flash_attn_func
print("flashattn from", _fa.__file__, flush=True)
dev = "cuda"
ROWS = os.environ.get("AB_ROWS", "64,128,256")

def ref(q, k, v, causal, dtype=torch.float32):
    qf, kf, vf = (t.to(dtype).transpose(1, 2) for t in (q, k, v))
    Sq, Sk = qf.shape[2], kf.shape[2]
    s = (qf @ kf.transpose(-1, -2)).float() / math.sqrt(q.shape[-1])
    if causal:
        i = torch.arange(Sq, device=dev)[:, None]; j = torch.arange(Sk, device=dev)[None]
        s = s.masked_fill(j > i + Sk - Sq, float("-inf"))
    return (s.softmax(-1).to(dtype) @ vf).float().transpose(1, 2)

def grads(fn, q, k, v, do):
    qs, ks, vs = (t.detach().clone().requires_grad_() for t in (q, k, v))
    return torch.autograd.grad(fn(qs, ks, vs), (qs, ks, vs), do)

def check(B, Sq, Sk, H, Hk, D, causal):
    q = torch.randn(B, Sq, H, D, device=dev, dtype=torch.bfloat16)
    k, v = (torch.randn(B, Sk, Hk, D, device=dev, dtype=torch.bfloat16) for _ in range(2))
    do = torch.randn(B, Sq, H, D, device=dev, dtype=torch.bfloat16)
    rep = lambda t: t.repeat_interleave(H // Hk, dim=2)
    ours = grads(lambda a, b, c: flash_attn_func(a, b, c, causal=causal), q, k, v, do)
    r = grads(lambda a, b, c: ref(a.float(), rep(b.float()), rep(c.float()), causal), q, k, v, do.float())
    m = grads(lambda a, b, c: ref(a, rep(b), rep(c), causal, torch.bfloat16), q, k, v, do)
    msg = []
    ok = True
    for n, o, rr, mm in zip("qkv", ours, r, m):
        e = (o.float() - rr.float()).abs().max().item(); em = (mm.float() - rr.float()).abs().max().item()
        ok &= e <= 3 * em + 1e-4
        msg.append(f"d{n} {e:.4f}/{em:.4f}")
    print(f"check D{D} {Sq}x{Sk} H{H}/{Hk} causal={causal}: ours/torch-bf16 " + " ".join(msg) + (" OK" if ok else " BAD"),
          flush=True)

if os.environ.get("AB_CHECK", "1") == "1":
    for D in (int(d) for d in ROWS.split(",")):
        for args in ((2, 1000, 1000, 4, 2, D, True), (1, 777, 1531, 2, 2, D, True), (1, 1531, 1531, 3, 1, D, False),
                     (3, 2049, 2049, 2, 2, D, True)):
            try:
                check(*args)
            except Exception as e:
                print("check failed:", args, str(e)[:200], flush=True)

def best(fn):
    for _ in range(3): fn()
    torch.cuda.synchronize(); b = 1e9
    for _ in range(3):
        st = torch.cuda.Event(enable_timing=True); en = torch.cuda.Event(enable_timing=True)
        st.record()
        for _ in range(10): fn()
        en.record(); torch.cuda.synchronize(); b = min(b, st.elapsed_time(en) / 10)
    return b

line = "RATES"
for D in (int(d) for d in ROWS.split(",")):
    H = 2048 // D
    for S in (2048, 8192):
        B = 16384 // S
        for causal in (False, True):
            q, k, v = (torch.randn(B, S, H, D, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
            do = torch.randn_like(q)
            out = flash_attn_func(q, k, v, causal=causal)
            qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                o2 = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            flops = 2.5 * 4 * B * H * S * S * D / (2 if causal else 1)
            ours = flops / best(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)) / 1e9
            cud = flops / best(lambda: torch.autograd.grad(o2, (qt, kt, vt), do.transpose(1, 2), retain_graph=True)) / 1e9
            line += f" d{D}-{S // 1024}k{'c' if causal else ''}={ours:.0f}/{ours / cud:.3f}"
            del out, o2, q, k, v, qt, kt, vt
            torch.cuda.empty_cache()
print(line, flush=True)
