"""The forward pass against the reference, within the error bound of tests/helpers.py.

The sweep covers the shapes of issue 2: awkward lengths, Sq != Sk both ways,
head dims that are not multiples of 8, MHA/GQA/MQA, both dtypes, causal or not.
On the GPU it runs the full cross product; on CPU (CI: two slow cores) every
head dim x (Sq, Sk) x causal, with dtype and head layout cycling across cases.
"""

import itertools
import math
import os
import subprocess
import sys

import pytest
import torch
from helpers import DEVICES, assert_matches_reference, case_seed, random_qkv, run_forward

from flashattn import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func
from flashattn.interface import _flash_attn_forward

DTYPES = [torch.float16, torch.bfloat16]
HEAD_DIMS = [32, 40, 59, 64, 96, 111, 128, 160, 192, 224, 256]
SEQLENS = [
    (1, 1),
    (1, 239),
    (3, 799),
    (113, 203),
    (128, 217),
    (256, 512),
    (512, 256),
    (1023, 1024),
    (1024, 1023),
    (2048, 2048),
]
CAUSAL = [False, True]
HEADS = [(4, 4), (4, 2), (4, 1)]  # (H, Hk): MHA, GQA, MQA
BATCH = 2


def _case_id(
    dtype: torch.dtype, head_dim: int, seqlens: tuple[int, int], causal: bool, heads: tuple[int, int]
) -> str:
    name = str(dtype).removeprefix("torch.")
    mask = "causal" if causal else "full"
    return f"{name}-d{head_dim}-q{seqlens[0]}k{seqlens[1]}-{mask}-h{heads[0]}kv{heads[1]}"


def _cpu_cases() -> list:
    """Every head dim x (Sq, Sk) x causal. dtype and (H, Hk) follow the sum of the three
    indices, so that every dtype and head layout meets every head dim, length pair and mask."""
    cases = []
    for (i, head_dim), (j, seqlens), (c, causal) in itertools.product(
        enumerate(HEAD_DIMS), enumerate(SEQLENS), enumerate(CAUSAL)
    ):
        case = (DTYPES[(i + j + c) % len(DTYPES)], head_dim, seqlens, causal, HEADS[(i + j + c) % len(HEADS)])
        cases.append(pytest.param(*case, id=_case_id(*case)))
    return cases


def _check_forward(
    device: str,
    dtype: torch.dtype,
    head_dim: int,
    seqlens: tuple[int, int],
    causal: bool,
    heads: tuple[int, int],
    layout: str = "contiguous",
) -> None:
    seed = case_seed(device, dtype, head_dim, seqlens, causal, heads, layout)
    q, k, v = random_qkv(BATCH, *seqlens, *heads, head_dim, dtype, device, seed, layout)
    scale = head_dim**-0.5
    out, lse = run_forward(q, k, v, scale, causal)
    assert_matches_reference(out, lse, q, k, v, scale, causal)


@pytest.mark.parametrize("dtype, head_dim, seqlens, causal, heads", _cpu_cases())
def test_forward_cpu(dtype, head_dim, seqlens, causal, heads):
    _check_forward("cpu", dtype, head_dim, seqlens, causal, heads)


@pytest.mark.gpu
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"h{h[0]}kv{h[1]}")
@pytest.mark.parametrize("causal", CAUSAL, ids=["full", "causal"])
@pytest.mark.parametrize("seqlens", SEQLENS, ids=lambda s: f"q{s[0]}k{s[1]}")
@pytest.mark.parametrize("head_dim", HEAD_DIMS, ids=lambda d: f"d{d}")
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_forward_gpu(dtype, head_dim, seqlens, causal, heads):
    _check_forward("cuda", dtype, head_dim, seqlens, causal, heads)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", CAUSAL, ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 96, 128], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_blocks_that_write_many_query_tiles(dtype, head_dim, causal):
    """More query tiles (8 x 32 heads x 2 = 512) than an H100 has SMs (132): each persistent block
    of the sm90 forward writes the O of several tiles through the same shared-memory tile (d64,
    d96 and causal d128 stage O there, csrc/sm90/kernel_traits.h), a warpgroup's rows written
    again only after its previous bulk store has read them; Sq = 1000 ends every sequence in a
    partial tile, which the store clips at the sequence's end. The sweep above has at most 128
    tiles, one per block."""
    _check_forward("cuda", dtype, head_dim, (1000, 1000), causal, (32, 8))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["packed", "transposed", "offset"])
@pytest.mark.parametrize(
    "head_dim, seqlens, heads",
    [
        (64, (128, 128), (4, 4)),
        (59, (113, 203), (4, 2)),
        (128, (203, 113), (4, 1)),
    ],
)
@pytest.mark.parametrize("causal", CAUSAL, ids=["full", "causal"])
def test_noncontiguous_views(device, layout, head_dim, seqlens, heads, causal):
    _check_forward(device, torch.bfloat16, head_dim, seqlens, causal, heads, layout)


def test_fp32_on_cpu_only_path():
    """fp32 runs on CPU (the CUDA path refuses it, see test_errors.py)."""
    _check_forward("cpu", torch.float32, 72, (300, 257), True, (4, 2))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("softmax_scale", [0.02, 0.5, 3.0])
@pytest.mark.parametrize("causal", CAUSAL, ids=["full", "causal"])
def test_explicit_softmax_scale(device, softmax_scale, causal):
    q, k, v = random_qkv(
        BATCH, 200, 333, 4, 2, 96, torch.float16, device, case_seed(device, softmax_scale, causal)
    )
    out, lse = run_forward(q, k, v, softmax_scale, causal)
    assert_matches_reference(out, lse, q, k, v, softmax_scale, causal)
    assert torch.equal(flash_attn_func(q, k, v, softmax_scale=softmax_scale, causal=causal), out)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_dim", [40, 59])
@pytest.mark.parametrize("causal", CAUSAL, ids=["full", "causal"])
def test_flash_attn_func_is_the_forward(device, head_dim, causal):
    """flash_attn_func returns the checked forward's out, scaled by 1/sqrt of the unpadded head dim."""
    q, k, v = random_qkv(
        BATCH, 77, 150, 4, 1, head_dim, torch.bfloat16, device, case_seed(device, head_dim, causal)
    )
    out, _ = _flash_attn_forward(q, k, v, head_dim**-0.5, causal)
    assert torch.equal(flash_attn_func(q, k, v, causal=causal), out)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_dim", [64, 59])
@pytest.mark.parametrize("causal", CAUSAL, ids=["full", "causal"])
def test_packed_functions_equal_flash_attn_func(device, head_dim, causal):
    gen = torch.Generator(device=device).manual_seed(case_seed(device, head_dim, causal))
    qkv = torch.randn(BATCH, 150, 3, 4, head_dim, generator=gen, dtype=torch.float16, device=device)
    q, k, v = qkv.unbind(dim=2)
    expected = flash_attn_func(q, k, v, causal=causal)
    assert torch.equal(flash_attn_qkvpacked_func(qkv, causal=causal), expected)
    assert torch.equal(flash_attn_kvpacked_func(q, qkv[:, :, 1:], causal=causal), expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch, seqlen_q, seqlen_k", [(0, 5, 7), (2, 0, 7), (2, 5, 0), (0, 0, 0)])
@pytest.mark.parametrize("causal", CAUSAL, ids=["full", "causal"])
def test_empty_inputs(device, batch, seqlen_q, seqlen_k, causal):
    """Empty batches or sequences give correctly shaped results; no key at all gives out 0, lse -inf."""
    q, k, v = random_qkv(batch, seqlen_q, seqlen_k, 4, 2, 40, torch.float16, device, 0)
    out, lse = run_forward(q, k, v, 0.1, causal)
    assert out.shape == (batch, seqlen_q, 4, 40) and lse.shape == (batch, 4, seqlen_q)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(lse, torch.full_like(lse, -math.inf))
    assert flash_attn_func(q, k, v, causal=causal).shape == (batch, seqlen_q, 4, 40)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(300, 100), (37, 5)])
def test_causal_rows_that_see_no_key(device, seqlen_q, seqlen_k):
    """Causal with Sq > Sk: query i sees keys j <= i + Sk - Sq, none for i < Sq - Sk."""
    q, k, v = random_qkv(
        BATCH, seqlen_q, seqlen_k, 4, 4, 64, torch.bfloat16, device, case_seed(device, seqlen_q)
    )
    out, lse = run_forward(q, k, v, 0.125, True)
    blind = seqlen_q - seqlen_k
    assert torch.equal(out[:, :blind], torch.zeros_like(out[:, :blind]))
    assert torch.equal(lse[:, :, :blind], torch.full_like(lse[:, :, :blind], -math.inf))
    assert_matches_reference(out, lse, q, k, v, 0.125, True)


_SMALL_SMEM_CHECK = """
import sys, torch, test_forward
for dtype in (torch.float16, torch.bfloat16):
    for head_dim, causal in ((256, False), (256, True), (224, True)):
        test_forward._check_forward("cuda", dtype, head_dim, (1023, 1024), causal, (4, 2))
print("small-smem config ok")
"""


@pytest.mark.gpu
@pytest.mark.parametrize("smem_bytes, expect_ok", [(99 * 1024, True), (48 * 1024, False)])
def test_small_shared_memory_config(smem_bytes, expect_ok):
    """GPUs that give a block 99 KB of shared memory (sm_86, sm_89) run head dims whose fastest
    tiles need more (d256: 128 KB) on smaller tiles. FLASHATTN_MAX_SMEM_PER_BLOCK lowers the
    limit the binding reads, so the H100 takes that path; a launch never exceeds the limit, so
    passing here proves the smaller config ran, and a limit no config fits is a clear error."""
    env = {**os.environ, "FLASHATTN_MAX_SMEM_PER_BLOCK": str(smem_bytes)}
    result = subprocess.run([sys.executable, "-c", _SMALL_SMEM_CHECK], cwd=os.path.dirname(__file__),
                            env=env, capture_output=True, text=True)
    if expect_ok:
        assert result.returncode == 0 and "small-smem config ok" in result.stdout, result.stderr[-3000:]
    else:
        assert result.returncode != 0
        assert f"allows {smem_bytes} bytes of shared memory per block" in result.stderr, result.stderr[-3000:]
