"""torch.compile(fullgraph=True) of a transformer block on flashattn, and CUDA-graph capture and replay.

The compiled block (pre-norm, fused QKV projection, causal flash_attn_func, MLP) must give the eager
block's outputs and gradients (both run flashattn's operator; compile must not change what it
computes). CUDA graphs (GPU only): a captured forward replays on new inputs copied into its static
buffers and matches an eager call; with dropout, each replay draws a fresh mask from torch's
generator (the Philox seed is drawn inside the graph), and the kept-fraction stays near 1 - p.
"""

import pytest
import torch
from torch import Tensor, nn

from flashattn import flash_attn_func
from helpers import DEVICES, case_seed


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, dtype: torch.dtype, device: str) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim, device=device, dtype=dtype)
        self.qkv = nn.Linear(dim, 3 * dim, device=device, dtype=dtype)
        self.proj = nn.Linear(dim, dim, device=device, dtype=dtype)
        self.norm2 = nn.LayerNorm(dim, device=device, dtype=dtype)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim, device=device, dtype=dtype), nn.GELU(),
                                 nn.Linear(4 * dim, dim, device=device, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.qkv(self.norm1(x)).unflatten(-1, (3, self.heads, -1)).unbind(-3)
        x = x + self.proj(flash_attn_func(q, k, v, causal=True).flatten(-2))
        return x + self.mlp(self.norm2(x))


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_block_forward_and_backward(device: str) -> None:
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    torch.manual_seed(case_seed("compile block", device))
    block = Block(64, 4, dtype, device)
    x = torch.randn(2, 37, 64, device=device, dtype=dtype, requires_grad=True)
    compiled = torch.compile(block, fullgraph=True)
    eager_out = block(x)
    eager_grads = torch.autograd.grad(eager_out.float().square().sum(), (x, *block.parameters()))
    out = compiled(x)
    grads = torch.autograd.grad(out.float().square().sum(), (x, *block.parameters()))
    # Both run flashattn's operator; compile may fuse the surrounding ops differently (rounding).
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out, eager_out, rtol=tol, atol=tol)
    for got, want in zip(grads, eager_grads):
        torch.testing.assert_close(got.float(), want.float(), rtol=5 * tol, atol=5 * tol)


def _capture(fn, *static_inputs):
    """A CUDA graph of fn on the static inputs (warmed up on a side stream), and its static output."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn(*static_inputs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = fn(*static_inputs)
    return graph, static_out


@pytest.mark.gpu
def test_cuda_graph_replay_matches_eager() -> None:
    gen = torch.Generator(device="cuda").manual_seed(case_seed("graph"))
    shape = (2, 300, 8, 64)
    q, k, v = (torch.randn(shape, generator=gen, device="cuda", dtype=torch.float16) for _ in range(3))
    graph, static_out = _capture(lambda a, b, c: flash_attn_func(a, b, c, causal=True), q, k, v)
    for _ in range(2):
        fresh = [torch.randn(shape, generator=gen, device="cuda", dtype=torch.float16) for _ in range(3)]
        for static, new in zip((q, k, v), fresh):
            static.copy_(new)
        graph.replay()
        torch.testing.assert_close(static_out, flash_attn_func(*fresh, causal=True), rtol=0, atol=0)


@pytest.mark.gpu
def test_cuda_graph_dropout_draws_a_fresh_mask_each_replay() -> None:
    gen = torch.Generator(device="cuda").manual_seed(case_seed("graph dropout"))
    shape = (1, 256, 4, 64)
    q, k = (torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    v = torch.ones(shape, device="cuda", dtype=torch.bfloat16)  # out = (kept probability mass) / (1 - p)
    p = 0.3

    def fn(a, b, c):
        return flash_attn_func(a, b, c, dropout_p=p)

    graph, static_out = _capture(fn, q, k, v)
    outs = []
    for _ in range(3):
        graph.replay()
        outs.append(static_out.clone())
    assert not torch.equal(outs[0], outs[1]) and not torch.equal(outs[1], outs[2]), "replays reused one mask"
    for out in outs:  # the mean over rows of the kept mass is 1 - p, so out averages 1
        assert abs(out.float().mean().item() - 1.0) < 0.02


@pytest.mark.gpu
def test_masked_forwards_on_several_streams_and_in_a_graph() -> None:
    """Causal and windowed forwards over more query tiles than the GPU has SMs (the Hopper family's
    blocks draw those from a tile counter per launch), launched together on four streams, then
    replayed from a CUDA graph: every result has the bits of the same call run alone."""
    gen = torch.Generator(device="cuda").manual_seed(case_seed("masked streams"))
    shape = (2, 4096, 16, 64)  # 32 query tiles of 128 rows x 32 heads: 1024 tiles
    inputs = [[torch.randn(shape, generator=gen, device="cuda", dtype=torch.float16) for _ in range(3)]
              for _ in range(4)]  # fmt: skip
    options = [dict(causal=True), dict(window_size=(300, 0)), dict(causal=True), dict(window_size=(1000, 50))]
    alone = [flash_attn_func(*x, **o) for x, o in zip(inputs, options)]
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream() for _ in range(4)]
    for _ in range(3):
        outs = []
        for stream, x, o in zip(streams, inputs, options):
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                outs.append(flash_attn_func(*x, **o))
        for stream in streams:
            torch.cuda.current_stream().wait_stream(stream)
        for got, want in zip(outs, alone):
            assert torch.equal(got, want)
    graph, static_out = _capture(lambda a, b, c: flash_attn_func(a, b, c, causal=True), *inputs[0])
    for _ in range(3):
        static_out.fill_(torch.nan)
        graph.replay()
        assert torch.equal(static_out, alone[0])
