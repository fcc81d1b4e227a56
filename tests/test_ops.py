"""The operators as torch sees them: opcheck (autograd included), torch.compile of forward and backward, the schemas."""

import itertools
from pathlib import Path

import pytest
import torch
from helpers import DEVICES, case_seed, random_qkv
from torch._dynamo.backends.common import aot_autograd
from torch.fx import GraphModule
from torch.library import opcheck
from torch.utils._python_dispatch import TorchDispatchMode

from flashattn import flash_attn_func, flash_attn_varlen_func, ops
from flashattn.interface import _flash_attn_forward
from flashattn.ops import BWD_SCHEMA, COMBINE_SCHEMA, FP8_SCHEMA, FWD_SCHEMA, KVCACHE_FP8_SCHEMA, KVCACHE_SCHEMA

CSRC = Path(__file__).resolve().parents[1] / "csrc"

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


def test_softmax_lse_is_differentiable():
    """The op differentiates out and the LSE (issue 21: context parallelism needs d lse); a backward
    through the LSE alone reaches q and k (the values' checked in tests/test_model_features.py)."""
    q, k, v = (t.requires_grad_() for t in random_qkv(1, 5, 6, 2, 1, 16, torch.float32, "cpu", 0))
    out, softmax_lse = torch.ops.flashattn.fwd(q, k, v, 0.25, False)
    assert out.requires_grad and softmax_lse.requires_grad
    dq, dk = torch.autograd.grad(softmax_lse.sum(), (q, k))
    assert dq.abs().sum() > 0 and dk.abs().sum() > 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", OPCHECK_CASES, ids=_case_id)
def test_eager_autograd_matches_the_registered_one(device, case):
    """flashattn.ops.fwd, which the public functions call, differentiates eager calls through its
    own autograd.Function (the registration's wrapper costs ~230 us of host time a call): out, the
    LSE and every gradient equal, bit for bit, those of the operator's registered autograd (what
    torch.compile traces), with a gradient through out alone and through out and the LSE together
    (issue 21: the LSE is differentiable)."""
    batch, seqlen_q, seqlen_k, heads, heads_k, head_dim, dtype, causal, layout = case
    seed = case_seed("eager-autograd", case)
    q, k, v = random_qkv(batch, seqlen_q, seqlen_k, heads, heads_k, head_dim, dtype, device, seed, layout)
    dout, _, _ = random_qkv(batch, seqlen_q, seqlen_k, heads, heads_k, head_dim, dtype, device, seed + 1, layout)
    dlse = torch.randn((batch, heads, seqlen_q), generator=torch.Generator().manual_seed(seed + 2)).to(device)
    results = []
    for fwd in (torch.ops.flashattn.fwd, ops.fwd):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out, softmax_lse = fwd(*leaves, head_dim**-0.5, causal, False, 7, -1)
        assert out.grad_fn is not None and softmax_lse.requires_grad
        grads = torch.autograd.grad(out, leaves, dout, retain_graph=True)
        grads_with_lse = torch.autograd.grad((out, softmax_lse), leaves, (dout, dlse))
        results.append((out, softmax_lse, *grads, *grads_with_lse))
    assert type(results[1][0].grad_fn).__name__ == "_FwdAutogradBackward"  # the eager path was taken
    names = ("out", "lse", "dq", "dk", "dv", "dq with dlse", "dk with dlse", "dv with dlse")
    for name, registered, eager in zip(names, *results):
        assert torch.equal(registered, eager), name


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


def _options_case(name: str, device: str, dtype: torch.dtype, seed: int) -> tuple:
    """(q, k, v, fwd's arguments after q, k, v) of an options case of OPTION_CASES."""
    gen = torch.Generator(device=device).manual_seed(seed)
    rng_state = torch.tensor([seed, 3], dtype=torch.int64, device=device)
    if name == "varlen-everything":
        lengths_q, lengths_k = [5, 0, 40], [7, 3, 30]
        q = torch.randn(sum(lengths_q), 4, 32, generator=gen, dtype=dtype, device=device)
        k, v = (torch.randn(sum(lengths_k), 2, 32, generator=gen, dtype=dtype, device=device) for _ in range(2))
        cu_q, cu_k = (torch.tensor([0, *itertools.accumulate(n)], dtype=torch.int32, device=device)
                      for n in (lengths_q, lengths_k))  # fmt: skip
        slopes = torch.rand(4, generator=gen, device=device)
        return q, k, v, (32**-0.5, True, False, 10, -1, 3.0, slopes, 0.1, rng_state, cu_q, cu_k, 40, 30)
    if name == "window-softcap":
        q, k, v = random_qkv(2, 70, 90, 4, 2, 40, dtype, device, seed, "packed")
        return q, k, v, (0.3, False, False, 20, 5, 2.0, None, 0.0, None, None, None, 0, 0)
    q, k, v = random_qkv(2, 33, 33, 4, 1, 64, dtype, device, seed, "transposed")
    slopes = torch.rand(2, 4, generator=gen, device=device)
    return q, k, v, (0.125, True, False, -1, -1, 0.0, slopes, 0.2, rng_state, None, None, 0, 0)


OPTION_CASES = ["window-softcap", "alibi-dropout", "varlen-everything"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("requires_grad", [False, True], ids=["no-grad", "grad"])
@pytest.mark.parametrize("name", OPTION_CASES)
def test_opcheck_forward_options(device, requires_grad, name):
    """opcheck of the forward with windows, softcap, ALiBi, dropout and a variable-length batch:
    the optional tensors (ALiBi slopes, rng_state, cu_seqlens) pass through fake tensors and AOT
    autograd, and get no gradient."""
    q, k, v, options = _options_case(name, device, torch.bfloat16, case_seed("fwd options", name))
    if requires_grad:
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    results = opcheck(torch.ops.flashattn.fwd.default, (q, k, v, *options), test_utils=OPCHECK_UTILS)
    assert results == dict.fromkeys(OPCHECK_UTILS, "SUCCESS")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", OPTION_CASES)
def test_opcheck_backward_options(device, name):
    q, k, v, options = _options_case(name, device, torch.float16, case_seed("bwd options", name))
    out, softmax_lse = torch.ops.flashattn.fwd(q, k, v, *options)
    dout = torch.randn_like(out)
    scale, causal, deterministic, *rest = options
    args = (dout, q, k, v, out, softmax_lse, scale, causal, True, *rest)
    results = opcheck(torch.ops.flashattn.bwd.default, args, test_utils=OPCHECK_UTILS)
    assert results == dict.fromkeys(OPCHECK_UTILS, "SUCCESS")


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph_with_options(device):
    """Every option traces into one graph, dropout's rng_state (torch.randint) included; under one
    torch seed the compiled step (AOT autograd, eager kernels) gives eager's out and gradients."""

    def loss_of(q, k, v, slopes):
        out = flash_attn_func(q, k, v, dropout_p=0.2, softmax_scale=0.2, causal=True, window_size=(30, -1),
                              softcap=4.0, alibi_slopes=slopes, deterministic=True)  # fmt: skip
        return (out * 2).sum()

    graphs = {"forward": [], "backward": []}
    compiled = torch.compile(loss_of, fullgraph=True, backend=_graph_recording_backend(graphs))
    seed = case_seed("compile options", device)
    leaves = [t.detach().requires_grad_() for t in random_qkv(2, 70, 90, 4, 2, 59, torch.bfloat16, device, seed)]
    slopes = torch.rand(4, device=device)
    torch.manual_seed(seed)
    compiled_grads = torch.autograd.grad(compiled(*leaves, slopes), leaves)
    torch.manual_seed(seed)
    eager_grads = torch.autograd.grad(loss_of(*leaves, slopes), leaves)
    assert len(graphs["forward"]) == 1 and len(graphs["backward"]) == 1
    for name, grad, want in zip(("dq", "dk", "dv"), compiled_grads, eager_grads):
        assert torch.equal(grad, want), name


def test_schemas_are_defined_in_python_only():
    """flashattn.ops is the one place that states the schemas: the C++ sources register
    implementations of them (TORCH_LIBRARY_IMPL), never a TORCH_LIBRARY block of their own."""
    sources = [path for path in CSRC.rglob("*") if path.suffix in (".cpp", ".cu", ".cuh", ".h")]
    assert any("TORCH_LIBRARY_IMPL(flashattn, CUDA, m)" in path.read_text() for path in sources)
    assert not [path for path in sources if "TORCH_LIBRARY(flashattn" in path.read_text()]


def test_registered_schemas_are_python_s():
    """The operators carry the schemas of flashattn.ops. torch prints a parsed schema in its own
    way (0.0 as 0.), so both sides are compared parsed."""
    for op, schema in (
        (torch.ops.flashattn.fwd.default, FWD_SCHEMA),
        (torch.ops.flashattn.bwd.default, BWD_SCHEMA),
        (torch.ops.flashattn.fwd_kvcache.default, KVCACHE_SCHEMA),
        (torch.ops.flashattn.fwd_kvcache_fp8.default, KVCACHE_FP8_SCHEMA),
        (torch.ops.flashattn.combine.default, COMBINE_SCHEMA),
        (torch.ops.flashattn.fwd_fp8.default, FP8_SCHEMA),
    ):
        assert str(op._schema) == str(torch._C.parse_schema("flashattn::" + schema))


class _RecordCalls(TorchDispatchMode):
    """Keeps the arguments of every call of `op` (the dispatcher passes them all, positionally)."""

    def __init__(self, op: torch._ops.OpOverload) -> None:
        super().__init__()
        self.op, self.calls = op, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is self.op:
            self.calls.append(args)
        return func(*args, **(kwargs or {}))


_SCHEMA_TYPES = {"Tensor": torch.Tensor, "Optional[Tensor]": (torch.Tensor, type(None)), "float": float,
                 "bool": bool, "int": int}  # fmt: skip


def _assert_call_fits_schema(op: torch._ops.OpOverload, args: tuple) -> None:
    """Every argument of the call has its schema argument's type: a Python float for a float (not
    an int or a 0-d tensor), a bool for a bool, an int (not a bool) for an int. (The dispatcher
    leaves out trailing arguments that have their default values.)"""
    arguments = op._schema.arguments
    assert len(args) <= len(arguments)
    for argument, value in zip(arguments, args):
        expected = _SCHEMA_TYPES[str(argument.type)]
        assert isinstance(value, expected), (argument.name, value)
        assert not (expected is int and isinstance(value, bool)), (argument.name, value)


def test_public_functions_call_the_registered_schema():
    """flash_attn_func and flash_attn_varlen_func, every option set, call flashattn::fwd with
    arguments of the registered schema's types, and the backward calls flashattn::bwd likewise."""
    q, k, v = (t.requires_grad_() for t in random_qkv(2, 9, 12, 4, 2, 16, torch.float32, "cpu", case_seed("schema")))
    options = {"dropout_p": 0.1, "softmax_scale": 0.3, "causal": True, "window_size": [10**12, 3], "softcap": 5,
               "alibi_slopes": torch.rand(4), "deterministic": True}  # fmt: skip
    cu_seqlens = torch.tensor([0, 9, 18], dtype=torch.int32)
    for op in (torch.ops.flashattn.fwd.default, torch.ops.flashattn.bwd.default):
        with _RecordCalls(op) as recorder:
            flash_attn_func(q, k, v, **options).sum().backward()
            flash_attn_varlen_func(q.flatten(0, 1), k[:, :9].flatten(0, 1), v[:, :9].flatten(0, 1), cu_seqlens,
                                   cu_seqlens, torch.tensor(9), 9, **options).sum().backward()  # fmt: skip
        assert len(recorder.calls) == 2
        for args in recorder.calls:
            _assert_call_fits_schema(op, args)
