"""Round 41: run the d256 backward a few times on a tree built with the step trace
(branch exp/d256-trace: block FLASHATTN_BWD_TRACE of the dK/dV kernel prints its per-step clocks)."""
import sys

import torch

from flashattn import flash_attn_func

s, causal = int(sys.argv[1]), bool(int(sys.argv[2]))
b, h, d = 16384 // s, 8, 256
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
dout = torch.randn_like(q)
for i in range(3):
    out = flash_attn_func(q, k, v, causal=causal)
    torch.autograd.grad(out, (q, k, v), dout)
    torch.cuda.synchronize()
print("done", flush=True)
