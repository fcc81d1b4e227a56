"""Round 29, call 5: why the rising-maxima FP8 test's LSE is off at d256 (0.015 against a bound of 0.010)
and not at d128 (0.00014). For each head dim, on the test's data: the FP8 kernel's LSE error (signed,
over rows), the same data with the key order reversed (the maximum walked first: no offset moves),
and the raw FP8 tensor-core product (torch._scaled_mm, fast accumulation) of the same q and k against
the fp32 product: the score errors and the LSE they imply."""
import math
import sys

import torch

sys.path.insert(0, "tests")
import test_fp8 as T  # noqa: E402

from flashattn import flash_attn_func  # noqa: E402

for head_dim in (128, 256):
    gen = torch.Generator().manual_seed(T.case_seed("fp8 kernel rising maxima", head_dim))
    block = 96
    seqlen_q, seqlen_k, heads = 130, block * len(T.RISING_LEVELS), 2
    levels = torch.tensor(T.RISING_LEVELS, dtype=torch.float32).repeat_interleave(block)
    q = 1 + 0.05 * torch.randn(1, seqlen_q, heads, head_dim, generator=gen)
    k = 0.25 * levels[None, :, None, None] + 0.01 * torch.randn(1, seqlen_k, heads, head_dim, generator=gen)
    v = torch.randn(1, seqlen_k, heads, head_dim, generator=gen)
    stored, scales = zip(*(T.quantise(x, heads) for x in (q, k, v)))
    stored = [t.cuda() for t in stored]
    scales = [s.cuda() for s in scales]
    scale = 2.5 / (0.25 * head_dim * math.log2(math.e))
    for order in ("as tested", "keys reversed"):
        st = list(stored)
        if order == "keys reversed":
            st[1], st[2] = (t.flip(1).contiguous() for t in st[1:])
        real = T.dequantised_fp32(st, scales, heads)
        out, lse, _ = flash_attn_func(*st, softmax_scale=scale, return_attn_probs=True,
                                      **dict(zip(T.DESCALE_NAMES, scales)))
        _, lse_ref = T.attention_ref(*real, scale, False, (-1, -1))
        d = lse - lse_ref
        out16, lse16, _ = flash_attn_func(*(t.to(torch.bfloat16) for t in real), softmax_scale=scale,
                                          return_attn_probs=True)
        print(f"d{head_dim} {order}: FP8 kernel LSE error mean {d.mean():+.5f} min {d.min():+.5f} max {d.max():+.5f}; "
              f"bf16 kernel LSE error max {(lse16 - lse_ref).abs().max():.5f}")
    # The raw FP8 product of head 0: q (Sq, D) x k (Sk, D)^T, fp32 out, fast accumulation.
    qs, ks = stored[0][0, :128, 0].contiguous(), stored[1][0, :, 0].contiguous()  # _scaled_mm: M % 16 == 0
    exact = qs.float() @ ks.float().T
    for fast in (True, False):
        one = torch.ones((), device="cuda")
        mm = torch._scaled_mm(qs, ks.T, scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=fast)
        rel = (mm - exact) / exact.abs().clamp_min(1)
        f = (scales[0][0, 0] * scales[1][0, 0] * scale).item()  # stored product -> natural-log score
        lse_mm = torch.logsumexp(mm * f, -1) - torch.logsumexp(exact * f, -1)
        print(f"d{head_dim} _scaled_mm fast_accum={fast}: relative error mean {rel.mean():+.2e} max |.| "
              f"{rel.abs().max():.2e}; implied LSE error mean {lse_mm.mean():+.5f} max |.| {lse_mm.abs().max():.5f}")
