"""Round 37: the backward at head dims `--hdims` (default 256) against the fp32 reference with the
tests' bound (tests/helpers.py) on awkward shapes: the head dim and odd widths below it; MHA, GQA,
MQA; causal, window, softcap; a packed batch with GQA; `--dtypes` (bf16,fp16). `--det`: the
deterministic mode, each case twice and bitwise equal. Prints one line per case, then the failures."""
import sys
import time

import torch

sys.path.insert(0, ".")
from tests.helpers import assert_grads_match_reference, random_qkv, run_backward  # noqa: E402

from flashattn import flash_attn_varlen_func  # noqa: E402

arg = {a.split("=")[0]: a.split("=")[1] for a in sys.argv[1:] if "=" in a}
hdims = [int(x) for x in arg.get("--hdims", "256").split(",")]
dtypes = [{"bf16": torch.bfloat16, "fp16": torch.float16}[x] for x in arg.get("--dtypes", "bf16,fp16").split(",")]
det = "--det" in sys.argv
torch.manual_seed(0)
cases = []
for top in hdims:
    for head_dim in (top, top - 1, top - 31, top - 63 if top > 64 else top - 29):
        for seqlens in ((113, 203), (203, 113), (1024, 1023), (1, 1), (3, 799)):
            for causal in (False, True):
                heads = [(4, 4), (4, 2), (4, 1)][(len(cases)) % 3]
                cases.append((head_dim, seqlens, causal, heads, {}))
    cases += [
        (top, (1024, 1023), False, (4, 2), {"window_size": (100, 37)}),
        (top, (203, 113), True, (4, 1), {"softcap": 30.0}),
        (top, (1024, 1023), False, (4, 4), {"softcap": 5.0, "window_size": (300, 0)}),
        (top - 56, (500, 777), True, (4, 2), {"softcap": 10.0}),
        (top, (777, 500), False, (4, 2), {"window_size": (0, 0)}),
        (top, (2048, 2048), True, (8, 2), {}),
        (top, (2048, 2048), False, (8, 8), {"softcap": 20.0}),
    ]
failed = 0
t0 = time.time()
for dtype in dtypes:
    for head_dim, seqlens, causal, heads, options in cases:
        q, k, v = random_qkv(2, *seqlens, *heads, head_dim, dtype, "cuda", 1234 + len(cases), "contiguous")
        dout = torch.randn_like(q)
        scale = head_dim**-0.5
        try:
            grads = run_backward(q, k, v, dout, scale, causal, det, **options)
            if det:
                again = run_backward(q, k, v, dout, scale, causal, det, **options)
                for name, a, b in zip(("dq", "dk", "dv"), grads, again):
                    assert torch.equal(a, b), f"{name} differs between two deterministic calls"
            assert_grads_match_reference(grads, q, k, v, dout, scale, causal, **options)
            status = "ok"
        except AssertionError as e:
            failed += 1
            status = "FAIL " + str(e).replace("\n", " ")[:300]
        torch.cuda.synchronize()
        print(f"{str(dtype)[6:]} d{head_dim} {seqlens} causal={causal} heads={heads} {options}: {status}", flush=True)

# A packed batch: sequences of 1, 300, 81 and 700 queries (keys 5, 281, 160, 700), GQA, causal and not.
for d in hdims:
    for causal in (False, True):
        lens_q, lens_k = [1, 300, 81, 700], [5, 281, 160, 700]
        total_q, total_k = sum(lens_q), sum(lens_k)
        h, hk = 4, 2
        q = torch.randn(total_q, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(total_k, hk, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(total_k, hk, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), device="cuda", dtype=torch.int32)
        cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), device="cuda", dtype=torch.int32)
        out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal, deterministic=det)
        dout = torch.randn_like(out)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
        for i in range(4):
            qi = q[cu_q[i] : cu_q[i + 1]].detach()[None]
            ki = k[cu_k[i] : cu_k[i + 1]].detach()[None]
            vi = v[cu_k[i] : cu_k[i + 1]].detach()[None]
            gi = (dq[cu_q[i] : cu_q[i + 1]][None], dk[cu_k[i] : cu_k[i + 1]][None], dv[cu_k[i] : cu_k[i + 1]][None])
            try:
                assert_grads_match_reference(gi, qi, ki, vi, dout[cu_q[i] : cu_q[i + 1]][None], d**-0.5, causal)
            except AssertionError as e:
                failed += 1
                print(f"varlen d{d} seq {i} causal={causal}: FAIL {str(e)[:300]}")
        print(f"varlen d{d} causal={causal}: done", flush=True)
print(f"{failed} failed, {time.time() - t0:.0f}s")
sys.exit(1 if failed else 0)
