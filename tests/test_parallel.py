"""flashattn.parallel: ring and Ulysses attention across processes, against single-process attention.

Each setup (device, backend, world size) spawns its processes once: every rank runs every case of
CASES and every bad call of _bad_calls on its shards and saves what it got; the tests then unshard
the results and hold them to the fp32 reference with the usual bounds (tests/helpers.py). One spawn
per setup keeps CI short: a process that imports torch costs seconds on two cores.

On CPU: gloo, 2 and 4 ranks. On GPUs (marked gpu): NCCL with one process per GPU where there are
enough, and 2 processes sharing one GPU over gloo, which carries CPU tensors only for point-to-point
and all-to-all: there this file's workers stage CUDA tensors through host memory (_stage_through_cpu),
the library code is the same.
"""

import csv
import dataclasses
import datetime
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from helpers import (assert_grads_match_reference, assert_matches_reference, case_seed, poisoned_allocations,
                     random_qkv)

from flashattn.parallel import (_block, positions, ring_attention, sdpa_context_parallel, shard, ulysses_attention,
                                unshard)
from flashattn.testing import free_loopback_port


@dataclasses.dataclass(frozen=True)
class Case:
    method: str  # "ring", "ulysses", or "sdpa-ring" / "sdpa-ulysses": F.scaled_dot_product_attention routed there
    layout: str
    causal: bool
    batch: int
    chunk: int  # tokens per chunk: seqlen = chunk * (2 * world if zigzag else world); 0 with local_seqlens
    heads: int
    heads_k: int
    head_dim: int
    dtype: torch.dtype  # on CUDA fp32 runs as bf16
    softmax_scale: float | None = None
    softcap: float = 0.0
    window_size: tuple[int, int] = (-1, -1)
    local_seqlens: tuple[tuple[int, ...], ...] = ()  # uneven contiguous shards: one length list per world size


F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
CASES = {
    "ring-zigzag-causal-gqa": Case("ring", "zigzag", True, 2, 3, 4, 2, 16, F32),
    "ring-zigzag-causal-mqa-d13": Case("ring", "zigzag", True, 1, 5, 3, 1, 13, BF16, softmax_scale=0.3),
    "ring-zigzag-causal-1-token-chunks": Case("ring", "zigzag", True, 1, 1, 2, 2, 8, F16),
    "ring-zigzag-full-softcap": Case("ring", "zigzag", False, 2, 3, 4, 1, 24, F32, softcap=5.0),
    "ring-contiguous-full": Case("ring", "contiguous", False, 1, 5, 2, 2, 8, F16),
    "ring-contiguous-causal": Case("ring", "contiguous", True, 1, 7, 2, 1, 16, BF16),
    "ring-uneven-causal-gqa": Case("ring", "contiguous", True, 2, 0, 4, 2, 16, F32,
                                   local_seqlens=((5, 3), (7, 1, 4, 6))),
    "ring-uneven-full-mqa-d13": Case("ring", "contiguous", False, 1, 0, 3, 1, 13, BF16, softmax_scale=0.3,
                                     local_seqlens=((2, 7), (3, 6, 1, 5))),
    "ring-uneven-causal-empty-ranks": Case("ring", "contiguous", True, 1, 0, 2, 2, 8, F16,
                                           local_seqlens=((0, 6), (4, 0, 0, 5))),
    "ulysses-zigzag-causal-gqa": Case("ulysses", "zigzag", True, 1, 3, 4, 2, 16, BF16),
    "ulysses-contiguous-full-d11": Case("ulysses", "contiguous", False, 2, 5, 4, 4, 11, F32),
    "ulysses-zigzag-causal-mqa-window": Case("ulysses", "zigzag", True, 1, 3, 8, 1, 16, F16, softcap=3.0,
                                             window_size=(5, 0)),
    "sdpa-ring-zigzag-causal-gqa": Case("sdpa-ring", "zigzag", True, 1, 3, 4, 2, 16, F32),
    "sdpa-ulysses-contiguous-full": Case("sdpa-ulysses", "contiguous", False, 1, 3, 4, 4, 8, F32),
}

# name: (exception, words its message must contain), raised by _bad_calls[name] on every rank.
BAD_CALLS = {
    "ring-dropout": (ValueError, "dropout_p"),
    "ulysses-dropout": (ValueError, "dropout_p"),
    "ring-window": (ValueError, "window_size"),
    "ring-alibi": (ValueError, "alibi_slopes"),
    "ulysses-heads": (ValueError, "nheads (q.shape[2] = 3)"),
    "ulysses-heads-k": (ValueError, "nheads_k (k.shape[2] = 3)"),
    "zigzag-odd-seqlen": (ValueError, "even local seqlen (q.shape[1] = 3:"),
    "local-seqlens-count": (ValueError, "local_seqlens must hold the local seqlen of each of the"),
    "local-seqlens-negative": (ValueError, "local_seqlens must hold the local seqlen of each of the"),
    "local-seqlens-zigzag": (ValueError, "local_seqlens (uneven shards) needs layout='contiguous'"),
    "local-seqlens-mismatch": (ValueError, "must be this rank's local seqlen, q.shape[1] = 4"),
    "k-seqlen": (ValueError, "k and v must be shards of q's sequence"),
    "layout": (ValueError, "layout must be one of"),
    "ring-lse-gradient": (NotImplementedError, "softmax_lse is not differentiable"),
    "sdpa-attn-mask": (ValueError, "attn_mask"),
}

SETUPS = [
    pytest.param(("cpu", "gloo", 2), id="cpu-gloo-2"),
    pytest.param(("cpu", "gloo", 4), id="cpu-gloo-4"),
    pytest.param(("cuda", "nccl", 2), id="cuda-nccl-2", marks=pytest.mark.gpu),
    pytest.param(("cuda", "nccl", 4), id="cuda-nccl-4", marks=pytest.mark.gpu),
    pytest.param(("cuda", "gloo", 2), id="cuda-gloo-2-one-gpu", marks=pytest.mark.gpu),
]
TIMEOUT = datetime.timedelta(seconds=120)  # a rank that dies leaves the others failing, not hanging


def _dtype(case: Case, device: str) -> torch.dtype:
    return BF16 if device == "cuda" and case.dtype == F32 else case.dtype


def _local_seqlens(case: Case, world_size: int) -> tuple[int, ...] | None:
    return next((lengths for lengths in case.local_seqlens if len(lengths) == world_size), None)


def _seqlen(case: Case, world_size: int) -> int:
    if case.local_seqlens:
        return sum(_local_seqlens(case, world_size))
    return case.chunk * (2 * world_size if case.layout == "zigzag" else world_size)


def _inputs(name: str, case: Case, world_size: int, device: str) -> tuple[torch.Tensor, ...]:
    """Fresh q, k, v and dout of the whole sequence, on the CPU."""
    seed = case_seed("parallel", name, world_size, device)
    seqlen, dtype = _seqlen(case, world_size), _dtype(case, device)
    q, k, v = random_qkv(case.batch, seqlen, seqlen, case.heads, case.heads_k, case.head_dim, dtype, "cpu", seed)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=dtype)
    return q, k, v, dout


def _run_case(case: Case, inputs: tuple[torch.Tensor, ...], rank: int, world_size: int, device: str) -> dict:
    """This rank's out, softmax_lse (None through SDPA) and dq, dk, dv, on the CPU."""
    lengths = _local_seqlens(case, world_size)
    q, k, v, dout = (shard(t, rank, world_size, case.layout, local_seqlens=lengths).to(device) for t in inputs)
    uneven = {"local_seqlens": lengths} if lengths else {}
    leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
    lse = None
    with poisoned_allocations():
        if case.method.startswith("sdpa-"):
            with sdpa_context_parallel(layout=case.layout, method=case.method.removeprefix("sdpa-")):
                out = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in leaves), is_causal=case.causal,
                                                     scale=case.softmax_scale, enable_gqa=True).transpose(1, 2)
        else:
            attention = ring_attention if case.method == "ring" else ulysses_attention
            out, lse = attention(*leaves, softmax_scale=case.softmax_scale, causal=case.causal,
                                 window_size=case.window_size, softcap=case.softcap, return_lse=True,
                                 layout=case.layout, **uneven)
        grads = torch.autograd.grad(out, leaves, dout)
    return {"out": out.detach().cpu(), "lse": None if lse is None else lse.detach().cpu(),
            "grads": [g.cpu() for g in grads]}


def _bad_calls(device: str) -> dict:
    """BAD_CALLS' calls, each raising before any communication (or, for the LSE's gradient, in the
    backward before any), so that no rank waits for another."""
    def qkv(seqlen=4, heads=4, heads_k=2, seqlen_k=None):
        q = torch.randn(1, seqlen, heads, 8, device=device, dtype=BF16 if device == "cuda" else F32)
        k = torch.randn(1, seqlen_k or seqlen, heads_k, 8, device=device, dtype=q.dtype)
        return q, k, torch.randn_like(k)

    def lse_gradient():
        q, k, v = (t.requires_grad_() for t in qkv())
        _, lse = ring_attention(q, k, v, causal=True, return_lse=True)
        torch.autograd.grad(lse.sum(), q)

    def sdpa_mask():
        q, k, v = (t.transpose(1, 2) for t in qkv(heads_k=4))
        with sdpa_context_parallel():
            F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(4, 4, dtype=torch.bool, device=device))

    slopes = torch.ones(4, device=device)
    world_size = dist.get_world_size()
    return {
        "ring-dropout": lambda: ring_attention(*qkv(), dropout_p=0.1),
        "ulysses-dropout": lambda: ulysses_attention(*qkv(), dropout_p=0.1),
        "ring-window": lambda: ring_attention(*qkv(), causal=True, window_size=(2, 0)),
        "ring-alibi": lambda: ring_attention(*qkv(), alibi_slopes=slopes),
        "ulysses-heads": lambda: ulysses_attention(*qkv(heads=3, heads_k=1)),
        "ulysses-heads-k": lambda: ulysses_attention(*qkv(heads=12, heads_k=3)),
        "zigzag-odd-seqlen": lambda: ring_attention(*qkv(seqlen=3), causal=True),
        "local-seqlens-count": lambda: ring_attention(*qkv(), layout="contiguous",
                                                      local_seqlens=[4] * (world_size + 1)),
        "local-seqlens-negative": lambda: ring_attention(*qkv(), layout="contiguous",
                                                         local_seqlens=[4] * (world_size - 1) + [-1]),
        "local-seqlens-zigzag": lambda: ring_attention(*qkv(), local_seqlens=[4] * world_size),
        "local-seqlens-mismatch": lambda: ring_attention(*qkv(), layout="contiguous", local_seqlens=[3] * world_size),
        "k-seqlen": lambda: ring_attention(*qkv(seqlen=2, seqlen_k=4)),
        "layout": lambda: ring_attention(*qkv(), layout="striped"),
        "ring-lse-gradient": lse_gradient,
        "sdpa-attn-mask": sdpa_mask,
    }


def _raised(call) -> tuple[str, str] | None:
    try:
        call()
    except Exception as err:  # noqa: BLE001 (the test compares the type)
        return type(err).__name__, str(err)
    return None


def _stage_through_cpu() -> None:
    """Point-to-point and all-to-all of CUDA tensors over gloo, through host copies (this file's single-GPU
    variant only): each batch completes before it returns, as its receives are copied back."""
    batch_isend_irecv, all_to_all_single = dist.batch_isend_irecv, dist.all_to_all_single

    class Done:
        def wait(self):
            return True

    def staged_batch(ops):
        host_ops = [dist.P2POp(op.op, op.tensor.cpu(), op.peer, op.group) for op in ops]
        for work in batch_isend_irecv(host_ops):
            work.wait()
        for op, host_op in zip(ops, host_ops):
            if op.op is dist.irecv:
                op.tensor.copy_(host_op.tensor)
        return [Done()]

    def staged_all_to_all(output, input, *args, **kwargs):
        host_output = output.cpu()
        all_to_all_single(host_output, input.cpu(), *args, **kwargs)
        output.copy_(host_output)

    dist.batch_isend_irecv, dist.all_to_all_single = staged_batch, staged_all_to_all


def _worker(rank: int, world_size: int, port: int, backend: str, device: str, folder: Path) -> None:
    torch.set_num_threads(1)  # 4 ranks on 2 cores
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=TIMEOUT)
    try:
        if backend == "gloo" and device == "cuda":
            _stage_through_cpu()
        inputs = torch.load(folder / "inputs.pt")
        results = {name: _run_case(case, inputs[name], rank, world_size, device) for name, case in CASES.items()}
        errors = {name: _raised(call) for name, call in _bad_calls(device).items()}
        torch.save({"results": results, "errors": errors}, folder / f"rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


@dataclasses.dataclass
class Ranks:
    device: str
    world_size: int
    inputs: dict
    saved: list


@pytest.fixture(scope="module", params=SETUPS)
def ranks(request, tmp_path_factory) -> Ranks:
    device, backend, world_size = request.param
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        pytest.skip(f"NCCL with {world_size} ranks needs {world_size} GPUs, torch sees {torch.cuda.device_count()}")
    folder = tmp_path_factory.mktemp(f"parallel-{device}-{backend}-{world_size}")
    inputs = {name: _inputs(name, case, world_size, device) for name, case in CASES.items()}
    torch.save(inputs, folder / "inputs.pt")
    if sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback only; inherited by the spawned ranks
    mp.spawn(_worker, args=(world_size, free_loopback_port(), backend, device, folder), nprocs=world_size)
    saved = [torch.load(folder / f"rank{r}.pt") for r in range(world_size)]
    return Ranks(device, world_size, inputs, saved)


def _gathered(ranks: Ranks, name: str, key: str, layout: str, dim: int = 1, index: int | None = None):
    shards = [saved["results"][name][key] for saved in ranks.saved]
    if index is not None:
        shards = [s[index] for s in shards]
    return unshard(shards, layout, dim).to(ranks.device)


@pytest.mark.parametrize("name", CASES)
def test_matches_single_process_attention(ranks, name):
    """out, softmax_lse, dq, dk, dv of every rank, unsharded, against attention over the whole sequence."""
    case = CASES[name]
    q, k, v, dout = (t.to(ranks.device) for t in ranks.inputs[name])
    scale = case.softmax_scale or case.head_dim**-0.5
    options = {"softcap": case.softcap, "window_size": case.window_size}
    out = _gathered(ranks, name, "out", case.layout)
    # The SDPA route returns no LSE.
    lse = None if case.method.startswith("sdpa-") else _gathered(ranks, name, "lse", case.layout, dim=2)
    assert_matches_reference(out, lse, q, k, v, scale, case.causal, **options)
    grads = [_gathered(ranks, name, "grads", case.layout, index=i) for i in range(3)]
    assert_grads_match_reference(grads, q, k, v, dout, scale, case.causal, stored_out=out, **options)


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_input_raises_naming_it(ranks, name):
    expected, words = BAD_CALLS[name]
    for rank, saved in enumerate(ranks.saved):
        raised = saved["errors"][name]
        assert raised is not None, f"rank {rank}: {name} raised nothing"
        assert raised[0] == expected.__name__ and words in raised[1], (rank, raised)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_shard_unshard_positions(world_size, layout):
    """shard takes positions()' tokens; unshard of every rank's shard is the tensor; the ranks' positions
    cover the sequence once; zigzag's shards hold a chunk of each end."""
    seqlen = 2 * world_size * 3
    x = torch.randn(2, seqlen, 3, 5)
    shards = [shard(x, r, world_size, layout) for r in range(world_size)]
    for r, s in enumerate(shards):
        assert torch.equal(s, x[:, positions(seqlen, r, world_size, layout)])
    assert torch.equal(unshard(shards, layout), x)
    everything = torch.cat([positions(seqlen, r, world_size, layout) for r in range(world_size)])
    assert torch.equal(everything.sort().values, torch.arange(seqlen))
    if layout == "zigzag":
        assert positions(seqlen, 0, world_size, layout)[-1] == seqlen - 1


@pytest.mark.parametrize("local_seqlens", [(5,), (5, 3), (0, 4), (7, 1, 4, 6), (4, 0, 0, 5), (2, 0, 3, 1, 9)])
def test_uneven_shard_unshard_positions(local_seqlens):
    """With local_seqlens rank r gets the r-th contiguous slice of its length; unshard concatenates them back."""
    world_size, seqlen = len(local_seqlens), sum(local_seqlens)
    x = torch.randn(2, seqlen, 3, 5)
    shards = [shard(x, r, world_size, "contiguous", local_seqlens=local_seqlens) for r in range(world_size)]
    assert [s.shape[1] for s in shards] == list(local_seqlens)
    for r, s in enumerate(shards):
        assert torch.equal(s, x[:, positions(seqlen, r, world_size, "contiguous", local_seqlens=local_seqlens)])
    assert torch.equal(unshard(shards, "contiguous"), x)
    assert torch.equal(unshard([s.transpose(1, 2) for s in shards], "contiguous", dim=2), x.transpose(1, 2))


def test_shard_errors_name_the_length():
    with pytest.raises(ValueError, match=r"x.shape\[1\] \(10\) must be a multiple of 8 for layout 'zigzag'"):
        shard(torch.randn(1, 10, 2, 4), 0, 4)
    with pytest.raises(ValueError, match=r"seqlen \(10\) must be a multiple of 4 for layout 'contiguous'"):
        positions(10, 0, 4, "contiguous")
    with pytest.raises(ValueError, match="rank must be in"):
        positions(8, 4, 4)
    with pytest.raises(ValueError, match="layout must be one of"):
        shard(torch.randn(1, 8, 2, 4), 0, 2, "striped")
    with pytest.raises(ValueError, match=r"local_seqlens \[5, 4\] must add up to x.shape\[1\] \(8\), got 9"):
        shard(torch.randn(1, 8, 2, 4), 0, 2, "contiguous", local_seqlens=[5, 4])
    with pytest.raises(ValueError, match=r"local_seqlens \(uneven shards\) needs layout='contiguous'"):
        shard(torch.randn(1, 8, 2, 4), 0, 2, local_seqlens=[4, 4])
    with pytest.raises(ValueError, match="local_seqlens must hold the local seqlen of each of the 2 ranks"):
        positions(8, 0, 2, "contiguous", local_seqlens=[8])
    with pytest.raises(ValueError, match="layout 'zigzag' needs shards of one length"):
        unshard([torch.randn(1, 4, 2, 4), torch.randn(1, 2, 2, 4)])


@pytest.mark.parametrize(("world_size", "layout", "local_seqlens"), [
    *((w, layout, None) for w in (1, 2, 3, 5, 8) for layout in ("zigzag", "contiguous")),
    (2, "contiguous", (5, 3)), (4, "contiguous", (7, 1, 4, 6)), (5, "contiguous", (0, 3, 0, 0, 2))])
def test_ring_steps_cover_the_causal_mask_once(world_size, layout, local_seqlens):
    """The (query, key) pairs that the ring's steps attend, over all ranks and steps, are the causal mask's,
    each once; with zigzag every rank computes the same number of scores."""
    chunk = 3
    seqlen = sum(local_seqlens) if local_seqlens else chunk * (2 * world_size if layout == "zigzag" else world_size)
    local = local_seqlens or (seqlen // world_size,) * world_size
    seen = torch.zeros(seqlen, seqlen, dtype=torch.int64)
    work = []
    for rank in range(world_size):
        rows_at = positions(seqlen, rank, world_size, layout, local_seqlens=local_seqlens)
        scores = 0
        for step in range(world_size):
            source = (rank - step) % world_size
            block = _block(layout, True, rank, source, local[rank], local[source])
            if block is None:
                continue
            rows, keys, causal = block
            k_pos = positions(seqlen, source, world_size, layout, local_seqlens=local_seqlens)[keys]
            q_pos = rows_at[rows]
            visible = torch.ones(len(q_pos), len(k_pos), dtype=torch.bool)
            if causal:
                visible = visible.tril()
            seen[q_pos[:, None], k_pos[None, :]] += visible.long()
            scores += int(visible.sum())
        work.append(scores)
    assert torch.equal(seen, torch.ones(seqlen, seqlen, dtype=torch.int64).tril())
    if layout == "zigzag":
        assert len(set(work)) == 1, work
    assert math.isclose(sum(work), seqlen * (seqlen + 1) / 2)


def test_benchmark_dry_run(tmp_path):
    """benchmarks/parallel.py's plumbing on CPU (2 gloo ranks, tiny sizes): a row per method and length,
    each timed, and the Markdown table."""
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, "-m", "benchmarks", "parallel", "--dry-run", "--out", str(tmp_path)],
                         cwd=root, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    with open(tmp_path / "parallel.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["method"], r["seqlen"]) for r in rows] == [
        (method, seqlen) for method in ("single", "ring", "ulysses") for seqlen in ("64", "96")]
    assert all(float(r["step_ms"]) > 0 for r in rows)
    assert all(r["comm_ms"] and r["compute_ms"] for r in rows if r["method"] == "ring")
    assert "| ring | 2 | 64 |" in (tmp_path / "parallel.md").read_text()
