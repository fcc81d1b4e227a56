"""The operators as torch sees them: opcheck (autograd included), torch.compile of forward and backward, the schemas."""

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
# All of opcheck's checks, named: each must report SUCCESS, none may be left out.
OPCHECK_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def _case_id(case: tuple) -> str:
    return f"q{case[1]}k{case[2]}-h{case[3]}kv{case[4]}-d{case[5]}-{case[8]}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "requires_grad, deterministic",
    [(False, False), (True, False), (True, True)],
    ids=["no-grad", "grad", "grad-deterministic"],
)
@pytest.mark.parametrize("case", OPCHECK_CASES, ids=_case_id)
def test_opcheck_forward(device, requires_grad, deterministic, case):
    """Schema, fake (meta) implementation and dispatch agree with the real implementation; on
    inputs that require grad, so do the autograd registration (test_autograd_registration) and
    the op differentiated through AOT autograd against eager (test_aot_dispatch_dynamic), with
    the backward path that `deterministic` picks."""
    batch, seqlen_q, seqlen_k, heads, heads_k, head_dim, dtype, causal, layout = case
    seed = case_seed("fwd", requires_grad, case)
    q, k, v = random_qkv(batch, seqlen_q, seqlen_k, heads, heads_k, head_dim, dtype, device, seed, layout)
    if requires_grad:
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    args = (q, k, v, head_dim**-0.5, causal, deterministic)
    results = opcheck(torch.ops.flashattn.fwd.default, args, test_utils=OPCHECK_UTILS)
    assert results == dict.fromkeys(OPCHECK_UTILS, "SUCCESS")


def test_softmax_lse_is_not_differentiable():
    """The op differentiates out only: the LSE of inputs that require grad does not."""
    q, k, v = (t.requires_grad_() for t in random_qkv(1, 5, 6, 2, 1, 16, torch.float32, "cpu", 0))
    out, softmax_lse = torch.ops.flashattn.fwd(q, k, v, 0.25, False)
    assert out.requires_grad and not softmax_lse.requires_grad


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
@pytest.mark.parametrize("case", OPCHECK_CASES, ids=_case_id)
def test_opcheck_backward(device, deterministic, case):
    """The backward op on the forward's results, with dout in the layout of the inputs."""
    batch, seqlen_q, seqlen_k, heads, heads_k, head_dim, dtype, causal, layout = case
    seed = case_seed("bwd", case)
    q, k, v = random_qkv(batch, seqlen_q, seqlen_k, heads, heads_k, head_dim, dtype, device, seed, layout)
    dout, _, _ = random_qkv(batch, seqlen_q, seqlen_k, heads, heads_k, head_dim, dtype, device, seed + 1, layout)
    out, softmax_lse = _flash_attn_forward(q, k, v, head_dim**-0.5, causal)
    args = (dout, q, k, v, out, softmax_lse, head_dim**-0.5, causal, deterministic)
    assert opcheck(torch.ops.flashattn.bwd.default, args, test_utils=OPCHECK_UTILS) == dict.fromkeys(
        OPCHECK_UTILS, "SUCCESS"
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
