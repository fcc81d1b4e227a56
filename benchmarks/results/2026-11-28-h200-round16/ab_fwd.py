# One variant's 16-bit forward rows (run from the repository root, the variant's tree first on
# PYTHONPATH): AB_CHECK=1 first checks awkward shapes against an fp32 reference (and prints
# cuDNN's error beside ours); then TFLOP/s of ours and of cuDNN (SDPA) on the families
# benchmark's shapes (bf16, B * S = 16384, H * D = 2048), best of 3 x 10 calls each.
import math, os, sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import flashattn as _fa
from flashattn import flash_attn_func
print("flashattn from", _fa.__file__, flush=True)
dev = os.environ.get("AB_DEVICE", "cuda")
ROWS = os.environ.get("AB_ROWS", "64,128,256")

def ref(q, k, v, causal, dtype=torch.float32):
    """Attention in `dtype` (fp32: the reference; bf16: PyTorch's own same-dtype error)."""
    qf, kf, vf = (t.to(dtype).transpose(1, 2) for t in (q, k, v))
    Sq, Sk = qf.shape[2], kf.shape[2]
    s = (qf @ kf.transpose(-1, -2)).float() / math.sqrt(q.shape[-1])
    if causal:  # bottom-right
        i = torch.arange(Sq, device=dev)[:, None]; j = torch.arange(Sk, device=dev)[None]
        s = s.masked_fill(j > i + Sk - Sq, float("-inf"))
    return (s.softmax(-1).to(dtype) @ vf).float().transpose(1, 2)

def check(B, Sq, Sk, H, D, causal):
    q = torch.randn(B, Sq, H, D, device=dev, dtype=torch.bfloat16)
    k, v = (torch.randn(B, Sk, H, D, device=dev, dtype=torch.bfloat16) for _ in range(2))
    o = torch.full_like(q, float("nan"))
    o.copy_(flash_attn_func(q, k, v, causal=causal))
    r = ref(q, k, v, causal)
    m = ref(q, k, v, causal, torch.bfloat16).to(torch.bfloat16)
    e = (o.float() - r).abs().max().item(); em = (m.float() - r).abs().max().item()
    print(f"check D{D} {Sq}x{Sk} causal={causal}: ours {e:.5f} torch-bf16 {em:.5f} nan {torch.isnan(o).any().item()} "
          f"{'OK' if e <= 3 * em + 1e-4 else 'BAD'}", flush=True)

if os.environ.get("AB_CHECK", "1") == "1":
    for D in (int(d) for d in ROWS.split(",")):
        for args in ((2, 1000, 1000, 3, D, True), (1, 777, 1531, 2, D, True), (2, 1531, 1531, 2, D, False),
                     (1, 300, 2100, 2, D, False), (1, 2049, 2049, 2, D, True)):
            try:
                check(*args)
            except Exception as e:
                print("check failed:", args, str(e)[:200], flush=True)

def best(fn):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    b = 1e9
    for _ in range(3):
        st = torch.cuda.Event(enable_timing=True); en = torch.cuda.Event(enable_timing=True)
        st.record()
        for _ in range(10): fn()
        en.record(); torch.cuda.synchronize()
        b = min(b, st.elapsed_time(en) / 10)
    return b

if dev != "cuda": sys.exit(0)
line = "RATES"
for D in (int(d) for d in ROWS.split(",")):
    H = 2048 // D
    for S in (2048, 8192):
        B = 16384 // S
        q, k, v = (torch.randn(B, S, H, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        for causal in (False, True):
            flops = 4 * B * H * S * S * D / (2 if causal else 1)
            ours = flops / best(lambda: flash_attn_func(q, k, v, causal=causal)) / 1e9
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                cud = flops / best(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)) / 1e9
            tag = f"d{D}-{S // 1024}k{'c' if causal else ''}"
            line += f" {tag}={ours:.0f}/{ours / cud:.3f}"
print(line, flush=True)
