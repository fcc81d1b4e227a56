"""The backward pass against the reference, within the gradient bound of tests/helpers.py.

The sweep is the forward's (tests/test_forward.py). On the GPU it runs the full
cross product. On CPU (CI: two slow cores) a case costs about 2.5 forwards plus
two autograd references, so the CPU sweep is lighter than the forward's; see
_cpu_cases.
"""

import copy
import itertools
import os
import subprocess
import sys

import pytest
import torch
from helpers import (
    DEVICES,
    GRAD_EPS,
    GRAD_FACTOR,
    assert_grads_match_reference,
    case_seed,
    max_abs_diff,
    random_qkv,
    run_backward,
)
from test_forward import BATCH, CAUSAL, DTYPES, HEAD_DIMS, HEADS, SEQLENS, _case_id
from torch import Tensor, nn

from flashattn import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func
from flashattn.reference import attention_ref

# The longest pairs the CPU sweep keeps: several blocks each way, partial last
# blocks and a diagonal one off the block grid. (2048, 2048) adds nothing to them
# on CPU and is left to the GPU.
CPU_LONG_SEQLENS = [(1023, 1024), (1024, 1023)]


def _cpu_cases() -> list:
    """test_forward's CPU cases without (2048, 2048), and with a quarter of those of
    CPU_LONG_SEQLENS: each of their four (pair, mask) combinations takes the head dims of
    one residue of the index modulo 4, so every head dim still meets one long pair. dtype
    and (H, Hk) cycle as in the forward; the residues are chosen so that both dtypes meet
    both long pairs."""
    cases = []
    for (i, head_dim), (j, seqlens), (c, causal) in itertools.product(
        enumerate(HEAD_DIMS), enumerate(SEQLENS), enumerate(CAUSAL)
    ):
        if seqlens == (2048, 2048):
            continue
        if seqlens in CPU_LONG_SEQLENS and i % 4 != CPU_LONG_SEQLENS.index(seqlens) + 2 * c:
            continue
        case = (DTYPES[(i + j + c) % len(DTYPES)], head_dim, seqlens, causal, HEADS[(i + j + c) % len(HEADS)])
        cases.append(pytest.param(*case, id=_case_id(*case)))
    return cases


def _random_dout(shape: tuple[int, ...], dtype: torch.dtype, device: str, seed: int) -> Tensor:
    """A standard normal upstream gradient, drawn apart from the inputs of the same seed."""
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    return torch.randn(shape, generator=gen, dtype=dtype, device=device)


def _check_backward(
    device: str,
    dtype: torch.dtype,
    head_dim: int,
    seqlens: tuple[int, int],
    causal: bool,
    heads: tuple[int, int],
    layout: str = "contiguous",
    deterministic: bool = False,
) -> None:
    seed = case_seed("backward", device, dtype, head_dim, seqlens, causal, heads, layout)
    q, k, v = random_qkv(BATCH, *seqlens, *heads, head_dim, dtype, device, seed, layout)
    dout = _random_dout(q.shape, dtype, device, seed)
    scale = head_dim**-0.5
    grads = run_backward(q, k, v, dout, scale, causal, deterministic)
    assert_grads_match_reference(grads, q, k, v, dout, scale, causal)


@pytest.mark.parametrize("dtype, head_dim, seqlens, causal, heads", _cpu_cases())
def test_backward_cpu(dtype, head_dim, seqlens, causal, heads):
    _check_backward("cpu", dtype, head_dim, seqlens, causal, heads)


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"h{h[0]}kv{h[1]}")
@pytest.mark.parametrize("causal", CAUSAL, ids=["full", "causal"])
@pytest.mark.parametrize("seqlens", SEQLENS, ids=lambda s: f"q{s[0]}k{s[1]}")
@pytest.mark.parametrize("head_dim", HEAD_DIMS, ids=lambda d: f"d{d}")
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_backward_gpu(dtype, head_dim, seqlens, causal, heads, deterministic):
    """Both backward paths: dQ by atomics inside the dK/dV pass, and the deterministic one
    (sm80: two passes, dQ by its own kernel; sm90: one pass, dQ added in a fixed order)."""
    _check_backward("cuda", dtype, head_dim, seqlens, causal, heads, deterministic=deterministic)


# Head dims that HEAD_DIMS skips between the sm90 backward's compiled ones (on the H100 65..96 run
# padded on its d128 kernel): every length pair and mask, dtype and (H, Hk) cycling.
PADDED_HEAD_DIMS = [72, 80, 88]


def _padded_cases() -> list:
    cases = []
    for (i, head_dim), (j, seqlens), (c, causal) in itertools.product(
        enumerate(PADDED_HEAD_DIMS), enumerate(SEQLENS), enumerate(CAUSAL)
    ):
        case = (DTYPES[(i + j + c) % len(DTYPES)], head_dim, seqlens, causal, HEADS[(i + j + c) % len(HEADS)])
        cases.append(pytest.param(*case, id=_case_id(*case)))
    return cases


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, head_dim, seqlens, causal, heads", _padded_cases())
def test_backward_padded_head_dims_gpu(dtype, head_dim, seqlens, causal, heads):
    _check_backward("cuda", dtype, head_dim, seqlens, causal, heads)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["packed", "transposed", "offset"])
@pytest.mark.parametrize(
    "head_dim, seqlens, heads",
    [
        (64, (128, 128), (4, 4)),
        (59, (113, 203), (4, 2)),
        (80, (203, 113), (4, 2)),
        (128, (203, 113), (4, 1)),
    ],
)
@pytest.mark.parametrize("causal", CAUSAL, ids=["full", "causal"])
def test_noncontiguous_views(device, layout, head_dim, seqlens, heads, causal):
    _check_backward(device, torch.bfloat16, head_dim, seqlens, causal, heads, layout)


def test_fp32_on_cpu_only_path():
    _check_backward("cpu", torch.float32, 72, (300, 257), True, (4, 2))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dout_layout", ["transposed", "offset", "broadcast_rows", "scalar"])
@pytest.mark.parametrize("head_dim", [64, 59])
def test_noncontiguous_dout(device, dout_layout, head_dim):
    """The consumer of out decides dout's layout: a transposing or slicing one gives other
    strides, a broadcast one stride 0 (the gradient of out.sum() is a scalar seen as a
    tensor: stride 0 everywhere). The gradients are those of the same values laid out
    contiguously, bit for bit."""
    batch, seqlen, heads, heads_k = 2, 150, 4, 2
    seed = case_seed(device, dout_layout, head_dim)
    q, k, v = random_qkv(batch, seqlen, seqlen, heads, heads_k, head_dim, torch.float16, device, seed)
    if dout_layout == "transposed":
        dout = _random_dout((batch, heads, seqlen, head_dim), torch.float16, device, seed).transpose(1, 2)
    elif dout_layout == "offset":
        dout = _random_dout((batch, seqlen, heads, head_dim + 1), torch.float16, device, seed)[..., 1:]
    elif dout_layout == "broadcast_rows":
        dout = _random_dout((head_dim,), torch.float16, device, seed).expand(batch, seqlen, heads, head_dim)
    else:
        dout = _random_dout((), torch.float16, device, seed).expand(batch, seqlen, heads, head_dim)
    grads = run_backward(q, k, v, dout, 0.1, True, deterministic=True)
    expected = run_backward(q, k, v, dout.contiguous(), 0.1, True, deterministic=True)
    for name, grad, want in zip(("dq", "dk", "dv"), grads, expected):
        assert torch.equal(grad, want), f"{name} depends on the layout of dout"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_dim", [64, 59])
@pytest.mark.parametrize("causal", CAUSAL, ids=["full", "causal"])
def test_packed_gradients_stack_the_unpacked_ones(device, head_dim, causal):
    """The gradient of qkv (kv) is dq, dk, dv of flash_attn_func on its slices, stacked."""
    seed = case_seed(device, head_dim, causal)
    gen = torch.Generator(device=device).manual_seed(seed)
    qkv = torch.randn(BATCH, 150, 3, 4, head_dim, generator=gen, dtype=torch.bfloat16, device=device)
    q, k, v = qkv.unbind(dim=2)
    dout = _random_dout(q.shape, torch.bfloat16, device, seed)
    dq, dk, dv = run_backward(q, k, v, dout, head_dim**-0.5, causal, deterministic=True)

    qkv_leaf = qkv.detach().requires_grad_()
    out = flash_attn_qkvpacked_func(qkv_leaf, causal=causal, deterministic=True)
    (dqkv,) = torch.autograd.grad(out, qkv_leaf, dout)
    assert torch.equal(dqkv, torch.stack((dq, dk, dv), dim=2))

    # kv of 2 heads read by q's 4 (GQA): slices of qkv keep the strides the loop above used.
    q_leaf, kv_leaf = qkv[:, :, 0].detach().requires_grad_(), qkv[:, :, 1:, :2].detach().requires_grad_()
    dq_gqa, dk_gqa, dv_gqa = run_backward(
        q_leaf, *kv_leaf.unbind(dim=2), dout, head_dim**-0.5, causal, deterministic=True
    )
    out = flash_attn_kvpacked_func(q_leaf, kv_leaf, causal=causal, deterministic=True)
    dq_packed, dkv = torch.autograd.grad(out, (q_leaf, kv_leaf), dout)
    assert torch.equal(dq_packed, dq_gqa)
    assert torch.equal(dkv, torch.stack((dk_gqa, dv_gqa), dim=2))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(300, 100), (37, 5)])
def test_causal_rows_that_see_no_key(device, deterministic, seqlen_q, seqlen_k):
    """Causal with Sq > Sk: the first Sq - Sk queries see no key, so their dq is exactly 0
    (their lse is -inf, which must not turn into exp(+inf)), and they add nothing to dk, dv:
    a different dout on those rows leaves dk and dv the same bits."""
    seed = case_seed(device, seqlen_q)
    q, k, v = random_qkv(BATCH, seqlen_q, seqlen_k, 4, 2, 64, torch.bfloat16, device, seed)
    dout = _random_dout(q.shape, torch.bfloat16, device, seed)
    grads = run_backward(q, k, v, dout, 0.125, True, deterministic)
    blind = seqlen_q - seqlen_k
    assert torch.equal(grads[0][:, :blind], torch.zeros_like(grads[0][:, :blind]))
    assert_grads_match_reference(grads, q, k, v, dout, 0.125, True)

    other_dout = dout.clone()
    other_dout[:, :blind] = 100 * _random_dout(other_dout[:, :blind].shape, torch.bfloat16, device, seed + 1)
    _, dk, dv = run_backward(q, k, v, other_dout, 0.125, True, deterministic=True)
    _, dk_want, dv_want = run_backward(q, k, v, dout, 0.125, True, deterministic=True)
    assert torch.equal(dk, dk_want) and torch.equal(dv, dv_want), "the rows that see no key changed dk or dv"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch, seqlen_q, seqlen_k", [(0, 5, 7), (2, 0, 7), (2, 5, 0), (0, 0, 0)])
@pytest.mark.parametrize("causal", CAUSAL, ids=["full", "causal"])
def test_empty_inputs(device, batch, seqlen_q, seqlen_k, causal):
    """Empty batches or sequences give correctly shaped gradients, zero where nothing flows:
    no key leaves out (hence dq) constant 0; no query leaves dk and dv 0."""
    q, k, v = random_qkv(batch, seqlen_q, seqlen_k, 4, 2, 40, torch.float16, device, 0)
    dout = _random_dout(q.shape, torch.float16, device, 0)
    for grad, t in zip(run_backward(q, k, v, dout, 0.1, causal), (q, k, v)):
        assert grad.shape == t.shape and grad.dtype == t.dtype
        assert torch.equal(grad, torch.zeros_like(grad))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch, seqlen_q, seqlen_k", [(0, 5, 5), (2, 0, 0), (2, 5, 0)])
def test_empty_inputs_of_packed_functions(device, batch, seqlen_q, seqlen_k):
    """The packed functions on empty batches or sequences, with a head dim the CUDA path pads:
    out and the gradients of the packed tensors are shaped like them, and zero."""
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(batch, seqlen_q, 4, 59, generator=gen, dtype=torch.bfloat16, device=device)
    kv = torch.randn(batch, seqlen_k, 2, 2, 59, generator=gen, dtype=torch.bfloat16, device=device)
    leaves = (q.requires_grad_(), kv.requires_grad_())
    out = flash_attn_kvpacked_func(*leaves, causal=True)
    assert out.shape == q.shape and torch.equal(out, torch.zeros_like(out))
    for grad, leaf in zip(torch.autograd.grad(out, leaves, torch.ones_like(out)), leaves):
        assert grad.shape == leaf.shape and torch.equal(grad, torch.zeros_like(grad))
    if seqlen_q == seqlen_k:
        qkv = torch.randn(batch, seqlen_q, 3, 4, 59, generator=gen, dtype=torch.bfloat16, device=device)
        out = flash_attn_qkvpacked_func(qkv.requires_grad_())
        (dqkv,) = torch.autograd.grad(out, qkv, torch.ones_like(out))
        assert out.shape == (batch, seqlen_q, 4, 59) and dqkv.shape == qkv.shape
        assert torch.equal(dqkv, torch.zeros_like(dqkv))


class _TinyAttentionBlock(nn.Module):
    """Projections to GQA heads, attention with a pluggable function, and an output projection."""

    def __init__(self, dim: int, num_heads: int, num_heads_k: int, head_dim: int) -> None:
        super().__init__()
        self.heads = (num_heads, num_heads_k, head_dim)
        self.q_proj = nn.Linear(dim, num_heads * head_dim)
        self.k_proj = nn.Linear(dim, num_heads_k * head_dim)
        self.v_proj = nn.Linear(dim, num_heads_k * head_dim)
        self.out_proj = nn.Linear(num_heads * head_dim, dim)

    def forward(self, x: Tensor, attend) -> Tensor:
        num_heads, num_heads_k, head_dim = self.heads
        q = self.q_proj(x).unflatten(-1, (num_heads, head_dim))  # [B, S, H, D]
        k = self.k_proj(x).unflatten(-1, (num_heads_k, head_dim))  # [B, S, Hk, D]
        v = self.v_proj(x).unflatten(-1, (num_heads_k, head_dim))  # [B, S, Hk, D]
        return self.out_proj(attend(q, k, v).flatten(-2))


def _weight_grads(model: nn.Module, x: Tensor, dy: Tensor, attend) -> dict[str, Tensor]:
    params = dict(model.named_parameters())
    grads = torch.autograd.grad(model(x, attend), tuple(params.values()), dy)
    return dict(zip(params, grads))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_gradients_through_a_small_model(device, dtype):
    """The weight gradients of a small attention block, the way training sees the backward:
    ours against the block run with the fp32 reference on fp32 copies of its weights,
    within 3x of the same block run with PyTorch's attention in the input dtype."""
    seed = case_seed("model", device, dtype)
    torch.manual_seed(seed)
    model = _TinyAttentionBlock(dim=96, num_heads=4, num_heads_k=2, head_dim=40).to(device, dtype)
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(2, 150, 96, generator=gen, device=device, dtype=dtype)
    dy = torch.randn(2, 150, 96, generator=gen, device=device, dtype=dtype)

    ours = _weight_grads(model, x, dy, lambda q, k, v: flash_attn_func(q, k, v, causal=True))
    reference = _weight_grads(
        copy.deepcopy(model).float(), x.float(), dy.float(), lambda q, k, v: attention_ref(q, k, v, causal=True)[0]
    )
    lowp = _weight_grads(model, x, dy, lambda q, k, v: attention_ref(q, k, v, causal=True, upcast=False)[0])
    for name, grad in ours.items():
        assert grad.dtype == dtype and not grad.isnan().any(), name
        err = max_abs_diff(grad, reference[name])
        bound = GRAD_FACTOR * max_abs_diff(lowp[name], reference[name]) + GRAD_EPS
        assert err <= bound, f"{name}: max error {err:.3g} > bound {bound:.3g}"


_SMALL_SMEM_CHECK = """
import sys, torch, test_backward
for dtype in (torch.float16, torch.bfloat16):
    for head_dim in (96, 120, 128, 224, 256):
        for causal in (False, True):
            for deterministic in (False, True):
                test_backward._check_backward("cuda", dtype, head_dim, (257, 300), causal, (4, 2),
                                              deterministic=deterministic)
print("small-smem backward ok")
"""


@pytest.mark.gpu
@pytest.mark.parametrize("smem_bytes, expect_ok", [(99 * 1024, True), (48 * 1024, False)])
def test_backward_small_shared_memory_config(smem_bytes, expect_ok):
    """GPUs that give a block 99 KB of shared memory (sm_86, sm_89) run the backward of the
    head dims whose fastest tiles need more (d96, d128, d256) on half-size tiles, both paths.
    FLASHATTN_MAX_SMEM_PER_BLOCK lowers the limit the binding reads, so the H100 takes that
    path (a launch never exceeds the limit), and a limit no config fits is a clear error."""
    env = {**os.environ, "FLASHATTN_MAX_SMEM_PER_BLOCK": str(smem_bytes)}
    result = subprocess.run([sys.executable, "-c", _SMALL_SMEM_CHECK], cwd=os.path.dirname(__file__),
                            env=env, capture_output=True, text=True)
    if expect_ok:
        assert result.returncode == 0 and "small-smem backward ok" in result.stdout, result.stderr[-3000:]
    else:
        assert result.returncode != 0
        assert f"allows {smem_bytes} bytes of shared memory per block" in result.stderr, result.stderr[-3000:]
