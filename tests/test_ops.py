"""The operators as torch sees them: opcheck, torch.compile of forward and backward, the schemas."""

import pytest
import torch
from helpers import DEVICES, case_seed, random_qkv
from torch._dynamo.backends.common import aot_autograd
from torch.fx import GraphModule
from torch.library import opcheck

import flashattn
from flashattn import flash_attn_func
from flashattn.interface import _flash_attn_forward
from flashattn.ops import BWD_SCHEMA, FWD_SCHEMA

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
@pytest.mark.parametrize(
    "case", OPCHECK_CASES, ids=lambda c: f"q{c[1]}k{c[2]}-h{c[3]}kv{c[4]}-d{c[5]}-{c[8]}"
)
def test_opcheck_forward_with_grad_inputs(device, case):
    """The forward op on inputs that require grad, as FlashAttnFunc.forward receives them.

    The autograd checks (test_autograd_registration, and test_aot_dispatch_dynamic,
    which differentiates through the op) do not apply: the op itself has no autograd
    kernel. Autograd lives in FlashAttnFunc because `deterministic` belongs to the call,
    not to fwd's schema, and because its backward must first pad and align dout for the
    kernel; test_torch_compile_fullgraph_backward covers forward and backward under AOT
    autograd instead."""
    batch, seqlen_q, seqlen_k, heads, heads_k, head_dim, dtype, causal, layout = case
    q, k, v = random_qkv(
        batch, seqlen_q, seqlen_k, heads, heads_k, head_dim, dtype, device, case_seed(case), layout
    )
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    opcheck(
        torch.ops.flashattn.fwd.default, (q, k, v, head_dim**-0.5, causal), test_utils=("test_schema", "test_faketensor")
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
@pytest.mark.parametrize(
    "case", OPCHECK_CASES, ids=lambda c: f"q{c[1]}k{c[2]}-h{c[3]}kv{c[4]}-d{c[5]}-{c[8]}"
)
def test_opcheck_backward(device, deterministic, case):
    """The backward op on the forward's results, with dout in the layout of the inputs."""
    batch, seqlen_q, seqlen_k, heads, heads_k, head_dim, dtype, causal, layout = case
    seed = case_seed("bwd", case)
    q, k, v = random_qkv(batch, seqlen_q, seqlen_k, heads, heads_k, head_dim, dtype, device, seed, layout)
    dout, _, _ = random_qkv(batch, seqlen_q, seqlen_k, heads, heads_k, head_dim, dtype, device, seed + 1, layout)
    out, softmax_lse = _flash_attn_forward(q, k, v, head_dim**-0.5, causal)
    opcheck(
        torch.ops.flashattn.bwd.default, (dout, q, k, v, out, softmax_lse, head_dim**-0.5, causal, deterministic)
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_torch_compile_fullgraph(device, dynamic):
    """flash_attn_func traces into one graph (no graph break) and the graph computes what eager does."""

    def attend(q, k, v):
        return flash_attn_func(q, k, v, softmax_scale=0.2, causal=True) * 2

    compiled = torch.compile(attend, fullgraph=True, dynamic=dynamic)
    q, k, v = random_qkv(2, 70, 90, 4, 2, 59, torch.bfloat16, device, case_seed(device, dynamic), "packed")
    assert torch.equal(compiled(q, k, v), attend(q, k, v))


def _graph_recording_backend(graphs: dict[str, list[GraphModule]]):
    """AOT autograd that keeps the forward and backward graphs it traces and runs them as they are."""

    def recorder(kind: str):
        def compile_graph(gm: GraphModule, example_inputs: list) -> GraphModule:
            graphs[kind].append(gm)
            return gm

        return compile_graph

    return aot_autograd(fw_compiler=recorder("forward"), bw_compiler=recorder("backward"))


def _calls(gm: GraphModule, op: torch._ops.OpOverload) -> int:
    return sum(node.op == "call_function" and node.target is op for node in gm.graph.nodes)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_torch_compile_fullgraph_backward(device, dynamic):
    """A training step traces into one forward and one backward graph (fullgraph: no graph
    break), the backward built from flashattn::bwd's fake implementation, and it computes
    the gradients eager computes, bit for bit."""

    def loss_of(q, k, v):
        return (flash_attn_func(q, k, v, softmax_scale=0.2, causal=True, deterministic=True) * 2).sum()

    graphs = {"forward": [], "backward": []}
    compiled = torch.compile(loss_of, fullgraph=True, dynamic=dynamic, backend=_graph_recording_backend(graphs))
    seed = case_seed("compile backward", device, dynamic)
    leaves = [t.detach().requires_grad_() for t in random_qkv(2, 70, 90, 4, 2, 59, torch.bfloat16, device, seed, "packed")]
    compiled_grads = torch.autograd.grad(compiled(*leaves), leaves)
    eager_grads = torch.autograd.grad(loss_of(*leaves), leaves)

    assert len(graphs["forward"]) == 1 and len(graphs["backward"]) == 1
    assert _calls(graphs["forward"][0], torch.ops.flashattn.fwd.default) == 1
    assert _calls(graphs["backward"][0], torch.ops.flashattn.bwd.default) == 1
    for name, grad, want in zip(("dq", "dk", "dv"), compiled_grads, eager_grads):
        assert torch.equal(grad, want), name


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_inductor_backward(device):
    """The same training step through the default backend (inductor) matches eager."""

    def loss_of(q, k, v):
        return (flash_attn_func(q, k, v, softmax_scale=0.2, causal=True, deterministic=True) * 2).sum()

    compiled = torch.compile(loss_of, fullgraph=True)
    seed = case_seed("inductor backward", device)
    leaves = [t.detach().requires_grad_() for t in random_qkv(2, 70, 90, 4, 2, 59, torch.bfloat16, device, seed, "packed")]
    compiled_grads = torch.autograd.grad(compiled(*leaves), leaves)
    eager_grads = torch.autograd.grad(loss_of(*leaves), leaves)
    for name, grad, want in zip(("dq", "dk", "dv"), compiled_grads, eager_grads):
        assert torch.equal(grad, want), name


@pytest.mark.skipif(
    not flashattn.HAS_CUDA_KERNELS, reason=f"the extension defines the schemas: {flashattn.NOT_BUILT_REASON}"
)
def test_schemas_of_extension_match_python():
    assert str(torch.ops.flashattn.fwd.default._schema) == "flashattn::" + FWD_SCHEMA
    assert str(torch.ops.flashattn.bwd.default._schema) == "flashattn::" + BWD_SCHEMA
