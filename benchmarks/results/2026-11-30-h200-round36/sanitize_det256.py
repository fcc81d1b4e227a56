"""Round 36 (from round 33's c4_sanitize_d256.py): the deterministic d256 backward (the slice kernel
without dQ, and bwd_dq_kernel) under compute-sanitizer:
d256 and d200 (a partial last column block), 300 x 300 and 333 x 1000 (more steps than stages: the Q ring
of 2, the dO ring of 1 and both P/dS buffers are written again after they were read), MHA and GQA,
causal and not, a window with softcap, and a cut packed batch (sequences of 150 and 450 rows: the tiles
that reach past a sequence get those rows zeroed in shared memory). No caching allocator: a read or
write past any tensor's end is its own allocation's. Prints the call count last."""
import torch

from flashattn import flash_attn_func, flash_attn_varlen_func

torch.manual_seed(0)
calls = 0
for head_dim in (256, 200):
    for (sq, sk), heads, causal, options in [
        ((300, 300), (4, 2), False, {}),
        ((300, 300), (4, 2), True, {}),
        ((333, 1000), (2, 2), True, {}),
        ((1000, 333), (2, 1), False, {"window_size": (100, 20), "softcap": 10.0}),
    ]:
        q = torch.randn(1, sq, heads[0], head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(1, sk, heads[1], head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(1, sk, heads[1], head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        out = flash_attn_func(q, k, v, causal=causal, deterministic=True, **options)
        torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
        calls += 1
    for causal in (False, True):
        lens = [150, 450]
        total = sum(lens)
        cu = torch.tensor([0, 150, 600], device="cuda", dtype=torch.int32)
        q = torch.randn(total + 37, 4, head_dim, device="cuda", dtype=torch.bfloat16)[:total].requires_grad_()
        k = torch.randn(total, 2, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(total, 2, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        out = flash_attn_varlen_func(q, k, v, cu, cu, 450, 450, causal=causal, deterministic=True)
        torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
        calls += 1
torch.cuda.synchronize()
print(f"deterministic d256 sanitize driver: {calls} forward and backward calls completed")
