"""Round 38: the default backward under a mask (its grid (batch, key tile, KV head); d256's dQ kernel
(batch, query tile, head)) under compute-sanitizer, at head dims 64, 128, 192 and 256 and one padded
width below each: several batches (blockIdx.x is the batch now), MHA and GQA, causal, a window with
softcap, Sq != Sk both ways, and a packed batch of three sequences (the grid spans the longest's tiles;
the shorter ones' blocks past their keys have no step). No caching allocator: a read or write past any
tensor's end is its own allocation's. Prints the call count last."""
import torch

from flashattn import flash_attn_func, flash_attn_varlen_func

torch.manual_seed(0)
calls = 0
for head_dim in (64, 59, 128, 100, 192, 160, 256, 200):
    for batch, (sq, sk), heads, causal, options in [
        (3, (300, 300), (4, 2), True, {}),
        (2, (333, 700), (2, 2), True, {}),
        (2, (700, 333), (4, 1), True, {}),
        (3, (500, 400), (2, 1), False, {"window_size": (100, 20), "softcap": 10.0}),
    ]:
        q = torch.randn(batch, sq, heads[0], head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(batch, sk, heads[1], head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(batch, sk, heads[1], head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        out = flash_attn_func(q, k, v, causal=causal, **options)
        torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
        calls += 1
    lens = [150, 450, 77]
    cu = torch.tensor([0, 150, 600, 677], device="cuda", dtype=torch.int32)
    total = sum(lens)
    q = torch.randn(total + 37, 4, head_dim, device="cuda", dtype=torch.bfloat16)[:total].requires_grad_()
    k = torch.randn(total, 2, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(total, 2, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = flash_attn_varlen_func(q, k, v, cu, cu, 450, 450, causal=True)
    torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    calls += 1
torch.cuda.synchronize()
print(f"masked default backward sanitize driver: {calls} forward and backward calls completed")
