"""Code written against flash-attn 2.8, run unchanged: window_size as a tensor or list, the KV cache
with a head dim that is not a multiple of 8, and flashattn.flash_attn_interface's private entry points
used the way ring-attention libraries use them (return_attn_probs: tests/test_features.py and
tests/test_varlen.py)."""

import pytest
import torch
from helpers import (
    DEVICES,
    assert_grads_match_reference,
    assert_matches_reference,
    case_seed,
    random_qkv,
)
from test_errors import FUNCS, VARLEN_FUNCS, _call, _qkv
from test_kvcache import check, make_case
from test_varlen import packed_batch

import flashattn.interface
from flashattn import KVCache, flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
from flashattn.flash_attn_interface import (
    _flash_attn_backward,
    _flash_attn_forward,
    _flash_attn_varlen_backward,
    _flash_attn_varlen_forward,
    _wrapped_flash_attn_backward,
    _wrapped_flash_attn_forward,
)
from flashattn.nn import MHA

# window_size as flash-attn code passes it, all meaning (5, 0) (any negative side: unbounded in the last).
WINDOW_FORMS = {
    "list": lambda device: [5, 0],
    "tensor": lambda device: torch.tensor([5, 0], device=device),
    "int32-tensor": lambda device: torch.tensor([5, 0], dtype=torch.int32, device=device),
    "0d-tensors": lambda device: (torch.tensor(5, device=device), torch.tensor(0)),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("func", FUNCS + VARLEN_FUNCS)
@pytest.mark.parametrize("form", WINDOW_FORMS)
def test_window_size_forms(device, func, form):
    """Every public function computes with a list, a 1-D tensor or 0-d tensors exactly what it
    computes with the tuple, and treats any negative side as -1."""
    q, k, v = _qkv(device, q_shape=(2, 13, 2, 16), kv_shape=(2, 13, 2, 16))
    expected = _call(func, q, k, v, window_size=(5, 0))
    assert torch.equal(_call(func, q, k, v, window_size=WINDOW_FORMS[form](device)), expected)
    assert torch.equal(_call(func, q, k, v, window_size=torch.tensor([-3, -1], device=device)), _call(func, q, k, v))


@pytest.mark.parametrize("device", DEVICES)
def test_window_size_drawn_with_randint(device):
    """flash-attn's own tests draw the window with torch.randint(0, seqlen_k, (2,)): it runs, forward
    and backward, within the bound."""
    seed = case_seed("randint window", device)
    q, k, v = random_qkv(2, 37, 113, 4, 1, 59, torch.bfloat16, device, seed)
    torch.manual_seed(seed)
    window = torch.randint(0, 113, (2,))
    leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
    out = flash_attn_func(*leaves, window_size=window)
    _, lse, _ = flash_attn_func(q, k, v, window_size=window, return_attn_probs=True)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, dout)
    sides = tuple(window.tolist())
    assert_matches_reference(out, lse, q, k, v, 59**-0.5, False, window_size=sides)
    assert_grads_match_reference(grads, q, k, v, dout, 59**-0.5, False, window_size=sides)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", WINDOW_FORMS)
def test_window_size_forms_kvcache_and_modules(device, form):
    """flash_attn_with_kvcache, KVCache.attend and the MHA module (which passes window_size through,
    to both paths) take the same forms."""
    case = make_case(device, torch.float16 if device == "cuda" else torch.float32, 2, 3, 2, 4, 2, 32, None, 5)
    expected = flash_attn_with_kvcache(**{**case, "k_cache": case["k_cache"].clone(),
                                          "v_cache": case["v_cache"].clone()}, causal=True, window_size=(5, 0))
    assert torch.equal(flash_attn_with_kvcache(**case, causal=True, window_size=WINDOW_FORMS[form](device)), expected)
    dtype = torch.float16 if device == "cuda" else torch.float32
    torch.manual_seed(case_seed("mha window form", device, form))
    module = MHA(64, 4, causal=True, window_size=(5, 0), device=device, dtype=dtype)
    x = torch.randn(2, 11, 64, device=device, dtype=dtype)
    with torch.no_grad():
        expected, expected_cached = module(x), module(x, kv_cache=KVCache(2, 32, 4, 16, device=device, dtype=dtype))
        module.window_size = WINDOW_FORMS[form](device)
        assert torch.equal(module(x), expected)
        assert torch.equal(module(x, kv_cache=KVCache(2, 32, 4, 16, device=device, dtype=dtype)), expected_cached)


# --------------------------------------------------------------- the KV cache with head dims not multiples of 8

PADDED_HEAD_DIMS = [59, 1, 100]
PADDED_CASES = [
    pytest.param(None, {}, id="contiguous"),
    pytest.param(16, {}, id="page16"),
    pytest.param(None, {"batch_idx": True}, id="batch-idx"),
    pytest.param(5, {"rotary": (16, True), "leftpad": False}, id="page5-rotary"),
]


def _check_padded_kvcache(device, head_dim, page, make, seqlen_new):
    seed = case_seed("kv pad", device, head_dim, page, sorted(make), seqlen_new)
    dtype = torch.bfloat16
    if "rotary" in make and make["rotary"][0] > head_dim:  # rotary_dim <= head dim
        make = {}
    case = make_case(device, dtype, 3, 4, seqlen_new, 4, 2, head_dim, page, seed, **make)
    untouched = {name: case[name].clone() for name in ("k_cache", "v_cache")}
    check(case, causal=True)  # out within the bound; the caches equal the reference's after the append
    if not seqlen_new:
        assert all(torch.equal(case[name], untouched[name]) for name in untouched)


@pytest.mark.parametrize("head_dim", PADDED_HEAD_DIMS)
@pytest.mark.parametrize("page, make", PADDED_CASES)
@pytest.mark.parametrize("seqlen_new", [3, 0])
def test_kvcache_padding_path_on_cpu(monkeypatch, head_dim, page, make, seqlen_new):
    """The CUDA path's padding (copies padded to a multiple of 8, the appended rows written back), run on
    CPU tensors by forcing it: outputs within the bound, the caller's caches exactly the reference's."""
    monkeypatch.setattr(flashattn.interface, "_runs_on_kernels", lambda q: True)
    _check_padded_kvcache("cpu", head_dim, page, make, seqlen_new)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", PADDED_HEAD_DIMS)
@pytest.mark.parametrize("page, make", PADDED_CASES)
@pytest.mark.parametrize("seqlen_new", [3, 0])
def test_kvcache_head_dim_not_multiple_of_8_on_gpu(head_dim, page, make, seqlen_new):
    """flash-attn pads here; so does flashattn: no refusal, the same results and cache contents."""
    _check_padded_kvcache("cuda", head_dim, page, make, seqlen_new)


# --------------------------------------------------------------------------- the private entry points


def _merge(out, lse, block_out, block_lse):
    """Two partial attentions merged by their log-sum-exps (out fp32 [B, S, H, D], lse [B, H, S])."""
    if out is None:
        return block_out.float(), block_lse
    new_lse = torch.logaddexp(lse, block_lse)
    weight = (lse - new_lse).exp().transpose(1, 2).unsqueeze(-1)
    block_weight = (block_lse - new_lse).exp().transpose(1, 2).unsqueeze(-1)
    return out * weight + block_out.float() * block_weight, new_lse


def _ring_attention(q, k, v, dout, scale, causal, forward, backward, ranks=2):
    """A ring of `ranks` ranks simulated in one process, as ring-flash-attn runs it: rank r holds the
    r-th chunk of q, k, v; each step it attends to the K/V chunk passed to it (causal: its own chunk
    with the causal mask, earlier chunks in full, later ones not at all), merging by LSE; the backward
    runs _flash_attn_backward on each pair with the merged out and LSE, summing dq, dk, dv in fp32."""
    qs, ks, vs, douts = (t.chunk(ranks, dim=1) for t in (q, k, v, dout))
    outs, lses = [], []
    pairs = [(r, src) for r in range(ranks) for src in range(ranks) if not (causal and src > r)]
    for r in range(ranks):
        out = lse = None
        for _, src in (pair for pair in pairs if pair[0] == r):
            block_out, block_lse, s_dmask, _ = forward(qs[r], ks[src], vs[src], 0.0, scale, causal and src == r,
                                                       -1, -1, 0.0, None, False)
            assert s_dmask.shape == (0,)
            out, lse = _merge(out, lse, block_out, block_lse)
        outs.append(out.to(q.dtype))
        lses.append(lse)
    grads = [[torch.zeros(t.shape, dtype=torch.float32, device=t.device) for t in chunks] for chunks in (qs, ks, vs)]
    for r, src in pairs:
        buffers = [torch.full_like(t, torch.nan) for t in (qs[r], ks[src], vs[src])]  # poisoned
        softmax_d = backward(douts[r], qs[r], ks[src], vs[src], outs[r], lses[r], *buffers, 0.0, scale,
                             causal and src == r, -1, -1, 0.0, None, True, None)
        want_d = (douts[r].float() * outs[r].float()).sum(-1).transpose(1, 2)
        assert torch.allclose(softmax_d[:, :, : qs[r].shape[1]], want_d) and not softmax_d[:, :, qs[r].shape[1]:].any()
        for grad, index, buffer in zip(grads, (r, src, src), buffers):
            grad[index] += buffer.float()
    cat = lambda chunks: torch.cat(chunks, dim=1)  # noqa: E731
    return cat(outs), torch.cat(lses, dim=2), tuple(cat(chunks).to(q.dtype) for chunks in grads)


RING_CASES = [  # (dtype, head_dim, chunk length, (H, Hk))
    (torch.bfloat16, 59, 67, (4, 2)),
    (torch.float16, 64, 113, (4, 1)),
    (torch.float32, 40, 3, (4, 4)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype, head_dim, chunk, heads", RING_CASES, ids=["bf16-d59", "fp16-d64", "fp32-d40"])
@pytest.mark.parametrize("wrapped", [False, True], ids=["functions", "wrapped-ops"])
def test_ring_attention(device, causal, dtype, head_dim, chunk, heads, wrapped):
    """A two-rank ring built from the private forward and backward equals full attention: out and LSE
    within the bound of the fp32 reference, dq, dk, dv within the gradient bound."""
    if device == "cpu" and dtype == torch.float16 and head_dim == 64 and wrapped:
        pytest.skip("the largest case runs once on CPU")
    if device == "cuda" and dtype == torch.float32:
        pytest.skip("fp32 is a CPU dtype (the CUDA kernels take fp16 and bf16)")
    seed = case_seed("ring", device, causal, dtype, head_dim, wrapped)
    q, k, v = random_qkv(2, 2 * chunk, 2 * chunk, *heads, head_dim, dtype, device, seed)
    dout = torch.randn_like(q)
    scale = head_dim**-0.5
    forward, backward = (_wrapped_flash_attn_forward, _wrapped_flash_attn_backward) if wrapped else \
        (_flash_attn_forward, _flash_attn_backward)
    out, lse, grads = _ring_attention(q, k, v, dout, scale, causal, forward, backward)
    assert_matches_reference(out, lse, q, k, v, scale, causal)
    assert_grads_match_reference(grads, q, k, v, dout, scale, causal, stored_out=out)


@pytest.mark.parametrize("device", DEVICES)
def test_private_forward_with_dropout_matches_public(device):
    """With dropout, the private forward returns flash_attn_func's out, LSE and S_dmask under the same
    torch seed, and its rng_state makes the private backward give flash_attn_func's gradients."""
    seed = case_seed("private dropout", device)
    q, k, v = random_qkv(2, 70, 130, 4, 2, 59, torch.bfloat16, device, seed)
    dout = torch.randn_like(q)
    leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
    slopes = torch.rand(4, device=device) * 0.3
    options = {"dropout_p": 0.2, "softmax_scale": 0.11, "causal": True, "window_size": (40, -1), "alibi_slopes": slopes,
               "deterministic": True}  # fmt: skip
    torch.manual_seed(seed)
    out, lse, s_dmask = flash_attn_func(*leaves, return_attn_probs=True, **options)
    grads = torch.autograd.grad(out, leaves, dout)
    torch.manual_seed(seed)
    p_out, p_lse, p_s_dmask, rng_state = _flash_attn_forward(q, k, v, 0.2, 0.11, True, 40, -1, 0.0, slopes, True)
    assert torch.equal(p_out, out) and torch.equal(p_lse, lse) and torch.equal(p_s_dmask, s_dmask)
    assert rng_state.dtype == torch.int64 and rng_state.shape == (2,)
    p_grads = tuple(torch.full_like(t, torch.nan) for t in (q, k, v))
    _flash_attn_backward(dout, q, k, v, p_out, p_lse, *p_grads, 0.2, 0.11, True, 40, -1, 0.0, slopes, True, rng_state)
    assert all(torch.equal(a, b) for a, b in zip(p_grads, grads))


@pytest.mark.parametrize("device", DEVICES)
def test_private_varlen_matches_public(device):
    """_flash_attn_varlen_forward / _backward give flash_attn_varlen_func's out, LSE and gradients;
    softmax_d has flash-attn's layout (nheads, total_q + 128 * batch), sequence b from cu_seqlens_q[b] +
    128 * b; zero_tensors leaves rows past the last sequence at out 0, LSE -inf."""
    lengths_q, lengths_k = [3, 0, 70, 1], [40, 6, 70, 0]
    q, k, v, varlen = packed_batch(lengths_q, lengths_k, (4, 2), 59, torch.float16, device, case_seed("pv", device))
    q_extra = torch.cat([q, torch.randn_like(q[:5])])  # 5 rows past the last sequence
    dout = torch.randn_like(q_extra)
    leaves = tuple(t.detach().requires_grad_() for t in (q_extra, k, v))
    out, lse, _ = flash_attn_varlen_func(*leaves, *varlen.values(), causal=True, deterministic=True,
                                         return_attn_probs=True)  # fmt: skip
    grads = torch.autograd.grad(out, leaves, dout)
    args = (*varlen.values(), 0.0, 59**-0.5, True)
    p_out, p_lse, s_dmask, _ = _flash_attn_varlen_forward(q_extra, k, v, *args, zero_tensors=True)
    total = q.shape[0]
    assert torch.equal(p_out[:total], out[:total]) and torch.equal(p_lse[:, :total], lse[:, :total])
    assert not p_out[total:].any() and (p_lse[:, total:] == -torch.inf).all() and s_dmask.shape == (0,)
    p_grads = tuple(torch.full_like(t, torch.nan) for t in (q_extra, k, v))
    softmax_d = _flash_attn_varlen_backward(dout, q_extra, k, v, out, lse, *p_grads, *args[:-3], 0.0, 59**-0.5,
                                            True, -1, -1, 0.0, None, True)  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip(p_grads, grads))
    assert softmax_d.shape == (4, total + 5 + 128 * 4) and softmax_d.dtype == torch.float32
    rowsum = (dout.float() * out.float()).sum(-1).T  # [H, total_q + 5]
    starts = varlen["cu_seqlens_q"].tolist()
    expected = torch.zeros_like(softmax_d)
    for b in range(4):
        expected[:, starts[b] + 128 * b : starts[b + 1] + 128 * b] = rowsum[:, starts[b] : starts[b + 1]]
    assert torch.allclose(softmax_d, expected)


def test_private_entry_point_errors():
    q, k, v = _qkv("cpu")
    with pytest.raises(ValueError, match=r"return_softmax=True needs dropout_p > 0"):
        _flash_attn_forward(q, k, v, 0.0, 0.25, False, -1, -1, 0.0, None, True)


def test_wrapped_ops_compile():
    """The custom-op forms trace into one graph (their fake implementations) and compute what eager does."""

    def step(q, k, v, dout):
        out, lse, _, _ = _wrapped_flash_attn_forward(q, k, v, 0.0, 0.3, True, -1, -1, 0.0, None, False)
        dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
        softmax_d = _wrapped_flash_attn_backward(dout, q, k, v, out, lse, dq, dk, dv, 0.0, 0.3, True, -1, -1, 0.0,
                                                 None, True)  # fmt: skip
        return out, lse, softmax_d, dq, dk, dv

    q, k, v = random_qkv(1, 9, 21, 2, 1, 24, torch.float32, "cpu", case_seed("compile private"))
    dout = torch.randn_like(q)
    compiled = torch.compile(step, fullgraph=True, backend="eager")
    assert all(torch.equal(a, b) for a, b in zip(compiled(q, k, v, dout), step(q, k, v, dout)))
