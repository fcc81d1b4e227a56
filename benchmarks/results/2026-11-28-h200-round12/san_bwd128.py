"""The workload compute-sanitizer ran over the sm90 d128 backward's 80-query split kernel in round 12:
every variant (plain, causal, window, softcap), both dtypes, head dims 128, 96 and 72 (padded onto
it), GQA, a partial last query tile, cut variable-length batches, and a call long enough that every
stage, dS buffer and dQ staging tile is reused many times."""
import torch

from flashattn import flash_attn_func, flash_attn_varlen_func

torch.manual_seed(0)
n = 0
for dtype in (torch.float16, torch.bfloat16):
    for d, causal, opts in [(128, False, {}), (128, True, {}), (96, False, {"window_size": (50, 9)}),
                            (72, True, {"softcap": 4.0}), (128, False, {"softcap": 3.0, "window_size": (90, 30)})]:
        q = torch.randn(2, 300, 4, d, device="cuda", dtype=dtype, requires_grad=True)
        k, v = (torch.randn(2, 211, 2, d, device="cuda", dtype=dtype, requires_grad=True) for _ in range(2))
        out = flash_attn_func(q, k, v, causal=causal, **opts)
        out.backward(torch.randn_like(out))
        n += 1
    q = torch.randn(450, 4, 128, device="cuda", dtype=dtype, requires_grad=True)
    k, v = (torch.randn(450, 2, 128, device="cuda", dtype=dtype, requires_grad=True) for _ in range(2))
    cu = torch.tensor([0, 150, 450], device="cuda", dtype=torch.int32)
    out = flash_attn_varlen_func(q, k, v, cu, cu, 300, 300, causal=True,
                                 seqused_q=torch.tensor([120, 280], device="cuda", dtype=torch.int32),
                                 seqused_k=torch.tensor([140, 260], device="cuda", dtype=torch.int32))
    out.backward(torch.randn_like(out))
    n += 1
q, k, v = (torch.randn(1, 1999, 2, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
out = flash_attn_func(q, k, v)
out.backward(torch.randn_like(out))
n += 1
torch.cuda.synchronize()
print(f"d128 split backward sanitize workload: {n} backward calls completed")
