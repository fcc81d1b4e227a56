"""Issue 21, item 2: a head dim of v (dv) below that of q and k (d), as DeepSeek MLA's (192 / 128 in
training and prefill) and QK 128 / V 64 style pairs.

q and k have d, v has dv <= d; out, dout and dV have dv, dQ and dK d; the LSE does not depend on v. On
CPU tensors flashattn.cpu computes dv columns as they are. On CUDA the kernels read dv columns of v
(kernels compiled for a narrower V where one is: 192 / 128 in sm90's forward and sm80's backward);
the public functions pad d and dv each to a multiple of 8 for them and slice the results back
(flashattn.interface._kernel_padding). The
`kernel_path` cases run that padding on CPU tensors too, forced, so that CI covers it. The checks and bounds are those of each layout's own sweep
(style.md's: the fp32 reference, twice PyTorch's same-dtype error for outputs, three times for
gradients, poisoned outputs): tests/test_features.py (padded batches: causal, windows, softcap, ALiBi,
dropout, MHA/GQA/MQA, Sq != Sk both ways), tests/test_varlen.py (cu_seqlens, lengths 0 and 1),
tests/test_paged_varlen.py (block_table), tests/test_model_features.py (learnable sinks, through out
and the LSE) and tests/test_kvcache.py (the cache after the append, exactly).
"""

import itertools
import re

import pytest
import torch
from helpers import DEVICES, case_seed, max_abs_diff, poisoned_allocations, random_qkv, rounding_floor
from test_features import CPU_SEQLENS, FEATURES, GPU_SEQLENS, HEADS, MASKS
from test_features import _check_backward as check_padded_backward
from test_features import _check_forward as check_padded_forward
from test_kvcache import check as check_kvcache
from test_kvcache import make_case as kvcache_case
from test_model_features import _assert_forward, _assert_grads, _inputs
from test_paged_varlen import _check_paged_backward as check_paged_backward
from test_paged_varlen import _check_paged_forward as check_paged_forward
from test_varlen import GPU_LENGTHS, packed_batch
from test_varlen import _check_backward as check_varlen_backward
from test_varlen import _check_forward as check_varlen_forward

from flashattn import (
    KVCache,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_with_kvcache,
    flash_attn_interface,
    interface,
    kvcache,
)
from flashattn.flash_attn_interface import _flash_attn_backward, _flash_attn_varlen_backward
from flashattn.flash_attn_interface import _wrapped_flash_attn_forward, _wrapped_flash_attn_varlen_forward
from flashattn.interface import _flash_attn_forward

GPU = pytest.mark.gpu
# (d, dv): q's and k's head dim, v's. (59, 17): neither a multiple of 8, so that on CUDA both paddings run.
HEAD_DIMS = [(192, 128), (128, 64), (96, 64), (64, 32), (59, 17)]
CPU_DTYPES = [torch.float16, torch.bfloat16, torch.float32]
GPU_DTYPES = [torch.float16, torch.bfloat16]


def _dims_id(dims: tuple[int, int]) -> str:
    return f"d{dims[0]}-dv{dims[1]}"


def _id(*parts: object) -> str:
    return "-".join(str(part).removeprefix("torch.").replace(" ", "") for part in parts)


@pytest.fixture
def kernel_path(monkeypatch) -> list[tuple[int, int]]:
    """Runs the CUDA path's padding on CPU tensors (interface._runs_on_kernels forced): q and k zero-padded
    to the kernels' multiple of 8, v to its own, out and the gradients sliced back. The list collects
    each call's padding (of q and k, of v), so that a test sees that the path ran and what it padded."""
    paddings = []
    kernel_padding = interface._kernel_padding

    def recorded(*args, **kwargs):
        paddings.append(tuple(kernel_padding(*args, **kwargs)))
        return kernel_padding(*args, **kwargs)

    monkeypatch.setattr(interface, "_runs_on_kernels", lambda q: True)
    for module in (interface, flash_attn_interface, kvcache):
        monkeypatch.setattr(module, "_kernel_padding", recorded)
    return paddings


def _kernel_paddings(*dims: tuple[int, int]) -> set[tuple[int, int]]:
    """The padding of q and k, and of v, that the kernel path gives each (d, dv)."""
    return {(-d % 8, -dv % 8) for d, dv in dims}


# ------------------------------------------------------------------------------------- padded batches


def _cases(grid, sizes: list) -> list:
    """pytest params (feature, dtype, dims, size, heads) of (dims, feature, dtype) triples; the sizes ((Sq, Sk)
    or a batch of lengths) and (H, Hk) cycling."""
    cases = []
    for i, (dims, feature, dtype) in enumerate(grid):
        case = (feature, dtype, dims, sizes[i % len(sizes)], HEADS[i % len(HEADS)])
        cases.append(pytest.param(*case, id=_id(feature, dtype, _dims_id(dims), *case[3:])))
    return cases


def _cpu_grid(pairs) -> list:
    """(dims, feature) pairs with the CPU's dtypes cycling."""
    return [(dims, feature, CPU_DTYPES[i % len(CPU_DTYPES)]) for i, (dims, feature) in enumerate(pairs)]


# CPU: every head-dim pair plain and causal, and every feature of tests/test_features.py once (the pairs
# cycling); GPU: every pair x feature x dtype.
PADDED_CPU = _cases(_cpu_grid([*itertools.product(HEAD_DIMS, MASKS), *zip(itertools.cycle(HEAD_DIMS), FEATURES)]),
                    CPU_SEQLENS)  # fmt: skip
PADDED_GPU = _cases(itertools.product(HEAD_DIMS, [*MASKS, *FEATURES], GPU_DTYPES), GPU_SEQLENS)


@pytest.mark.parametrize("feature, dtype, dims, seqlens, heads", PADDED_CPU)
def test_forward_cpu(feature, dtype, dims, seqlens, heads):
    check_padded_forward("cpu", feature, dtype, dims[0], seqlens, heads, v_head_dim=dims[1])


@pytest.mark.parametrize("feature, dtype, dims, seqlens, heads", PADDED_CPU)
def test_backward_cpu(feature, dtype, dims, seqlens, heads):
    check_padded_backward("cpu", feature, dtype, dims[0], seqlens, heads, v_head_dim=dims[1])


@GPU
@pytest.mark.parametrize("feature, dtype, dims, seqlens, heads", PADDED_GPU)
def test_forward_gpu(feature, dtype, dims, seqlens, heads):
    check_padded_forward("cuda", feature, dtype, dims[0], seqlens, heads, v_head_dim=dims[1])


@GPU
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("feature, dtype, dims, seqlens, heads", PADDED_GPU)
def test_backward_gpu(feature, dtype, dims, seqlens, heads, deterministic):
    check_padded_backward("cuda", feature, dtype, dims[0], seqlens, heads, deterministic, v_head_dim=dims[1])


@pytest.mark.parametrize("feature", ["causal", "everything"])
@pytest.mark.parametrize("dims", [(192, 128), (59, 17)], ids=_dims_id)
def test_kernel_padding_on_cpu(kernel_path, dims, feature):
    """The CUDA path (d and dv each zero-padded to a multiple of 8, out sliced back, the gradients by
    autograd), forced on CPU tensors: out, LSE and gradients within the bounds, v never padded to d."""
    check_padded_forward("cpu", feature, torch.bfloat16, dims[0], (113, 203), (4, 2), v_head_dim=dims[1])
    check_padded_backward("cpu", feature, torch.bfloat16, dims[0], (203, 113), (4, 1), v_head_dim=dims[1])
    assert kernel_path and set(kernel_path) == _kernel_paddings(dims)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dims", [(192, 128), (59, 17)], ids=_dims_id)
def test_zero_columns_of_v_are_zero_columns_of_out(device, dims):
    """Why the padding is exact: v with zero columns appended gives out with zero columns appended
    (exactly) and the same LSE (bitwise: the scores do not see v); its first dv columns are out."""
    head_dim, v_head_dim = dims
    q, k, v = random_qkv(2, 77, 130, 4, 2, head_dim, torch.bfloat16, device, case_seed("zero columns", dims),
                         v_head_dim=v_head_dim)  # fmt: skip
    out, lse = _flash_attn_forward(q, k, v, head_dim**-0.5, True)
    wide, wide_lse = _flash_attn_forward(q, k, torch.nn.functional.pad(v, (0, head_dim - v_head_dim)),
                                         head_dim**-0.5, True)  # fmt: skip
    assert out.shape == (2, 77, 4, v_head_dim) and wide.shape == q.shape
    assert torch.equal(wide[..., v_head_dim:], torch.zeros_like(wide[..., v_head_dim:]))
    assert torch.equal(lse, wide_lse)
    # One computation on CUDA (the padding); on CPU the products with more columns may round apart, by
    # at most one rounding to bf16.
    assert max_abs_diff(out, wide[..., :v_head_dim]) <= rounding_floor(wide, out.dtype)


# ----------------------------------------------------------------------------- variable-length batches


# Every head-dim pair causal and with every score feature at once, on batches with sequences of length 0
# and 1; on the GPU also plain, in both dtypes, the long batch too.
VARLEN_CPU = _cases(_cpu_grid(itertools.product(HEAD_DIMS, ["causal", "everything"])), ["mixed"])
VARLEN_GPU = _cases(itertools.product(HEAD_DIMS, ["plain", "causal", "everything"], GPU_DTYPES), list(GPU_LENGTHS))


@pytest.mark.parametrize("feature, dtype, dims, lengths, heads", VARLEN_CPU)
def test_varlen_cpu(feature, dtype, dims, lengths, heads):
    check_varlen_forward("cpu", feature, dtype, dims[0], lengths, heads, v_head_dim=dims[1])
    check_varlen_backward("cpu", feature, dtype, dims[0], lengths, heads, v_head_dim=dims[1])


@GPU
@pytest.mark.parametrize("feature, dtype, dims, lengths, heads", VARLEN_GPU)
def test_varlen_gpu(feature, dtype, dims, lengths, heads):
    check_varlen_forward("cuda", feature, dtype, dims[0], lengths, heads, v_head_dim=dims[1])
    check_varlen_backward("cuda", feature, dtype, dims[0], lengths, heads, v_head_dim=dims[1])


@pytest.mark.parametrize("dims", [(192, 128), (59, 17)], ids=_dims_id)
def test_varlen_kernel_padding_on_cpu(kernel_path, dims):
    check_varlen_forward("cpu", "everything", torch.bfloat16, dims[0], "mixed", (4, 2), v_head_dim=dims[1])
    check_varlen_backward("cpu", "causal", torch.float16, dims[0], "mixed", (4, 1), v_head_dim=dims[1])
    assert kernel_path and set(kernel_path) == _kernel_paddings(dims)


# (feature, page size): pages of 16 rows, of one row, of 7 (not a tile fraction).
PAGED = [("causal-window", 16), ("alibi-batch-heads", 1), ("dropout", 7)]


@pytest.mark.parametrize("dims, feature, page_size", [(dims, *paged) for dims, paged in zip(HEAD_DIMS[::2], PAGED)],
                         ids=[f"{_dims_id(dims)}-{f}-p{p}" for dims, (f, p) in zip(HEAD_DIMS[::2], PAGED)])
def test_paged_cpu(dims, feature, page_size):
    """flash_attn_varlen_func over k and v pages (v's pages of head dim dv), forward and backward (dV
    comes back page-shaped, dv wide)."""
    check_paged_forward("cpu", feature, torch.float32, dims[0], "mixed", (4, 2), page_size, v_head_dim=dims[1])
    check_paged_backward("cpu", feature, torch.bfloat16, dims[0], "mixed", (4, 2), page_size, False,
                         v_head_dim=dims[1])  # fmt: skip


@GPU
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("feature, page_size", PAGED, ids=[f"{f}-p{p}" for f, p in PAGED])
@pytest.mark.parametrize("dims", HEAD_DIMS, ids=_dims_id)
def test_paged_gpu(dims, feature, page_size, dtype):
    check_paged_forward("cuda", feature, dtype, dims[0], "long", (4, 2), page_size, v_head_dim=dims[1])
    check_paged_backward("cuda", feature, dtype, dims[0], "mixed", (4, 1), page_size, True, v_head_dim=dims[1])


def test_paged_kernel_padding_on_cpu(kernel_path):
    check_paged_forward("cpu", "causal", torch.bfloat16, 59, "mixed", (4, 2), 16, v_head_dim=17)
    check_paged_backward("cpu", "causal", torch.bfloat16, 192, "mixed", (4, 2), 7, False, v_head_dim=128)
    assert kernel_path and set(kernel_path) == _kernel_paddings((59, 17), (192, 128))


# ------------------------------------------------------------------------------------- learnable sinks

# (batch, seqlen_q, seqlen_k, nheads, nheads_k) and (causal, window_size): Sq != Sk both ways, GQA/MQA.
SINK_SHAPES = [(2, 3, 113, 4, 2), (1, 203, 67, 6, 1), (2, 130, 257, 4, 4)]
SINK_MASKS = [(False, (-1, -1)), (True, (-1, -1)), (False, (31, 5))]


def _sink_cases() -> list:
    """Every head-dim pair x mask, the shapes cycling; on CPU one dtype each (cycling), on CUDA both."""
    cases = []
    for i, (dims, mask) in enumerate(itertools.product(HEAD_DIMS, SINK_MASKS)):
        shape = SINK_SHAPES[i % len(SINK_SHAPES)]
        devices = [("cpu", CPU_DTYPES[i % len(CPU_DTYPES)], ()), *(("cuda", dtype, GPU) for dtype in GPU_DTYPES)]
        for device, dtype, marks in devices:
            case = (dims, mask, shape, device, dtype)
            cases.append(pytest.param(*case, marks=marks, id=_id(_dims_id(dims), *mask, shape, device, dtype)))
    return cases


@pytest.mark.parametrize("dims, mask, shape, device, dtype", _sink_cases())
def test_learnable_sink(dims, mask, shape, device, dtype):
    """A sink with v narrower than q and k: out, LSE and the gradients of q, k, v and the sink, through
    out and through the LSE (tests/test_model_features.py's bounds)."""
    causal, window_size = mask
    shape = (*shape, dims[0])
    seed = case_seed("mla sink", dims, mask, dtype)
    q, k, v, dout, sink, dlse, _ = _inputs(shape, dtype, seed, device=device, v_head_dim=dims[1])
    leaves = [t.detach().requires_grad_() for t in (q, k, v, sink)]
    with poisoned_allocations():
        out, lse, _ = flash_attn_func(*leaves[:3], causal=causal, window_size=window_size, return_attn_probs=True,
                                      learnable_sink=leaves[3])  # fmt: skip
    assert out.shape == (*q.shape[:-1], dims[1])
    scale = dims[0] ** -0.5
    _assert_forward(out.detach(), lse.detach(), q, k, v, sink, scale, causal, window_size=window_size)
    with poisoned_allocations():
        grads = torch.autograd.grad((out.float() * dout.float()).sum() + (lse * dlse).sum(), leaves)
    _assert_grads(grads, q, k, v, sink, dout, dlse, scale, causal, out.detach(), window_size=window_size)


# ------------------------------------------------------------------------------------------- KV cache

# (seqlen_q, seqlen_new, page, num_splits): decoding split in 3, a few rows appended to a paged cache,
# a chunk over a cache of pages of 5 rows.
KVCACHE_CASES = [(1, 1, None, 3), (4, 3, 16, 0), (40, 0, 5, 1)]


def _check_kvcache(device, dtype, dims, case, causal=True):
    seqlen_q, seqlen_new, page, num_splits = case
    seed = case_seed("mla kvcache", device, dtype, dims, case)
    arguments = kvcache_case(device, dtype, 2, seqlen_q, seqlen_new, 4, 2, dims[0], page, seed, v_head_dim=dims[1])
    out = check_kvcache(arguments, causal=causal, num_splits=num_splits)
    assert out.shape == (2, seqlen_q, 4, dims[1])


@pytest.mark.parametrize("case", KVCACHE_CASES, ids=lambda c: _id(*c))
@pytest.mark.parametrize("dims", HEAD_DIMS, ids=_dims_id)
def test_kvcache_cpu(dims, case):
    """flash_attn_with_kvcache with v_cache (and the new v) narrower than q and k_cache: out within the
    bound, both caches after the append equal the reference's exactly."""
    _check_kvcache("cpu", torch.bfloat16, dims, case)


@GPU
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("case", KVCACHE_CASES, ids=lambda c: _id(*c))
@pytest.mark.parametrize("dims", HEAD_DIMS, ids=_dims_id)
def test_kvcache_gpu(dims, case, dtype):
    _check_kvcache("cuda", dtype, dims, case)


@pytest.mark.parametrize("dims", [(192, 128), (59, 17)], ids=_dims_id)
def test_kvcache_kernel_padding_on_cpu(kernel_path, dims):
    """The CUDA path: the caches in place where their head dims are multiples of 8; padded copies where
    not (59 / 17), the appended rows copied back into the caller's caches."""
    for case in KVCACHE_CASES:
        _check_kvcache("cpu", torch.bfloat16, dims, case)
    assert kernel_path and set(kernel_path) == _kernel_paddings(dims)


@pytest.mark.parametrize("device", DEVICES)
def test_kvcache_class_takes_v_head_dim(device):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    cache = KVCache(batch=2, max_seqlen=40, num_heads_k=2, head_dim=64, device=device, dtype=dtype, page_size=16,
                    v_head_dim=32)  # fmt: skip
    q, k, v = random_qkv(2, 1, 1, 4, 2, 64, dtype, device, case_seed("mla cache class"), v_head_dim=32)
    out = cache.attend(0, q, k, v, causal=True)
    cache.advance(1)
    assert out.shape == (2, 1, 4, 32) and cache.v[0].shape[-1] == 32
    assert torch.equal(out, v.repeat_interleave(2, dim=2))  # one key: out is its value


# ----------------------------------------------------------------- flash-attn's private entry points


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("varlen", [False, True], ids=["padded", "varlen"])
def test_private_entry_points(device, varlen):
    """_flash_attn_forward / _flash_attn_backward (and the varlen pair), as ring-attention libraries
    call them: out and the gradients written into the caller's dq, dk, dv are those of the public
    function (deterministic: bitwise)."""
    head_dim, v_head_dim, scale = 96, 64, 0.1
    seed = case_seed("mla private", device, varlen)
    if varlen:
        q, k, v, cu = packed_batch([5, 0, 77], [9, 3, 60], (4, 2), head_dim, torch.bfloat16, device, seed, v_head_dim)
        args = (cu["cu_seqlens_q"], cu["cu_seqlens_k"], cu["max_seqlen_q"], cu["max_seqlen_k"])
    else:
        q, k, v = random_qkv(2, 77, 60, 4, 2, head_dim, torch.bfloat16, device, seed, v_head_dim=v_head_dim)
        args = ()
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    if varlen:
        want = flash_attn_varlen_func(*leaves, *args, softmax_scale=scale, causal=True, deterministic=True)
        out, lse, _, _ = _wrapped_flash_attn_varlen_forward(q, k, v, *args, 0.0, scale, True)
    else:
        want = flash_attn_func(*leaves, softmax_scale=scale, causal=True, deterministic=True)
        out, lse, _, _ = _wrapped_flash_attn_forward(q, k, v, 0.0, scale, True, -1, -1, 0.0, None, False)
    assert torch.equal(out, want)
    dout = torch.randn_like(out)
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    if varlen:
        _flash_attn_varlen_backward(dout, q, k, v, out, lse, *grads, *args, 0.0, scale, True, -1, -1, 0.0, None, True)
    else:
        _flash_attn_backward(dout, q, k, v, out, lse, *grads, 0.0, scale, True, -1, -1, 0.0, None, True)
    for name, grad, expected in zip(("dq", "dk", "dv"), grads, torch.autograd.grad(want, leaves, dout)):
        assert torch.equal(grad, expected), name


# ----------------------------------------------------------------------------- torch.compile, opcheck

OPCHECK_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


@pytest.mark.parametrize("varlen", [False, True], ids=["padded", "varlen"])
def test_opcheck(varlen):
    """The operators with dv < d (CPU: the CUDA operators take dv == d until the kernels do): schemas,
    fakes (out of dv columns, dv of v's shape) and autograd as torch.library checks them."""
    seed = case_seed("mla opcheck", varlen)
    if varlen:
        q, k, v, cu = packed_batch([5, 0, 40], [9, 3, 30], (4, 2), 48, torch.bfloat16, "cpu", seed, 24)
        options = (None, 0.0, None, cu["cu_seqlens_q"], cu["cu_seqlens_k"], cu["max_seqlen_q"], cu["max_seqlen_k"])
    else:
        q, k, v = random_qkv(2, 17, 33, 4, 2, 48, torch.bfloat16, "cpu", seed, v_head_dim=24)
        options = ()
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    args = (q, k, v, 0.2, True, False, 20, -1, 0.0, *options)
    results = torch.library.opcheck(torch.ops.flashattn.fwd.default, args, test_utils=OPCHECK_UTILS)
    assert results == dict.fromkeys(OPCHECK_UTILS, "SUCCESS")
    out, lse = torch.ops.flashattn.fwd(*(t.detach() if isinstance(t, torch.Tensor) else t for t in args))
    bwd_args = (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out, lse, 0.2, True, True, 20, -1, 0.0,
                *options)  # fmt: skip
    results = torch.library.opcheck(torch.ops.flashattn.bwd.default, bwd_args, test_utils=OPCHECK_UTILS)
    assert results == dict.fromkeys(OPCHECK_UTILS, "SUCCESS")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("path", ["native", "kernel_path"])
def test_torch_compile(request, device, path):
    """A training step with dv < d traces into one graph (fullgraph) whose out and gradients are eager's,
    bit for bit: the fake implementations give out dv columns (natively, or dv's multiple of 8 before the
    slice on the kernel path)."""
    if path == "kernel_path":
        if device == "cuda":
            pytest.skip("on CUDA the kernel path is the path: the native case runs it")
        request.getfixturevalue("kernel_path")

    def loss_of(q, k, v):
        return (flash_attn_func(q, k, v, softmax_scale=0.2, causal=True, deterministic=True) * 2).sum()

    compiled = torch.compile(loss_of, fullgraph=True, backend="aot_eager")
    seed = case_seed("mla compile", device, path)
    leaves = [t.detach().requires_grad_()
              for t in random_qkv(2, 70, 90, 4, 2, 59, torch.bfloat16, device, seed, "packed", v_head_dim=33)]
    compiled_loss = compiled(*leaves)
    compiled_grads = torch.autograd.grad(compiled_loss, leaves)
    eager_loss = loss_of(*leaves)
    eager_grads = torch.autograd.grad(eager_loss, leaves)
    assert torch.equal(compiled_loss, eager_loss)
    for name, grad, want in zip(("dq", "dk", "dv"), compiled_grads, eager_grads):
        assert grad.shape == want.shape and torch.equal(grad, want), name


# --------------------------------------------------------------------------------------------- errors


def _shapes(**tensors: torch.Tensor) -> str:
    return ", ".join(f"{name} {tuple(t.shape)}" for name, t in tensors.items())


@pytest.mark.parametrize("device", [*DEVICES, pytest.param("kernel_path", id="cpu-kernel-path")])
@pytest.mark.parametrize("v_head_dim", [40, 0], ids=["dv-over-d", "dv-zero"])
def test_bad_v_head_dim(request, device, v_head_dim):
    """dv > d or dv = 0: a ValueError that names v (v_cache) with the shapes and says what is accepted,
    from every function that takes v, on CPU, on CUDA and on the CUDA path forced on CPU."""
    if device == "kernel_path":
        request.getfixturevalue("kernel_path")
        device = "cpu"
    dtype = torch.float32 if device == "cpu" else torch.float16
    q, k, v = random_qkv(1, 6, 6, 4, 2, 32, dtype, device, 0, v_head_dim=v_head_dim)
    accepted = "; accepted: 1 to 32, the headdim of q and k (v's may be smaller, not larger)"
    shapes = _shapes(q=q, k=k, v=v)
    with pytest.raises(ValueError, match=re.escape(f"v has headdim {v_head_dim} ({shapes})" + accepted)):
        flash_attn_func(q, k, v)
    cu = torch.tensor([0, 6], dtype=torch.int32, device=device)
    shapes = _shapes(q=q[0], k=k[0], v=v[0])
    with pytest.raises(ValueError, match=re.escape(f"v has headdim {v_head_dim} ({shapes})" + accepted)):
        flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 6, 6)
    accepted = accepted.replace("k (v's", "k_cache (v_cache's")
    shapes = _shapes(q=q, k_cache=k, v_cache=v)
    with pytest.raises(ValueError, match=re.escape(f"v_cache has headdim {v_head_dim} ({shapes})" + accepted)):
        flash_attn_with_kvcache(q, k, v)


@pytest.mark.parametrize("device", DEVICES)
def test_head_dim_over_512_with_a_narrower_v(device):
    """q and k of head dim 520 are refused whatever v's: the error names the head dim and the limit."""
    dtype = torch.float32 if device == "cpu" else torch.float16
    q, k, v = random_qkv(1, 6, 6, 2, 2, 520, dtype, device, 0, v_head_dim=128)
    with pytest.raises(ValueError, match=re.escape(f"headdim 520 ({_shapes(q=q, k=k, v=v)}) is not supported; "
                                                   "accepted: 1 to 512")):  # fmt: skip
        flash_attn_func(q, k, v)


@pytest.mark.parametrize("device", DEVICES)
def test_kv_cache_new_v_needs_v_caches_head_dim(device):
    dtype = torch.float32 if device == "cpu" else torch.float16
    case = kvcache_case(device, dtype, 2, 1, 1, 4, 2, 64, None, 0, v_head_dim=32)
    case["v"] = torch.randn(2, 1, 2, 64, device=device, dtype=dtype)
    with pytest.raises(ValueError, match=re.escape("v must have shape (2, seqlen_new, 2, 32), got (2, 1, 2, 64)")):
        flash_attn_with_kvcache(**case)


@pytest.mark.parametrize("device", DEVICES)
def test_kvpacked_cannot_hold_a_narrower_v(device):
    """kv packs k and v with one head dim: one other than q's is an error that says to pass k and v
    apart (flash_attn_func, flash_attn_varlen_func)."""
    dtype = torch.float32 if device == "cpu" else torch.float16
    q = torch.randn(2, 5, 4, 64, device=device, dtype=dtype)
    kv = torch.randn(2, 7, 2, 2, 32, device=device, dtype=dtype)
    words = "kv packs k and v with one headdim, which must be q's (64); for a v headdim other than q's pass k and v"
    shapes = "(q (2, 5, 4, 64), kv (2, 7, 2, 2, 32))"
    with pytest.raises(ValueError, match=re.escape(f"head dims differ {shapes}: {words} apart to flash_attn_func")):
        flash_attn_kvpacked_func(q, kv)
    cu = torch.tensor([0, 5, 10], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=re.escape(f"{words} apart to flash_attn_varlen_func")):
        flash_attn_varlen_kvpacked_func(q.flatten(0, 1), kv[:, :5].flatten(0, 1), cu, cu, 5, 5)


def test_operator_backward_needs_dout_of_vs_head_dim():
    """flashattn::bwd takes dout and out with v's head dim: q's is refused, naming both and the shape."""
    q, k, v = random_qkv(1, 6, 6, 4, 2, 32, torch.float32, "cpu", 0, v_head_dim=16)
    out, lse = torch.ops.flashattn.fwd(q, k, v, 0.25, False)
    with pytest.raises(RuntimeError, match=re.escape("dout (1, 6, 4, 32) and out (1, 6, 4, 16) must have the shape "
                                                     "of q (1, 6, 4, 32) with v's headdim, (1, 6, 4, 16)")):
        torch.ops.flashattn.bwd(torch.randn_like(q), q, k, v, out, lse, 0.25, False, False)
