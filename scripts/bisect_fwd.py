"""Times the sm90 forward (bf16, d128, B * S = 16384, H = 16; S 2048 and 8192, causal and not) of the
flashattn on PYTHONPATH against SDPA cuDNN in one process, printing a JSON line per shape. Used by
scripts/bisect_fwd.sh to compare commits in one run:

    python scripts/bisect_fwd.py LABEL
"""
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import flashattn

TOKENS, HEADS, HEAD_DIM = 16384, 16, 128
REPEATS = 3  # each backend timed this many times, alternating; the best median is kept


def main(label):
    for seqlen in (2048, 8192):
        for causal in (False, True):
            batch = TOKENS // seqlen
            gen = torch.Generator(device="cuda").manual_seed(seqlen)
            q, k, v = [torch.randn(batch, seqlen, HEADS, HEAD_DIM, generator=gen, dtype=torch.bfloat16,
                                   device="cuda") for _ in range(3)]
            flops = 4 * batch * HEADS * seqlen**2 * HEAD_DIM / (2 if causal else 1)

            def ours():
                return flashattn.flash_attn_func(q, k, v, causal=causal)

            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)),
                                                          is_causal=causal).transpose(1, 2)

            diff = (ours().float() - cudnn().float()).abs().max().item()
            times = {"ours": [], "cudnn": []}
            for _ in range(REPEATS):
                times["ours"].append(do_bench(ours, warmup=25, rep=150, return_mode="median"))
                times["cudnn"].append(do_bench(cudnn, warmup=25, rep=150, return_mode="median"))
            ours_ms, cudnn_ms = min(times["ours"]), min(times["cudnn"])
            print(json.dumps({"label": label, "S": seqlen, "causal": causal,
                              "ours_tflops": round(flops / ours_ms / 1e9, 1),
                              "cudnn_tflops": round(flops / cudnn_ms / 1e9, 1),
                              "ratio": round(cudnn_ms / ours_ms, 3), "maxdiff": diff}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
