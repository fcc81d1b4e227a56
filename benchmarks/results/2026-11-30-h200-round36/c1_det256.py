"""Round 36, call 1: the deterministic d256 backward (the slice kernel without dQ, then bwd_dq_kernel)
against the fp32 reference with the tests' bound (tests/helpers.py) on awkward shapes: head dims 256,
255, 224, 193; MHA, GQA, MQA; causal, window, softcap; a packed batch with GQA; both dtypes. Each case
runs twice and its gradients must be bitwise equal. Prints one line per case, then the failures."""
import sys
import time

import torch

sys.path.insert(0, ".")
from tests.helpers import assert_grads_match_reference, random_qkv, run_backward  # noqa: E402

from flashattn import flash_attn_varlen_func  # noqa: E402

torch.manual_seed(0)
cases = []
for head_dim in (256, 255, 224, 193):
    for seqlens in ((113, 203), (203, 113), (1024, 1023), (1, 1), (3, 799)):
        for causal in (False, True):
            heads = [(4, 4), (4, 2), (4, 1)][(len(cases)) % 3]
            cases.append((head_dim, seqlens, causal, heads, {}))
cases += [
    (256, (1024, 1023), False, (4, 2), {"window_size": (100, 37)}),
    (256, (203, 113), True, (4, 1), {"softcap": 30.0}),
    (256, (1024, 1023), False, (4, 4), {"softcap": 5.0, "window_size": (300, 0)}),
    (200, (500, 777), True, (4, 2), {"softcap": 10.0}),
    (256, (777, 500), False, (4, 2), {"window_size": (0, 0)}),
]
failed = 0
t0 = time.time()
for dtype in (torch.bfloat16,) if "--bf16-only" in sys.argv else (torch.bfloat16, torch.float16):
    for head_dim, seqlens, causal, heads, options in cases:
        q, k, v = random_qkv(2, *seqlens, *heads, head_dim, dtype, "cuda", 1234 + len(cases), "contiguous")
        dout = torch.randn_like(q)
        scale = head_dim**-0.5
        try:
            grads = run_backward(q, k, v, dout, scale, causal, True, **options)
            again = run_backward(q, k, v, dout, scale, causal, True, **options)
            for name, a, b in zip(("dq", "dk", "dv"), grads, again):
                assert torch.equal(a, b), f"{name} differs between two deterministic calls"
            if seqlens[1] > 0:
                assert_grads_match_reference(grads, q, k, v, dout, scale, causal, **options)
            else:
                assert all(bool((g == 0).all()) for g in grads[:1]), "dq not zero without keys"
            status = "ok"
        except AssertionError as e:
            failed += 1
            status = "FAIL " + str(e).replace("\n", " ")[:300]
        torch.cuda.synchronize()
        print(f"{str(dtype)[6:]} d{head_dim} {seqlens} causal={causal} heads={heads} {options}: {status}", flush=True)

# A packed batch: sequences of 1, 300, 81 and 700 queries (keys 5, 281, 160, 700), GQA, causal and not.
for causal in (False, True):
    lens_q, lens_k = [1, 300, 81, 700], [5, 281, 160, 700]
    total_q, total_k = sum(lens_q), sum(lens_k)
    h, hk, d = 4, 2, 256
    q = torch.randn(total_q, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(total_k, hk, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(total_k, hk, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), device="cuda", dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), device="cuda", dtype=torch.int32)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal, deterministic=True)
    dout = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    dq2, dk2, dv2 = torch.autograd.grad(out, (q, k, v), dout)
    if not (torch.equal(dq, dq2) and torch.equal(dk, dk2) and torch.equal(dv, dv2)):
        failed += 1
        print(f"varlen causal={causal}: FAIL not bitwise equal")
    for i in range(4):
        qi = q[cu_q[i] : cu_q[i + 1]].detach()[None]
        ki = k[cu_k[i] : cu_k[i + 1]].detach()[None]
        vi = v[cu_k[i] : cu_k[i + 1]].detach()[None]
        gi = (dq[cu_q[i] : cu_q[i + 1]][None], dk[cu_k[i] : cu_k[i + 1]][None], dv[cu_k[i] : cu_k[i + 1]][None])
        try:
            assert_grads_match_reference(gi, qi, ki, vi, dout[cu_q[i] : cu_q[i + 1]][None], d**-0.5, causal)
        except AssertionError as e:
            failed += 1
            print(f"varlen seq {i} causal={causal}: FAIL {str(e)[:300]}")
    print(f"varlen causal={causal}: done", flush=True)
print(f"{failed} failed, {time.time() - t0:.0f}s")
sys.exit(1 if failed else 0)
