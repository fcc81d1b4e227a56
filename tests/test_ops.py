"""The operator as torch sees it: opcheck, torch.compile, the schema, the missing backward."""

import pytest
import torch
from helpers import DEVICES, case_seed, random_qkv
from torch.library import opcheck

import flashattn
from flashattn import flash_attn_func
from flashattn.ops import FWD_SCHEMA

OPCHECK_CASES = [
    # batch, seqlen_q, seqlen_k, heads, heads_k, head_dim, dtype, causal, layout
    (2, 17, 33, 4, 4, 64, torch.float16, False, "contiguous"),
    (1, 130, 70, 4, 2, 40, torch.bfloat16, True, "transposed"),
    (2, 9, 200, 3, 1, 128, torch.bfloat16, True, "packed"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "case", OPCHECK_CASES, ids=lambda c: f"q{c[1]}k{c[2]}-h{c[3]}kv{c[4]}-d{c[5]}-{c[8]}"
)
def test_opcheck(device, case):
    """Schema, fake (meta) implementation and dispatch agree with the real implementation."""
    batch, seqlen_q, seqlen_k, heads, heads_k, head_dim, dtype, causal, layout = case
    q, k, v = random_qkv(
        batch, seqlen_q, seqlen_k, heads, heads_k, head_dim, dtype, device, case_seed(case), layout
    )
    opcheck(torch.ops.flashattn.fwd.default, (q, k, v, head_dim**-0.5, causal))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_torch_compile_fullgraph(device, dynamic):
    """flash_attn_func traces into one graph (no graph break) and the graph computes what eager does."""

    def attend(q, k, v):
        return flash_attn_func(q, k, v, softmax_scale=0.2, causal=True) * 2

    compiled = torch.compile(attend, fullgraph=True, dynamic=dynamic)
    q, k, v = random_qkv(2, 70, 90, 4, 2, 59, torch.bfloat16, device, case_seed(device, dynamic), "packed")
    assert torch.equal(compiled(q, k, v), attend(q, k, v))


@pytest.mark.skipif(
    not flashattn.HAS_CUDA_KERNELS, reason=f"the extension defines the schema: {flashattn.NOT_BUILT_REASON}"
)
def test_schema_of_extension_matches_python():
    assert str(torch.ops.flashattn.fwd.default._schema) == "flashattn::" + FWD_SCHEMA


@pytest.mark.parametrize("device", DEVICES)
def test_backward_raises_not_implemented(device):
    q, k, v = random_qkv(1, 8, 8, 2, 2, 32, torch.float16, device, 0)
    q.requires_grad_()
    out = flash_attn_func(q, k, v)
    assert out.requires_grad
    with pytest.raises(NotImplementedError, match="backward pass of flash_attn_func is not implemented yet"):
        out.sum().backward()


def test_torch_compile_with_grad_inputs_names_the_missing_backward():
    """torch.compile traces the backward ahead of time when an input requires grad, so until
    issue 3 compiling such a call fails at trace time, with the same message as eager."""
    q, k, v = random_qkv(1, 8, 8, 2, 2, 32, torch.float16, "cpu", 0)
    q.requires_grad_()
    compiled = torch.compile(flash_attn_func, fullgraph=True, backend="eager")
    with pytest.raises(Exception, match="backward pass of flash_attn_func is not implemented yet"):
        compiled(q, k, v)
