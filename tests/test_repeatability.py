"""Run after run: the same bits, and no memory left behind.

The forward has no atomics, so out and the LSE are the same bits every time;
the backward promises that with deterministic=True (on CUDA the default sums dq
with fp32 atomics, in whatever order the blocks finish; the CPU path always
sums in one order). Nothing a call allocates outlives it, and nothing waits for
Python's cyclic collector to be freed.
"""

import gc
import itertools
from collections.abc import Callable

import pytest
import torch
from helpers import case_seed, random_qkv, run_backward
from test_forward import CAUSAL, DTYPES

from flashattn import flash_attn_func, flash_attn_qkvpacked_func
from flashattn.interface import _flash_attn_forward

FORWARD_REPEATS = 100
BACKWARD_REPEATS = 50
MEMORY_CALLS = 1000


@pytest.mark.gpu
@pytest.mark.parametrize("causal", CAUSAL, ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("head_dim, heads", [(64, (16, 16)), (128, (16, 4)), (59, (8, 1))], ids=["d64", "d128", "d59"])
def test_forward_is_bitwise_reproducible(head_dim, heads, dtype, causal):
    """A batch large enough to fill the GPU many times over, run FORWARD_REPEATS times."""
    seed = case_seed("forward repeats", head_dim, heads, dtype, causal)
    q, k, v = random_qkv(32, 777, 1000, *heads, head_dim, dtype, "cuda", seed)
    out, lse = _flash_attn_forward(q, k, v, head_dim**-0.5, causal)
    for _ in range(FORWARD_REPEATS - 1):
        out_again, lse_again = _flash_attn_forward(q, k, v, head_dim**-0.5, causal)
        assert torch.equal(out_again, out) and torch.equal(lse_again, lse)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", CAUSAL, ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("head_dim", [59, 128, 200, 256], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("seqlens", [(1000, 777), (777, 1000)], ids=["sq>sk", "sq<sk"])
def test_deterministic_backward_is_bitwise_reproducible(seqlens, head_dim, dtype, causal):
    """deterministic=True: BACKWARD_REPEATS forward + backward passes on one input give the
    same bits (no order-dependent accumulation, such as atomics into dq). GQA (8 query heads on 2
    KV heads); Sq > Sk, where causal has rows that see no key, and Sq < Sk. Head dims 59 (the d64
    kernel), 128, 200 (the d256 kernel, padded) and 256 run on the sm90 family where it is the
    default (at 59 and 128 its dQ adds in a fixed order: a writer warp adds each query tile's dQ in
    its turn; at 200 and 256 a kernel over query tiles sums dQ in registers), on sm80 elsewhere (its
    dQ pass)."""
    seed = case_seed("backward repeats", seqlens, head_dim, dtype, causal)
    q, k, v = random_qkv(4, *seqlens, 8, 2, head_dim, dtype, "cuda", seed)
    dout = torch.randn(q.shape, generator=torch.Generator("cuda").manual_seed(seed), dtype=dtype, device="cuda")
    first = run_backward(q, k, v, dout, head_dim**-0.5, causal, deterministic=True)
    for _ in range(BACKWARD_REPEATS - 1):
        again = run_backward(q, k, v, dout, head_dim**-0.5, causal, deterministic=True)
        for name, grad, want in zip(("dq", "dk", "dv"), again, first):
            assert torch.equal(grad, want), f"{name} differs between runs"


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("window", [(100, 30), (0, 200)], ids=["window", "right-only"])
def test_deterministic_backward_with_a_window_is_bitwise_reproducible(window, head_dim):
    """A sliding window: each query tile is added to by a range of key tiles that starts and ends
    inside the sequence (the order sm90's dQ adds follow), Sq < Sk."""
    seed = case_seed("backward repeats, window", window, head_dim)
    q, k, v = random_qkv(2, 700, 1100, 4, 2, head_dim, torch.bfloat16, "cuda", seed)
    dout = torch.randn(q.shape, generator=torch.Generator("cuda").manual_seed(seed), dtype=q.dtype, device="cuda")
    first = run_backward(q, k, v, dout, head_dim**-0.5, False, deterministic=True, window_size=window)
    for _ in range(BACKWARD_REPEATS - 1):
        again = run_backward(q, k, v, dout, head_dim**-0.5, False, deterministic=True, window_size=window)
        for name, grad, want in zip(("dq", "dk", "dv"), again, first):
            assert torch.equal(grad, want), f"{name} differs between runs"


@pytest.mark.gpu
@pytest.mark.parametrize("causal", CAUSAL, ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 192], ids=lambda d: f"d{d}")
def test_deterministic_varlen_backward_is_bitwise_reproducible(head_dim, causal):
    """A packed batch of uneven sequences (one empty, one of a single row): a query tile's dQ adds
    in a fixed order within each sequence, and the zero rows a tile adds past its sequence (into
    the next one's rows) change nothing."""
    seed = case_seed("varlen backward repeats", head_dim, causal)
    gen = torch.Generator("cuda").manual_seed(seed)
    lengths_q, lengths_k = [300, 1, 0, 517, 130], [250, 7, 3, 600, 129]
    q = torch.randn(sum(lengths_q), 8, head_dim, generator=gen, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(sum(lengths_k), 2, head_dim, generator=gen, device="cuda", dtype=torch.bfloat16)
            for _ in range(2))  # fmt: skip
    dout = torch.randn(q.shape, generator=gen, device="cuda", dtype=q.dtype)
    cu_q, cu_k = (torch.tensor([0, *itertools.accumulate(n)], device="cuda", dtype=torch.int32)
                  for n in (lengths_q, lengths_k))  # fmt: skip
    options = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lengths_q), max_seqlen_k=max(lengths_k))
    first = run_backward(q, k, v, dout, head_dim**-0.5, causal, deterministic=True, **options)
    for _ in range(BACKWARD_REPEATS - 1):
        again = run_backward(q, k, v, dout, head_dim**-0.5, causal, deterministic=True, **options)
        for name, grad, want in zip(("dq", "dk", "dv"), again, first):
            assert torch.equal(grad, want), f"{name} differs between runs"


@pytest.mark.gpu
@pytest.mark.parametrize("causal", CAUSAL, ids=["full", "causal"])
def test_deterministic_mla_backward_is_bitwise_reproducible(causal):
    """DeepSeek MLA's head dims (q and k 192, v 128: its own sm90 kernel) under GQA, Sq > Sk."""
    seed = case_seed("mla backward repeats", causal)
    gen = torch.Generator("cuda").manual_seed(seed)
    q = torch.randn(2, 900, 8, 192, generator=gen, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 700, 2, 192, generator=gen, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 700, 2, 128, generator=gen, device="cuda", dtype=torch.bfloat16)
    dout = torch.randn(2, 900, 8, 128, generator=gen, device="cuda", dtype=torch.bfloat16)
    first = run_backward(q, k, v, dout, 192**-0.5, causal, deterministic=True)
    for _ in range(BACKWARD_REPEATS - 1):
        again = run_backward(q, k, v, dout, 192**-0.5, causal, deterministic=True)
        for name, grad, want in zip(("dq", "dk", "dv"), again, first):
            assert torch.equal(grad, want), f"{name} differs between runs"


@pytest.mark.parametrize("causal", CAUSAL, ids=["full", "causal"])
def test_cpu_backward_is_deterministic_either_way(causal):
    """The CPU path sums in a fixed order: deterministic=True gives the same bits as the default."""
    seed = case_seed("cpu deterministic", causal)
    q, k, v = random_qkv(2, 200, 333, 4, 1, 59, torch.bfloat16, "cpu", seed)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed), dtype=q.dtype)
    grads = run_backward(q, k, v, dout, 0.1, causal, deterministic=True)
    for grad, want in zip(grads, run_backward(q, k, v, dout, 0.1, causal)):
        assert torch.equal(grad, want)


def training_step(device: str, deterministic: bool, seed: int) -> Callable[[], None]:
    """One training step of both kinds of public function and an inference call, on fixed inputs:
    head dim 64 one element into its rows (copied to align them), a packed qkv of head dim 59
    (padded on CUDA), causal, GQA."""
    gen = torch.Generator(device).manual_seed(seed)
    q, k, v = random_qkv(2, 300, 257, 8, 2, 64, torch.bfloat16, device, seed, layout="offset")
    leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
    qkv = torch.randn(2, 300, 3, 8, 59, generator=gen, dtype=torch.bfloat16, device=device, requires_grad=True)
    dout = torch.randn(2, 300, 8, 64, generator=gen, dtype=torch.bfloat16, device=device)

    def step() -> None:
        out = flash_attn_func(*leaves, causal=True, deterministic=deterministic)
        torch.autograd.grad(out, leaves, dout)
        out = flash_attn_qkvpacked_func(qkv, causal=True, deterministic=deterministic)
        torch.autograd.grad(out, qkv, dout[..., :59])
        with torch.no_grad():
            flash_attn_func(*leaves, causal=False)

    return step


def cuda_allocated() -> int:
    """torch.cuda.memory_allocated() without garbage of its own: up to torch 2.13, memory_allocated
    reads memory_stats, which flattens the nested stats with a recursive closure, a function and its
    cell in a cycle with the list and tuples it builds (127 objects a reading on the H200's torch
    2.11, round 26: all that the first GPU run of the test below found)."""
    torch.cuda.synchronize()
    return torch.cuda.memory_stats_as_nested_dict()["allocated_bytes"]["all"]["current"]


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
def test_no_memory_growth_over_many_calls(deterministic):
    """MEMORY_CALLS training steps leave the allocated bytes where the first one left them:
    the copies of misaligned inputs, the padded copies, the saved tensors, the backward's
    scratch buffers and the graph are all freed. Memory that only Python's cyclic collector
    would free is not counted as growth here (it is collected before each reading, so the
    reading does not depend on when the collector last ran); the test below requires a step
    to leave none."""
    step = training_step("cuda", deterministic, case_seed("memory", deterministic))
    step()
    gc.collect()  # earlier tests' garbage freed now, not inside the loop (it read as a change once)
    allocated = cuda_allocated()
    for _ in range(MEMORY_CALLS):
        step()
    gc.collect()
    assert cuda_allocated() == allocated


def cyclic_garbage_of_a_step(
    step: Callable[[], None], allocated: Callable[[], int] = lambda: 0
) -> tuple[int, list[str], int]:
    """What one call of step() leaves to Python's cyclic collector (nothing when every object it
    made was freed when its last reference went): the objects' count, their types, and the bytes
    (as `allocated` reads them) that collecting them frees. One call first, so that lazily filled
    caches and earlier garbage are out of the reading. Only objects the call made can be found:
    torch.compile's caches from earlier tests of the process are dropped first, and the objects
    that exist before the call are held through it (in round 42's CI run 2391 of torch's
    symbolic-shape objects, ShapeEnv and SymNode, made by the torch.compile tests before, turned
    to garbage during the call; reruns passed)."""
    torch._dynamo.reset()
    step()
    gc.collect()
    gc.disable()
    try:
        existing = gc.get_objects()  # held: none of them is garbage until the reading is done
        step()
        before = allocated()
        gc.set_debug(gc.DEBUG_SAVEALL)  # the collected objects kept in gc.garbage, to name them
        found = gc.collect()
        kinds = sorted({type(obj).__name__ for obj in gc.garbage})
        gc.set_debug(0)
        gc.garbage.clear()
        gc.collect()  # now freed
        freed = before - allocated()
        del existing
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    return found, kinds, freed


@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
def test_a_cpu_step_leaves_nothing_to_the_cyclic_collector(deterministic):
    """A training step's objects are freed when their last reference goes, not at the next run
    of the cyclic collector (whose timing would then decide how much memory a process holds)."""
    step = training_step("cpu", deterministic, case_seed("cycles cpu", deterministic))
    found, kinds, _ = cyclic_garbage_of_a_step(step)
    assert found == 0, f"a step left {found} objects in reference cycles: {kinds}"


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
def test_a_cuda_step_leaves_nothing_to_the_cyclic_collector(deterministic):
    """As on the CPU, and no device memory waits for the collector. Round 25 saw
    test_no_memory_growth_over_many_calls (which did not collect after its loop then) read one
    qkv-sized allocation above its baseline once, and round 4 one below it."""
    step = training_step("cuda", deterministic, case_seed("cycles cuda", deterministic))
    found, kinds, freed = cyclic_garbage_of_a_step(step, cuda_allocated)
    assert (found, freed) == (0, 0), f"a step left {found} objects ({kinds}) and {freed} bytes to the collector"
