"""Round 38: the spread of the d128 S = 8192 backward within one process: ours and cuDNN, causal and not,
timed as the sweep times them (triton.testing.do_bench median, warmup 10 ms, rep 50 ms), eight rounds in
a row on the same tensors. Prints one line a round."""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from flashattn import flash_attn_func

b, s, h, d = 2, 8192, 16, 128
runs = {}
for causal in (False, True):
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
    out = flash_attn_func(q, k, v, causal=causal)
    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    flops = 4 * b * h * s * s * d * 2.5 / (2 if causal else 1)
    runs[f"ours c{int(causal)}"] = (flops, lambda out=out, q=q, k=k, v=v, dout=dout:
                                    torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
    runs[f"cudnn c{int(causal)}"] = (flops, lambda ref=ref, qt=qt, kt=kt, vt=vt, dout=dout:
                                     torch.autograd.grad(ref, (qt, kt, vt), dout.transpose(1, 2), retain_graph=True))
for r in range(8):
    cells = []
    for name, (flops, fn) in runs.items():
        ms = do_bench(fn, warmup=10, rep=50, return_mode="median")
        cells.append(f"{name} {flops / ms / 1e9:.1f}")
    print(f"round {r}: " + " | ".join(cells), flush=True)
