"""The workload compute-sanitizer ran over the sm90 backward in round 11 (README.md here)."""
import torch

from flashattn import flash_attn_func, flash_attn_varlen_func
torch.manual_seed(0)
n = 0
for dtype in (torch.float16, torch.bfloat16):
    for (d, dv), causal, opts in [((128, 128), False, {}), ((192, 192), False, {}), ((192, 128), True, {}), ((256, 256), False, {"softcap": 5.0, "window_size": (40, 7)}),
                                  ((160, 160), True, {}), ((136, 72), False, {"softcap": 3.0})]:
        q = torch.randn(2, 300, 4, d, device="cuda", dtype=dtype, requires_grad=True)
        k = torch.randn(2, 211, 2, d, device="cuda", dtype=dtype, requires_grad=True)
        v = torch.randn(2, 211, 2, dv, device="cuda", dtype=dtype, requires_grad=True)
        out = flash_attn_func(q, k, v, causal=causal, **opts)
        out.backward(torch.randn_like(out))
        n += 1
    for d in (192, 224):
        q = torch.randn(450, 4, d, device="cuda", dtype=dtype, requires_grad=True)
        k, v = (torch.randn(450, 2, d, device="cuda", dtype=dtype, requires_grad=True) for _ in range(2))
        cu = torch.tensor([0, 150, 450], device="cuda", dtype=torch.int32)
        out = flash_attn_varlen_func(q, k, v, cu, cu, 300, 300, causal=True, seqused_q=torch.tensor([120, 280], device="cuda", dtype=torch.int32),
                                     seqused_k=torch.tensor([140, 260], device="cuda", dtype=torch.int32))
        out.backward(torch.randn_like(out))
        n += 1
torch.cuda.synchronize()
print(f"split backward sanitize workload: {n} backward calls completed")
