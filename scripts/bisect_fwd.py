"""Times the forward (or, with PASS bwd, the backward) of the flashattn on PYTHONPATH against SDPA
cuDNN in one process (bf16, B * S = 16384, H * D = 2048; S 2048 and 8192, causal and not; d128 unless
head dims are given), printing a JSON line per shape. Used by scripts/bisect_fwd.sh to compare commits
in one run:

    python scripts/bisect_fwd.py LABEL [HEAD_DIMS, e.g. 64,128] [PASS: fwd (default), bwd or fp8]

PASS fp8 times the FP8 forward (e4m3 q, k, v, descales of one: the whole call, V^T's copy included)
against the same tree's bf16 forward on the same (dequantised) values, in place of cuDNN: the
"cudnn_*" fields then hold the bf16 call's figures, "ratio" is FP8's speed over bf16's.

The backward is timed as torch.autograd.grad of one forward's output (retain_graph): the library's
whole backward (preprocess, main kernel, dQ conversion), and cuDNN's; its FLOPs are 2.5x the
forward's.
"""
import itertools
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import flashattn

TOKENS, WIDTH = 16384, 2048
REPEATS = 3  # each backend timed this many times, alternating; the best median is kept


def forward_fns(q, k, v, causal):
    def ours():
        return flashattn.flash_attn_func(q, k, v, causal=causal)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)),
                                                  is_causal=causal).transpose(1, 2)

    return ours, cudnn


def backward_fns(q, k, v, causal, gen):
    """Each backend's backward of one forward (its graph kept), returning (dq, dk, dv)."""
    inputs = [x.detach().requires_grad_() for x in (q, k, v)]
    dout = torch.randn(q.shape, generator=gen, dtype=q.dtype, device=q.device)
    fns = []
    for forward in forward_fns(*inputs, causal):
        with torch.enable_grad():
            out = forward()
        fns.append(lambda out=out: torch.autograd.grad(out, inputs, dout, retain_graph=True))
    return fns


def fp8_fns(q, k, v, causal):
    """The FP8 call and the bf16 call on the values FP8 stores."""
    q8, k8, v8 = (x.to(torch.float8_e4m3fn) for x in (q, k, v))
    qb, kb, vb = (x.to(torch.bfloat16) for x in (q8, k8, v8))
    ones = torch.ones(q.shape[0], k.shape[2], device=q.device)

    def fp8():
        return flashattn.flash_attn_func(q8, k8, v8, causal=causal, q_descale=ones, k_descale=ones, v_descale=ones)

    def bf16():
        return flashattn.flash_attn_func(qb, kb, vb, causal=causal)

    return fp8, bf16


def main(label, head_dims, pass_):
    for head_dim, seqlen, causal in itertools.product(head_dims, (2048, 8192), (False, True)):
        batch, heads = TOKENS // seqlen, WIDTH // head_dim
        gen = torch.Generator(device="cuda").manual_seed(seqlen)
        q, k, v = [torch.randn(batch, seqlen, heads, head_dim, generator=gen, dtype=torch.bfloat16,
                               device="cuda") for _ in range(3)]
        flops = 4 * batch * heads * seqlen**2 * head_dim / (2 if causal else 1) * (2.5 if pass_ == "bwd" else 1)
        ours, cudnn = (forward_fns(q, k, v, causal) if pass_ == "fwd" else fp8_fns(q, k, v, causal) if pass_ == "fp8"
                       else backward_fns(q, k, v, causal, gen))
        # fwd: out; bwd: dq (the largest error of the three gradients is the tests' business)
        first = (lambda r: r) if pass_ != "bwd" else (lambda r: r[0])
        diff = (first(ours()).float() - first(cudnn()).float()).abs().max().item()
        times = {"ours": [], "cudnn": []}
        for _ in range(REPEATS):
            times["ours"].append(do_bench(ours, warmup=25, rep=150, return_mode="median"))
            times["cudnn"].append(do_bench(cudnn, warmup=25, rep=150, return_mode="median"))
        ours_ms, cudnn_ms = min(times["ours"]), min(times["cudnn"])
        print(json.dumps({"label": label, "pass": pass_, "D": head_dim, "S": seqlen, "causal": causal,
                          "ours_tflops": round(flops / ours_ms / 1e9, 1),
                          "cudnn_tflops": round(flops / cudnn_ms / 1e9, 1),
                          "ratio": round(cudnn_ms / ours_ms, 3), "maxdiff": diff}), flush=True)


if __name__ == "__main__":
    pass_ = sys.argv[3] if len(sys.argv) > 3 else "fwd"
    if pass_ not in ("fwd", "bwd", "fp8"):
        sys.exit(f"bisect_fwd.py: PASS must be fwd, bwd or fp8, got {pass_!r}")
    main(sys.argv[1], [int(d) for d in (sys.argv[2] if len(sys.argv) > 2 else "128").split(",")], pass_)
