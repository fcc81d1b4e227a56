"""Runs every forward and backward instantiation on awkward shapes, for compute-sanitizer.

    compute-sanitizer --tool memcheck python scripts/sanitize_driver.py
    compute-sanitizer --tool racecheck python scripts/sanitize_driver.py --small

Shapes are small (sanitizers slow kernels by orders of magnitude) but cover the
sequence tails, Sq != Sk both ways, causal rows that see no key, GQA, and
strided (non-contiguous) inputs; the backward runs both of its paths (dQ by
atomics, and deterministic). Exits non-zero on a CUDA error.
"""
import argparse
import itertools

import torch

import flashattn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="fewer cases (racecheck is slow)")
    args = parser.parse_args()
    head_dims = [32, 64, 96, 128, 192, 256] if not args.small else [64, 256]
    seqlens = [(1, 1), (3, 130), (130, 3), (77, 200)] if not args.small else [(70, 133)]
    torch.manual_seed(0)
    cases = 0
    for dtype, head_dim, (sq, sk), causal in itertools.product(
            [torch.float16, torch.bfloat16], head_dims, seqlens, [False, True]):
        packed = torch.randn(2, max(sq, sk), 3, 4, head_dim + 8, device="cuda", dtype=dtype)
        q = packed[:, :sq, 0, :, :head_dim]  # strided views: no copy on the way in
        k = packed[:, :sk, 1, :2, :head_dim]
        v = packed[:, :sk, 2, :2, :head_dim]
        scale = head_dim**-0.5
        out, lse = torch.ops.flashattn.fwd(q, k, v, scale, causal)
        dout = torch.randn_like(out)
        for deterministic in (False, True):
            torch.ops.flashattn.bwd(dout, q, k, v, out, lse, scale, causal, deterministic)
        cases += 1
    torch.cuda.synchronize()
    print(f"sanitize driver: {cases} forward and {2 * cases} backward calls completed")


if __name__ == "__main__":
    main()
