"""Round 39: the default backward without a mask, whose grids' last items run in parts that hand their
fp32 sums on through global memory (schedule.h: TailSplit; parts.cuh), under compute-sanitizer: head
dims 64, 128 and 256 and a padded width below each (d64 and d128: the main kernel splits; d256: the dQ
kernel, in both modes), 192 (no split, its grid in one dimension now), MHA and GQA, Sq != Sk both
ways, softcap, grids of a few items (every item in four parts, some parts without a tile) and of more
than a wave, and a packed batch of three sequences (items past a short sequence's tiles). No caching
allocator: a read or write past any tensor's end is its own allocation's. Prints the call count last."""
import torch

from flashattn import flash_attn_func, flash_attn_varlen_func

torch.manual_seed(0)
calls = 0
for head_dim in (64, 59, 128, 100, 192, 256, 200):
    for batch, (sq, sk), heads, options in [
        (1, (170, 500), (6, 3), {}),
        (3, (300, 300), (4, 2), {}),
        (2, (333, 700), (2, 2), {"softcap": 10.0}),
        (2, (700, 333), (4, 1), {}),
        (2, (1100, 1100), (16, 8), {}),
    ]:
        for deterministic in (False, True) if head_dim in (256, 128) else (False,):
            q = torch.randn(batch, sq, heads[0], head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            k = torch.randn(batch, sk, heads[1], head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            v = torch.randn(batch, sk, heads[1], head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            out = flash_attn_func(q, k, v, deterministic=deterministic, **options)
            torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
            calls += 1
    lens = [150, 450, 77]
    cu = torch.tensor([0, 150, 600, 677], device="cuda", dtype=torch.int32)
    total = sum(lens)
    q = torch.randn(total + 37, 4, head_dim, device="cuda", dtype=torch.bfloat16)[:total].requires_grad_()
    k = torch.randn(total, 2, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(total, 2, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = flash_attn_varlen_func(q, k, v, cu, cu, 450, 450)
    torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    calls += 1
torch.cuda.synchronize()
print(f"unmasked default backward sanitize driver: {calls} forward and backward calls completed")
