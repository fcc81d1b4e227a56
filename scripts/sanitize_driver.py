"""The workload compute-sanitizer watches: every forward and backward kernel on awkward shapes.

    python scripts/sanitize_driver.py --sweep full|small

scripts/sanitize.py runs it under each tool; by hand, e.g.

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck python scripts/sanitize_driver.py

(without the caching allocator every tensor is its own allocation, so a read
past a tensor's end is out of bounds, not a read of a neighbour).

Every case runs the forward and both backward paths (dQ by atomics, and
deterministic) through the operators, on inputs the kernels read in place:
strided views of one packed tensor, or separate tensors of exactly their size.

  full   both dtypes; every compiled head dim (32, 64, 96, 128, 192, 256) and one
         head dim below each that runs on it with a partial tile (8, 40, 72, 104,
         136, 200); sequence pairs with tails, Sq != Sk both ways and causal rows
         that see no key; MHA, GQA and MQA in turn; causal and not.
  small  for the slow tools (racecheck): both dtypes, every compiled head dim,
         causal and not, on one shape that still has two query tiles, several
         key tiles, a sequence tail, the causal diagonal and a GQA group of 2.

Prints "sanitize driver: N forward and M backward calls completed (sweep S)"
last; any CUDA error is an exception and a non-zero exit before that.
"""

import argparse
import itertools

import torch

import flashattn  # noqa: F401  registers torch.ops.flashattn

DTYPES = [torch.float16, torch.bfloat16]
KERNEL_HEAD_DIMS = [32, 64, 96, 128, 192, 256]
PARTIAL_HEAD_DIMS = [8, 40, 72, 104, 136, 200]  # each runs on the smallest compiled head dim above it
FULL_SEQLENS = [(1, 1), (3, 130), (130, 3), (77, 200), (200, 77)]
SMALL_SEQLENS = [(130, 190)]
HEADS = [(4, 4), (4, 2), (4, 1)]  # (H, Hk): MHA, GQA, MQA


def sweep(name: str) -> list[tuple]:
    """(dtype, head_dim, (Sq, Sk), causal, (H, Hk), layout, batch) of every case of the sweep."""
    if name == "small":
        return [
            (dtype, head_dim, seqlens, causal, (2, 1), "contiguous", 1)
            for dtype, head_dim, seqlens, causal in itertools.product(
                DTYPES, KERNEL_HEAD_DIMS, SMALL_SEQLENS, [False, True]
            )
        ]
    head_dims = sorted(KERNEL_HEAD_DIMS + PARTIAL_HEAD_DIMS)
    cases = []
    for i, (dtype, head_dim, seqlens) in enumerate(itertools.product(DTYPES, head_dims, FULL_SEQLENS)):
        layout = "packed" if i % 2 else "contiguous"  # with HEADS, every (layout, heads) pair in turn
        cases += [(dtype, head_dim, seqlens, causal, HEADS[i % len(HEADS)], layout, 2) for causal in (False, True)]
    return cases


def inputs(dtype, head_dim, seqlens, heads, layout, batch):
    """q [B, Sq, H, D], k and v [B, Sk, Hk, D]: separate tensors, or views of one packed tensor
    whose rows are longer than D (head dim padded by 8, so every row stays 16-byte aligned)."""
    (seqlen_q, seqlen_k), (num_heads, num_heads_k) = seqlens, heads
    if layout == "contiguous":
        q = torch.randn(batch, seqlen_q, num_heads, head_dim, device="cuda", dtype=dtype)
        k, v = (torch.randn(batch, seqlen_k, num_heads_k, head_dim, device="cuda", dtype=dtype) for _ in range(2))
        return q, k, v
    packed = torch.randn(batch, max(seqlen_q, seqlen_k), 3, num_heads, head_dim + 8, device="cuda", dtype=dtype)
    q = packed[:, :seqlen_q, 0, :, :head_dim]
    k = packed[:, :seqlen_k, 1, :num_heads_k, :head_dim]
    v = packed[:, :seqlen_k, 2, :num_heads_k, :head_dim]
    return q, k, v


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", choices=["full", "small"], default="full")
    args = parser.parse_args()
    torch.manual_seed(0)
    forward_calls = backward_calls = 0
    for dtype, head_dim, seqlens, causal, heads, layout, batch in sweep(args.sweep):
        q, k, v = inputs(dtype, head_dim, seqlens, heads, layout, batch)
        scale = head_dim**-0.5
        out, lse = torch.ops.flashattn.fwd(q, k, v, scale, causal)
        dout = torch.randn_like(out)
        forward_calls += 1
        for deterministic in (False, True):
            torch.ops.flashattn.bwd(dout, q, k, v, out, lse, scale, causal, deterministic)
            backward_calls += 1
    torch.cuda.synchronize()
    print(f"sanitize driver: {forward_calls} forward and {backward_calls} backward calls completed "
          f"(sweep {args.sweep})")


if __name__ == "__main__":
    main()
