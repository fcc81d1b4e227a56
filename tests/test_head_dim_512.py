"""Issue 21, item 3: q and k head dims d up to 512 (Gemma 4's global layers), v's dv up to d as before.

On CUDA the sm80 family's kernel compiled for 512 serves every d from 257 to 512 (the columns past d
zero-filled on load), forward and backward, on every GPU (the sm90 family's kernels end at 256); the
public functions first pad d and dv each to a multiple of 8, as for any head dim
(flashattn.interface._kernel_padding). On CPU tensors flashattn.cpu computes them as they are.
flash_attn_with_kvcache stays at d <= 256 (flashattn.cpu.MAX_KVCACHE_HEAD_DIM; its kernels end there),
with an error that names the function.

The checks and bounds are those of each layout's own sweep, reused as tests/test_mla_head_dims.py
reuses them (style.md's: the fp32 reference, twice PyTorch's same-dtype error for outputs, three times
for gradients, poisoned outputs, fresh inputs per case): tests/test_features.py (padded batches: causal,
windows, softcap, ALiBi, dropout, MHA/GQA/MQA, Sq != Sk both ways), tests/test_varlen.py (cu_seqlens,
lengths 0 and 1), tests/test_paged_varlen.py (block_table) and tests/test_model_features.py (learnable
sinks, through out and the LSE). Sequences stay at 300 rows or fewer (the reference is O(Sq Sk d)),
but for one causal case of 1024 x 1023.

(d, dv): (512, 512), the kernel's own; (320, 320), a d that runs on it zero-filled; (488, 200), neither
a multiple of 64, v narrower than q and k (at most 256 columns: one of the forward's column chunks of
O, where 512 takes two); and, where the Python padding is the point, (509, 301), which
the public functions pad to 512 / 304 (the top of the range).
"""

import itertools
import os
import re
import subprocess
import sys

import pytest
import test_mla_head_dims as mla
import torch
from helpers import DEVICES, case_seed, poisoned_allocations, random_qkv, run_backward
from test_features import BATCH, CPU_SEQLENS, FEATURES, HEADS, MASKS, feature_options
from test_features import _check_backward as check_padded_backward
from test_features import _check_forward as check_padded_forward
from test_kvcache import make_case as kvcache_case
from test_model_features import OPTIONS as SINK_OPTIONS
from test_model_features import _assert_forward, _assert_grads, _inputs
from test_paged_varlen import _check_paged_backward as check_paged_backward
from test_paged_varlen import _check_paged_forward as check_paged_forward
from test_varlen import LENGTHS, packed_batch
from test_varlen import _check_backward as check_varlen_backward
from test_varlen import _check_forward as check_varlen_forward

from flashattn import (
    KVCache,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)
from flashattn.cpu import MAX_HEAD_DIM, MAX_KVCACHE_HEAD_DIM

GPU = pytest.mark.gpu
HEAD_DIMS = [(512, 512), (320, 320), (488, 200)]
PADDED_DIMS = (509, 301)  # padded by the public functions to (512, 304)
GPU_DTYPES = [torch.float16, torch.bfloat16]
# The features that each head dim below 512 meets: masks, each score feature, dropout, and all at once.
SOME_FEATURES = ["plain", "causal", "window-both", "causal-window", "softcap", "alibi-batch-heads", "dropout",
                 "everything"]  # fmt: skip

# The kernel_path fixture (tests/test_mla_head_dims.py): the CUDA path's padding forced on CPU tensors.
kernel_path = mla.kernel_path


def _dims_id(dims: tuple[int, int]) -> str:
    return f"d{dims[0]}-dv{dims[1]}"


def _id(*parts: object) -> str:
    return "-".join(str(part).removeprefix("torch.").replace(" ", "") for part in parts)


def _shapes(**tensors: torch.Tensor) -> str:
    return ", ".join(f"{name} {tuple(t.shape)}" for name, t in tensors.items())


def test_limits():
    assert (MAX_HEAD_DIM, MAX_KVCACHE_HEAD_DIM) == (512, 256)


# ------------------------------------------------------------------------------------- padded batches


def _padded_gpu_cases() -> list:
    """d512: plain and causal in both dtypes, every feature of tests/test_features.py once (the dtypes
    alternating); (320, 320) and (488, 200): SOME_FEATURES, the dtypes alternating; (509, 301): causal
    and everything. (Sq, Sk) and (H, Hk) cycle."""
    grid = [((512, 512), feature, dtype) for feature, dtype in itertools.product(MASKS, GPU_DTYPES)]
    grid += [((512, 512), feature, GPU_DTYPES[i % 2]) for i, feature in enumerate(FEATURES)]
    grid += [(dims, feature, GPU_DTYPES[i % 2]) for dims in HEAD_DIMS[1:] for i, feature in enumerate(SOME_FEATURES)]
    grid += [(PADDED_DIMS, "causal", torch.float16), (PADDED_DIMS, "everything", torch.bfloat16)]
    cases = []
    for i, (dims, feature, dtype) in enumerate(grid):
        case = (feature, dtype, dims, CPU_SEQLENS[i % len(CPU_SEQLENS)], HEADS[i % len(HEADS)])
        cases.append(pytest.param(*case, id=_id(feature, dtype, _dims_id(dims), *case[3:])))
    return cases


# CPU: d512 plain, causal and with every feature at once, in each dtype; (488, 200) windowed with softcap.
PADDED_CPU = [
    pytest.param("plain", torch.float32, (512, 512), (113, 203), (4, 2), id="plain-float32-d512-q113k203"),
    pytest.param("causal", torch.bfloat16, (512, 512), (203, 113), (4, 1), id="causal-bfloat16-d512-q203k113"),
    pytest.param("everything", torch.float16, (512, 512), (3, 203), (4, 4), id="everything-float16-d512-q3k203"),
    pytest.param("window-softcap", torch.bfloat16, (488, 200), (130, 130), (4, 2), id="window-softcap-d488-dv200"),
]
PADDED_GPU = _padded_gpu_cases()


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
@pytest.mark.parametrize("feature, dtype, dims, seqlens, heads", PADDED_GPU)
def test_backward_gpu(feature, dtype, dims, seqlens, heads):
    check_padded_backward("cuda", feature, dtype, dims[0], seqlens, heads, v_head_dim=dims[1])


@GPU
def test_long_causal_gpu():
    """The one long case: 1024 queries over 1023 keys, causal (the first row sees no key), GQA: many
    key tiles of the d512 kernel, forward and backward."""
    check_padded_forward("cuda", "causal", torch.bfloat16, 512, (1024, 1023), (4, 2), v_head_dim=512)
    check_padded_backward("cuda", "causal", torch.bfloat16, 512, (1024, 1023), (4, 2), v_head_dim=512)


@pytest.mark.parametrize("dims", [PADDED_DIMS, (505, 505)], ids=_dims_id)
def test_kernel_padding_on_cpu(kernel_path, dims):
    """The CUDA path forced on CPU tensors: d up to 512 is padded as any d is (509 and 505 to 512, the
    limit itself), out, LSE and gradients within the bounds."""
    check_padded_forward("cpu", "causal", torch.bfloat16, dims[0], (113, 203), (4, 2), v_head_dim=dims[1])
    check_padded_backward("cpu", "everything", torch.bfloat16, dims[0], (203, 113), (4, 1), v_head_dim=dims[1])
    assert kernel_path and set(kernel_path) == mla._kernel_paddings(dims)


# ----------------------------------------------------------------------------- variable-length batches

# Every head-dim pair plain, causal and with every feature at once, in both dtypes; the batches of
# tests/test_varlen.py's LENGTHS cycling ("mixed" holds sequences of length 0 and 1).
VARLEN_GPU = [
    pytest.param(feature, dtype, dims, lengths, heads, id=_id(feature, dtype, _dims_id(dims), lengths, heads))
    for i, (dims, feature, dtype) in enumerate(itertools.product(HEAD_DIMS, ["plain", "causal", "everything"],
                                                                 GPU_DTYPES))
    for lengths, heads in [(list(LENGTHS)[i % len(LENGTHS)], HEADS[i % len(HEADS)])]
]  # fmt: skip


def test_varlen_cpu():
    check_varlen_forward("cpu", "everything", torch.bfloat16, 512, "mixed", (4, 2), v_head_dim=512)
    check_varlen_backward("cpu", "causal", torch.float16, 488, "mixed", (4, 1), v_head_dim=200)


@GPU
@pytest.mark.parametrize("feature, dtype, dims, lengths, heads", VARLEN_GPU)
def test_varlen_gpu(feature, dtype, dims, lengths, heads):
    check_varlen_forward("cuda", feature, dtype, dims[0], lengths, heads, v_head_dim=dims[1])
    check_varlen_backward("cuda", feature, dtype, dims[0], lengths, heads, v_head_dim=dims[1])


# (feature, page size): pages of 16 rows, and of 256 (a page holds more rows than a key tile).
PAGED = [("causal-window", 16), ("alibi-batch-heads", 256)]


def test_paged_cpu():
    check_paged_forward("cpu", "causal", torch.float32, 512, "mixed", (4, 2), 16, v_head_dim=512)
    check_paged_backward("cpu", "dropout", torch.bfloat16, 488, "mixed", (4, 2), 256, False, v_head_dim=200)


@GPU
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("feature, page_size", PAGED, ids=[f"{f}-p{p}" for f, p in PAGED])
@pytest.mark.parametrize("dims", HEAD_DIMS, ids=_dims_id)
def test_paged_gpu(dims, feature, page_size, dtype):
    """flash_attn_varlen_func over k and v pages (block_table), forward and backward; the backward by
    atomics in fp16, deterministic in bf16."""
    check_paged_forward("cuda", feature, dtype, dims[0], "mixed", (4, 2), page_size, v_head_dim=dims[1])
    check_paged_backward("cuda", feature, dtype, dims[0], "mixed", (4, 1), page_size, dtype == torch.bfloat16,
                         v_head_dim=dims[1])  # fmt: skip


# ------------------------------------------------------------------------------------- learnable sinks

# (batch, seqlen_q, seqlen_k, nheads, nheads_k): Sq != Sk both ways, GQA/MQA/MHA.
SINK_SHAPES = [(2, 3, 113, 4, 2), (1, 203, 67, 6, 1), (2, 130, 257, 4, 4)]


def _sink_cases() -> list:
    """d512 with every option of tests/test_model_features.py (causal, windows, softcap with ALiBi), the
    other pairs causal and with everything; on CUDA in both dtypes, on CPU two cases."""
    grid = [((512, 512), options) for options in SINK_OPTIONS]
    grid += [(dims, options) for dims in HEAD_DIMS[1:] for options in (SINK_OPTIONS[1], SINK_OPTIONS[5])]
    cases = []
    for i, (dims, options) in enumerate(grid):
        shape = SINK_SHAPES[i % len(SINK_SHAPES)]
        for dtype in GPU_DTYPES:
            case = (dims, options, shape, "cuda", dtype)
            cases.append(pytest.param(*case, marks=GPU, id=_id(_dims_id(dims), *options, shape, "cuda", dtype)))
    for dims, options, dtype in [((512, 512), SINK_OPTIONS[5], torch.bfloat16),
                                 ((488, 200), SINK_OPTIONS[3], torch.float32)]:  # fmt: skip
        case = (dims, options, SINK_SHAPES[0], "cpu", dtype)
        cases.append(pytest.param(*case, id=_id(_dims_id(dims), *options, SINK_SHAPES[0], "cpu", dtype)))
    return cases


@pytest.mark.parametrize("dims, options, shape, device, dtype", _sink_cases())
def test_learnable_sink(dims, options, shape, device, dtype):
    """out, LSE and the gradients of q, k, v and the sink, through out and through the LSE
    (tests/test_model_features.py's bounds)."""
    causal, window_size, softcap, alibi = options
    shape = (*shape, dims[0])
    seed = case_seed("hd512 sink", dims, options, shape, dtype)
    q, k, v, dout, sink, dlse, slopes = _inputs(shape, dtype, seed, alibi, device, v_head_dim=dims[1])
    ref_options = {"window_size": window_size, "softcap": softcap, "alibi_slopes": slopes}
    leaves = [t.detach().requires_grad_() for t in (q, k, v, sink)]
    with poisoned_allocations():
        out, lse, _ = flash_attn_func(*leaves[:3], causal=causal, window_size=window_size, softcap=softcap,
                                      alibi_slopes=slopes, return_attn_probs=True, learnable_sink=leaves[3])
    assert out.shape == (*q.shape[:-1], dims[1])
    scale = dims[0] ** -0.5
    _assert_forward(out.detach(), lse.detach(), q, k, v, sink, scale, causal, **ref_options)
    with poisoned_allocations():
        grads = torch.autograd.grad((out.float() * dout.float()).sum() + (lse * dlse).sum(), leaves)
    _assert_grads(grads, q, k, v, sink, dout, dlse, scale, causal, out.detach(), **ref_options)


# ------------------------------------------------------------------------------- deterministic backward

BACKWARD_REPEATS = 3


def _assert_repeatable(q, k, v, dout, scale, causal, options) -> None:
    """deterministic=True: BACKWARD_REPEATS backward passes give the same bits."""
    first = run_backward(q, k, v, dout, scale, causal, True, **options)
    for _ in range(BACKWARD_REPEATS - 1):
        again = run_backward(q, k, v, dout, scale, causal, True, **options)
        for name, grad, want in zip(("dq", "dk", "dv"), again, first):
            assert torch.equal(grad, want), f"{name} differs between runs"


# (dims, feature, (Sq, Sk), (H, Hk)) of the padded cases, in both dtypes: Sq > Sk (causal: rows that see
# no key) and Sq < Sk, GQA and MQA, dropout redrawn by each backward.
DETERMINISTIC = [((512, 512), "causal", (300, 257), (8, 2)), ((320, 320), "dropout-causal-window", (130, 299), (4, 1)),
                 ((488, 200), "everything", (257, 203), (4, 2))]  # fmt: skip


@GPU
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("dims, feature, seqlens, heads", DETERMINISTIC,
                         ids=[_id(_dims_id(c[0]), c[1]) for c in DETERMINISTIC])  # fmt: skip
def test_deterministic_backward_gpu(dims, feature, seqlens, heads, dtype):
    """Within the bounds, and the same bits run after run."""
    check_padded_backward("cuda", feature, dtype, dims[0], seqlens, heads, True, v_head_dim=dims[1])
    seed = case_seed("hd512 deterministic", dims, feature, seqlens, heads, dtype)
    q, k, v = random_qkv(BATCH, *seqlens, *heads, dims[0], dtype, "cuda", seed, v_head_dim=dims[1])
    dout = torch.randn((*q.shape[:-1], dims[1]), generator=torch.Generator("cuda").manual_seed(seed + 1),
                       dtype=dtype, device="cuda")  # fmt: skip
    causal, scale, options = feature_options(feature, BATCH, heads[0], "cuda", seed)
    _assert_repeatable(q, k, v, dout, dims[0] ** -0.5 if scale is None else scale, causal, options)


@GPU
@pytest.mark.parametrize("dims", [(512, 512), (488, 200)], ids=_dims_id)
def test_deterministic_varlen_backward_gpu(dims):
    """A packed batch of uneven sequences (of 0 and 1 rows among them), causal: within the bounds, and
    the same bits run after run."""
    check_varlen_backward("cuda", "causal", torch.bfloat16, dims[0], "mixed", (4, 2), True, v_head_dim=dims[1])
    lengths_q, lengths_k = LENGTHS["mixed"]
    seed = case_seed("hd512 deterministic varlen", dims)
    q, k, v, varlen = packed_batch(lengths_q, lengths_k, (4, 2), dims[0], torch.bfloat16, "cuda", seed, dims[1])
    dout = torch.randn((*q.shape[:-1], dims[1]), generator=torch.Generator("cuda").manual_seed(seed + 1),
                       dtype=q.dtype, device="cuda")  # fmt: skip
    _assert_repeatable(q, k, v, dout, dims[0] ** -0.5, True, varlen)


# ------------------------------------------------------------------------------------ packed functions


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_dim", [512, 320])
def test_packed_functions(device, head_dim):
    """flash_attn_qkvpacked_func and flash_attn_kvpacked_func equal flash_attn_func on the slices, and the
    varlen twins flash_attn_varlen_func, bit for bit: out, LSE and gradients (dropout, ALiBi, a window)."""
    seed = case_seed("hd512 packed", device, head_dim)
    gen = torch.Generator(device=device).manual_seed(seed)
    seqlen = 77
    qkv = torch.randn(BATCH, seqlen, 3, 4, head_dim, generator=gen, dtype=torch.bfloat16, device=device)
    dout = torch.randn(BATCH, seqlen, 4, head_dim, generator=gen, dtype=torch.bfloat16, device=device)
    slopes = 0.3 * torch.rand(4, generator=gen, device=device)
    kwargs = {"causal": True, "window_size": (40, -1), "alibi_slopes": slopes, "dropout_p": 0.1, "deterministic": True}

    def run(func, tensors, *args, dout=dout):
        leaves = tuple(t.detach().requires_grad_() for t in tensors)
        torch.manual_seed(seed)
        out, lse, probs = func(*leaves, *args, return_attn_probs=True, **kwargs)
        return (out, lse, probs, *torch.autograd.grad(out, leaves, dout))

    out, lse, probs, dq, dk, dv = run(flash_attn_func, qkv.unbind(dim=2))
    packed = run(flash_attn_qkvpacked_func, (qkv,))
    assert all(torch.equal(a, b) for a, b in zip(packed, (out, lse, probs, torch.stack((dq, dk, dv), dim=2))))
    kv_packed = run(flash_attn_kvpacked_func, (qkv[:, :, 0], qkv[:, :, 1:]))
    assert all(torch.equal(a, b) for a, b in zip(kv_packed, (out, lse, probs, dq, torch.stack((dk, dv), dim=2))))

    tokens, flat_dout = qkv.flatten(0, 1), dout.flatten(0, 1)  # BATCH sequences of `seqlen`
    cu = torch.arange(0, (BATCH + 1) * seqlen, seqlen, dtype=torch.int32, device=device)
    out, lse, probs, dq, dk, dv = run(flash_attn_varlen_func, tokens.unbind(dim=1), cu, cu, seqlen, seqlen,
                                      dout=flat_dout)  # fmt: skip
    packed = run(flash_attn_varlen_qkvpacked_func, (tokens,), cu, seqlen, dout=flat_dout)
    assert all(torch.equal(a, b) for a, b in zip(packed, (out, lse, probs, torch.stack((dq, dk, dv), dim=1))))
    kv_packed = run(flash_attn_varlen_kvpacked_func, (tokens[:, 0], tokens[:, 1:]), cu, cu, seqlen, seqlen,
                    dout=flat_dout)  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip(kv_packed, (out, lse, probs, dq, torch.stack((dk, dv), dim=1))))


# ---------------------------------------------------------------------------- GPUs with less shared memory

_SMALL_SMEM_CHECK = """
import torch, test_features
for dtype in (torch.float16, torch.bfloat16):
    test_features._check_forward("cuda", "causal", dtype, 512, (300, 257), (4, 2), v_head_dim=512)
print("forward ok", flush=True)
test_features._check_backward("cuda", "causal", torch.bfloat16, 512, (300, 257), (4, 2), v_head_dim=512)
print("backward ran")
"""


@GPU
@pytest.mark.parametrize("smem_bytes", [99 * 1024, 163 * 1024], ids=["sm86-sm89", "a100"])
def test_shared_memory_of_other_gpus(smem_bytes):
    """Under the shared memory per block of sm_86/sm_89 (99 KB) and of the A100 (163 KB), which
    FLASHATTN_MAX_SMEM_PER_BLOCK gives the H100: the d512 forward runs on tiles that fit, within the
    bounds; the backward, whose one config needs sm_90's shared memory, is a clear error (not a wrong
    result)."""
    env = {**os.environ, "FLASHATTN_MAX_SMEM_PER_BLOCK": str(smem_bytes)}
    result = subprocess.run([sys.executable, "-c", _SMALL_SMEM_CHECK], cwd=os.path.dirname(__file__), env=env,
                            capture_output=True, text=True)  # fmt: skip
    assert "forward ok" in result.stdout, result.stderr[-3000:]
    assert result.returncode != 0 and "backward ran" not in result.stdout
    assert f"allows {smem_bytes} bytes of shared memory per block" in result.stderr, result.stderr[-3000:]


# --------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("device", DEVICES)
def test_head_dim_513_is_refused(device):
    """One past the limit: a ValueError naming the head dim, the shapes and the accepted range, from the
    padded and the varlen functions (on CUDA from the binding: the public functions pad nothing past 512)."""
    dtype = torch.float32 if device == "cpu" else torch.float16
    q, k, v = random_qkv(1, 6, 6, 2, 2, 513, dtype, device, case_seed("hd513", device))
    accepted = "is not supported; accepted: 1 to 512"
    with pytest.raises(ValueError, match=re.escape(f"headdim 513 ({_shapes(q=q, k=k, v=v)}) {accepted}")):
        flash_attn_func(q, k, v)
    cu = torch.tensor([0, 6], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=re.escape(f"headdim 513 ({_shapes(q=q[0], k=k[0], v=v[0])}) {accepted}")):
        flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 6, 6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_dim", [264, 512])
def test_kvcache_refuses_head_dims_over_256(device, head_dim):
    """flash_attn_with_kvcache (and KVCache.attend on it) keep the KV-cache kernels' limit of 256: a
    ValueError that names the function and the range."""
    dtype = torch.float32 if device == "cpu" else torch.float16
    case = kvcache_case(device, dtype, 2, 1, 1, 4, 2, head_dim, None, case_seed("hd512 kvcache", device, head_dim))
    words = f"headdim {head_dim} is not supported by flash_attn_with_kvcache; accepted: 1 to 256"
    with pytest.raises(ValueError, match=re.escape(words)):
        flash_attn_with_kvcache(**case)
    cache = KVCache(batch=2, max_seqlen=8, num_heads_k=2, head_dim=head_dim, device=device, dtype=dtype)
    with pytest.raises(ValueError, match=re.escape(words)):
        cache.attend(0, case["q"], case["k"], case["v"])


def test_kvcache_head_dim_is_not_padded_past_256(kernel_path):
    """On the CUDA path a KV-cache head dim past 256 reaches the operator as given (no padded copy of
    the caches for a call that fails), so that the error names the caller's head dim: 300, not 304."""
    case = kvcache_case("cpu", torch.float32, 2, 1, 1, 4, 2, 300, None, case_seed("hd300 kvcache"))
    with pytest.raises(ValueError, match=re.escape("headdim 300 is not supported by flash_attn_with_kvcache")):
        flash_attn_with_kvcache(**case)
    assert set(kernel_path) == {(0, 0)}
