"""flash_attn_with_kvcache against an fp32 reference on the gathered cache, on CPU and (marked gpu) CUDA.

The reference appends the new keys and values itself (rotated by a rotary written here), gathers each
sequence's rows [leftpad, cache_seqlens + seqlen_new) from the contiguous or paged cache, rotates q,
and runs attention_ref with the same options. Outputs follow the project's bound (tests/helpers.py:
twice PyTorch's own error in the input dtype, plus eps); the cache after the append must equal the
reference's exactly.
"""

import os
import re
import subprocess
import sys

import pytest
import torch
from torch import Tensor

from flashattn import KVCache, apply_rotary_emb, flash_attn_with_kvcache
from flashattn.reference import attention_ref

from helpers import DEVICES, case_seed, poisoned_allocations, rounding_floor

OUT_EPS, LSE_EPS = 1e-5, 1e-4


def rotate(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, positions: Tensor) -> Tensor:
    """x [S, H, D] with row s at positions[s], in fp32 elementwise ops, cast back."""
    rotary_dim = 2 * cos.shape[1]
    c, s = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)
    r = x[..., :rotary_dim].float()
    if interleaved:
        a, b = r[..., 0::2], r[..., 1::2]
        out = torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)
    else:
        a, b = r.chunk(2, dim=-1)
        out = torch.cat((a * c - b * s, a * s + b * c), dim=-1)
    return torch.cat((out.to(x.dtype), x[..., rotary_dim:]), dim=-1)


def make_case(device, dtype, batch, seqlen_q, seqlen_new, heads, heads_k, head_dim, page, seed, capacity=97,
              leftpad=False, batch_idx=False, rotary=None, v_head_dim=None):
    """flash_attn_with_kvcache's arguments: random q, caches (v_cache and v of head dim v_head_dim, by default
    head_dim), lengths and index tensors."""
    gen = torch.Generator(device=device).manual_seed(seed)
    v_head_dim = v_head_dim or head_dim

    def randn(*shape):
        return torch.randn(shape, generator=gen, device=device, dtype=dtype)

    seqlens = torch.randint(0, capacity - seqlen_new + 1, (batch,), generator=gen, device=device).to(torch.int32)
    case = {"q": randn(batch, seqlen_q, heads, head_dim), "cache_seqlens": seqlens}
    if page:
        pages = -(-capacity // page)
        order = torch.randperm(batch * pages + 2, generator=gen, device=device)[: batch * pages]
        case["block_table"] = order.reshape(batch, pages).to(torch.int32)
        case["k_cache"], case["v_cache"] = randn(batch * pages + 2, page, heads_k, head_dim), \
            randn(batch * pages + 2, page, heads_k, v_head_dim)
    else:
        rows = batch + 2 if batch_idx else batch
        case["k_cache"], case["v_cache"] = randn(rows, capacity, heads_k, head_dim), randn(rows, capacity, heads_k,
                                                                                              v_head_dim)
        if batch_idx:
            case["cache_batch_idx"] = torch.randperm(rows, generator=gen, device=device)[:batch].to(torch.int32)
    if seqlen_new:
        case["k"], case["v"] = randn(batch, seqlen_new, heads_k, head_dim), randn(batch, seqlen_new, heads_k,
                                                                                 v_head_dim)
    if leftpad:
        case["cache_leftpad"] = (torch.rand(batch, generator=gen, device=device) * seqlens.float() * 0.5).to(torch.int32)
    if rotary is not None:
        rotary_dim, interleaved = rotary
        angles = torch.rand(capacity + seqlen_q + 1, rotary_dim // 2, generator=gen, device=device) * 6
        case.update(rotary_cos=angles.cos(), rotary_sin=angles.sin(), rotary_interleaved=interleaved)
    return case


def reference(case: dict, causal: bool, window_size, softcap: float, alibi_slopes, upcast: bool):
    """(out, lse, k_cache, v_cache) of the semantics, sequence by sequence (caches: cloned, appended)."""
    k_cache, v_cache = case["k_cache"].clone(), case["v_cache"].clone()
    q = case["q"]
    batch, seqlen_q = q.shape[:2]
    seqlen_new = case["k"].shape[1] if "k" in case else 0
    outs, lses = [], []
    for b in range(batch):
        start = int(case["cache_seqlens"][b])
        leftpad = int(case["cache_leftpad"][b]) if "cache_leftpad" in case else 0

        def index(rows: Tensor):
            if "block_table" in case:
                page = k_cache.shape[1]
                return case["block_table"][b].long()[rows // page], rows % page
            row = int(case["cache_batch_idx"][b]) if "cache_batch_idx" in case else b
            return torch.full_like(rows, row), rows

        rotary = "rotary_cos" in case
        if seqlen_new:
            k_new = case["k"][b]
            if rotary:
                positions = torch.arange(start, start + seqlen_new, device=q.device)  # the cache rows, as flash-attn
                k_new = rotate(k_new, case["rotary_cos"], case["rotary_sin"], case["rotary_interleaved"], positions)
            rows = index(torch.arange(start, start + seqlen_new, device=q.device))
            k_cache[rows], v_cache[rows] = k_new, case["v"][b]
        rows = index(torch.arange(leftpad, start + seqlen_new, device=q.device))
        keys, values = k_cache[rows], v_cache[rows]
        q_b = q[b]
        if rotary:
            per_row = causal or window_size != (-1, -1)
            positions = start + (torch.arange(seqlen_q, device=q.device) if per_row else
                                           torch.zeros(seqlen_q, dtype=torch.long, device=q.device))
            q_b = rotate(q_b, case["rotary_cos"], case["rotary_sin"], case["rotary_interleaved"], positions)
        accurate = torch.float64 if q.dtype == torch.float32 and upcast else torch.float32 if upcast else q.dtype
        slopes = None if alibi_slopes is None else alibi_slopes.to(torch.float32)
        out, lse = attention_ref(*(t.unsqueeze(0).to(accurate) for t in (q_b, keys, values)), None, causal,
                                 window_size, softcap, slopes, upcast=upcast)
        outs.append(out[0])
        lses.append(lse[0])
    return torch.stack(outs), torch.stack(lses), k_cache, v_cache


def check(case, causal=False, window_size=(-1, -1), softcap=0.0, alibi=False, num_splits=0):
    q = case["q"]
    slopes = torch.rand(q.shape[2], device=q.device) * 0.3 if alibi else None
    ref_out, ref_lse, k_ref, v_ref = reference(case, causal, window_size, softcap, slopes, upcast=True)
    low_out, low_lse, _, _ = reference(case, causal, window_size, softcap, slopes, upcast=False)
    with poisoned_allocations():
        out, lse = flash_attn_with_kvcache(**case, causal=causal, window_size=window_size, softcap=softcap,
                                           alibi_slopes=slopes, num_splits=num_splits, return_softmax_lse=True)
    assert torch.equal(case["k_cache"], k_ref) and torch.equal(case["v_cache"], v_ref), "cache after the append"
    err = (out.double() - ref_out.double()).abs().max().item()
    bound = max(2 * (low_out.double() - ref_out.double()).abs().max().item(), rounding_floor(ref_out, q.dtype)) + OUT_EPS
    assert err <= bound, f"out: {err:.3g} > {bound:.3g}"
    seen = torch.isfinite(ref_lse)
    assert torch.equal(torch.isinf(lse) & (lse < 0), ~seen), "rows that see no key: lse -inf"
    lse_err = (lse[seen].double() - ref_lse[seen].double()).abs().max().item() if seen.any() else 0.0
    lse_bound = 2 * (low_lse[seen].double() - ref_lse[seen].double()).abs().max().item() + LSE_EPS if seen.any() else 1
    assert lse_err <= lse_bound, f"lse: {lse_err:.3g} > {lse_bound:.3g}"
    return out


DTYPES = {"cpu": [torch.float32, torch.bfloat16], "cuda": [torch.float16, torch.bfloat16]}
OPTIONS = [
    pytest.param({}, id="plain"),
    pytest.param({"causal": True}, id="causal"),
    pytest.param({"causal": True, "window_size": (11, 0), "rotary": (16, True), "leftpad": True}, id="window-rot-i"),
    pytest.param({"rotary": (32, False), "softcap": 20.0, "batch_idx": True}, id="rot-half-softcap-idx"),
    pytest.param({"alibi": True, "causal": True, "window_size": (30, -1)}, id="alibi-window"),
]
SHAPES = [(1, 1, 8, 2), (2, 2, 4, 4), (7, 0, 8, 1), (1, 0, 4, 2)]  # (seqlen_q, seqlen_new, H, Hk)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("page", [None, 16, 5], ids=["contiguous", "page16", "page5"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"q{s[0]}new{s[1]}h{s[2]}kv{s[3]}")
@pytest.mark.parametrize("options", OPTIONS)
def test_matches_reference(device, page, shape, options):
    seqlen_q, seqlen_new, heads, heads_k = shape
    options = dict(options)
    make = {key: options.pop(key) for key in ("rotary", "leftpad", "batch_idx") if key in options}
    if page and make.get("batch_idx"):
        pytest.skip("cache_batch_idx is for contiguous caches")
    for dtype in DTYPES[device]:
        seed = case_seed("kvcache", device, page, shape, sorted(options), sorted(make), dtype)
        case = make_case(device, dtype, 3, seqlen_q, seqlen_new, heads, heads_k, 64, page, seed, **make)
        check(case, **options)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("page", [None, 16, 64, 256], ids=["contiguous", "page16", "page64", "page256"])
@pytest.mark.parametrize("seqlen_q, seqlen_new", [(1, 1), (2, 2), (7, 0), (128, 5)])
@pytest.mark.parametrize("num_splits", [1, 0, 7])
def test_gpu_sweep(dtype, head_dim, page, seqlen_q, seqlen_new, num_splits):
    """Long ragged caches (up to 700 rows), GQA: splits 1, automatic and 7 all within the bound."""
    seed = case_seed("kv gpu", dtype, head_dim, page, seqlen_q, seqlen_new, num_splits)
    case = make_case("cuda", dtype, 3, seqlen_q, seqlen_new, 8, 2, head_dim, page, seed, capacity=700,
                     rotary=(head_dim // 2, seqlen_q % 2 == 0), leftpad=seqlen_q > 1)
    check(case, causal=seqlen_q > 1, num_splits=num_splits)


@pytest.mark.gpu
def test_gpu_long_paged_cache_decoding():
    """B=1, a 64k-token cache in pages of 16 (shuffled), GQA 32/8, automatic splits."""
    case = make_case("cuda", torch.bfloat16, 1, 1, 1, 32, 8, 128, 16, case_seed("kv long"), capacity=65536)
    check(case)


@pytest.mark.gpu
@pytest.mark.parametrize("page", [1, 5, 16])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_gpu_block_table_windows(page, num_splits):
    """The decoding kernel copies a split's block-table entries into shared memory 512 at a time (two
    windows, the next copied while the current is read): splits of up to ~12000 entries walk many
    windows, from first entries that are not window-aligned (leftpad, ragged lengths)."""
    seed = case_seed("kv windows", page, num_splits)
    case = make_case("cuda", torch.bfloat16, 2, 1, 1, 16, 4, 64, page, seed, capacity=12000, leftpad=True)
    check(case, num_splits=num_splits)


@pytest.mark.parametrize("device", DEVICES)
def test_splits_agree(device):
    dtype = DTYPES[device][-1]
    case = make_case(device, dtype, 2, 1, 1, 8, 2, 64, None, case_seed("splits", device), capacity=300)
    outs = []
    for splits in (1, 3, 0):
        trial = {**case, "k_cache": case["k_cache"].clone(), "v_cache": case["v_cache"].clone()}
        outs.append(check(trial, num_splits=splits))
    assert all((o.float() - outs[0].float()).abs().max() <= 2 * torch.finfo(dtype).eps for o in outs)


@pytest.mark.gpu
def test_gpu_split_merge_in_graphs_and_on_two_streams():
    """The decoding kernel merges its splits itself, counting finished splits in buffers that every
    call leaves zero: one per stream, a fresh one inside each CUDA graph. Repeated eager calls, two
    captured graphs replayed in turn, and calls on two streams at once all give the eager result bit
    for bit (the merge sums the splits in a fixed order)."""
    case = make_case("cuda", torch.bfloat16, 1, 1, 0, 32, 8, 128, None, case_seed("merge"), capacity=20000)
    case2 = make_case("cuda", torch.bfloat16, 2, 1, 0, 16, 4, 128, 16, case_seed("merge 2"), capacity=9000)
    call = lambda c: flash_attn_with_kvcache(**c, return_softmax_lse=True)  # noqa: E731
    expected, expected2 = check(case), check(case2)
    for _ in range(3):
        assert torch.equal(call(case)[0], expected) and torch.equal(call(case2)[0], expected2)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            call(case), call(case2)
    torch.cuda.current_stream().wait_stream(side)
    graphs, outs = [], []
    for c in (case, case2):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs.append(call(c)[0])
        graphs.append(graph)
    for _ in range(3):
        for graph in graphs:
            graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(outs[0], expected) and torch.equal(outs[1], expected2)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    results = [[], []]
    for _ in range(20):
        for s, c, r in zip(streams, (case, case2), results):
            with torch.cuda.stream(s):
                r.append(call(c)[0])
    torch.cuda.synchronize()
    assert all(torch.equal(o, expected) for o in results[0]) and all(torch.equal(o, expected2) for o in results[1])


_DENSE_DECODE_CHECK = """
import torch
from helpers import case_seed
from test_kvcache import check, make_case
for page in (None, 256):
    for splits in (1, 0, 5):
        case = make_case("cuda", torch.bfloat16, 2, 1, 1, 32, 8, 128, page, case_seed("dense", page, splits),
                         capacity=3000)
        check(case, num_splits=splits)
print("dense decode ok")
"""


@pytest.mark.gpu
def test_gpu_decoding_within_99kb_of_shared_memory():
    """The decoding kernel's Wide blocks (104 KB) do not fit sm_86/sm_89 (99 KB a block); there every
    decode runs Dense blocks. FLASHATTN_MAX_SMEM_PER_BLOCK makes the H100 take that path for the
    contiguous and 256-row-page caches, whose decode it would otherwise run Wide."""
    env = {**os.environ, "FLASHATTN_MAX_SMEM_PER_BLOCK": str(99 * 1024)}
    result = subprocess.run([sys.executable, "-c", _DENSE_DECODE_CHECK], cwd=os.path.dirname(__file__), env=env,
                            capture_output=True, text=True)
    assert result.returncode == 0 and "dense decode ok" in result.stdout, result.stderr[-3000:]


@pytest.mark.parametrize("device", DEVICES)
def test_int_cache_seqlens_and_plain_return(device):
    dtype = DTYPES[device][0]
    case = make_case(device, dtype, 2, 1, 0, 4, 4, 64, None, case_seed("int seqlens", device))
    tensor_out = flash_attn_with_kvcache(**{**case, "cache_seqlens": torch.full_like(case["cache_seqlens"], 40)})
    out = flash_attn_with_kvcache(**{**case, "cache_seqlens": 40})
    assert isinstance(out, Tensor) and torch.equal(out, tensor_out)


@pytest.mark.parametrize("device", DEVICES)
def test_kvcache_generation_loop(device):
    """KVCache over a prompt and three steps equals attention over everything so far, each step."""
    dtype = DTYPES[device][0]
    gen = torch.Generator(device=device).manual_seed(case_seed("loop", device))
    batch, heads, heads_k, head_dim, total = 2, 4, 2, 64, 9
    q, k, v = (torch.randn(batch, total, h, head_dim, generator=gen, device=device, dtype=dtype)
               for h in (heads, heads_k, heads_k))
    for page in (None, 4):
        cache = KVCache(batch, 16, heads_k, head_dim, num_layers=1, device=device, dtype=dtype, page_size=page)
        for start, stop in ((0, 6), (6, 7), (7, 8), (8, 9)):
            out = cache.attend(0, q[:, start:stop], k[:, start:stop], v[:, start:stop], causal=True)
            cache.advance(stop - start)
            expected, _ = attention_ref(q[:, start:stop].float(), k[:, :stop].float(), v[:, :stop].float(),
                                        causal=True)
            low, _ = attention_ref(q[:, start:stop], k[:, :stop], v[:, :stop], causal=True, upcast=False)
            bound = max(2 * (low.double() - expected.double()).abs().max().item(),
                        rounding_floor(expected, dtype)) + OUT_EPS
            assert (out.double() - expected.double()).abs().max().item() <= bound


def test_apply_rotary_emb_matches_the_tests_rotation():
    x = torch.randn(2, 5, 3, 16)
    angles = torch.rand(20, 4) * 6
    for interleaved in (True, False):
        ours = apply_rotary_emb(x, angles.cos(), angles.sin(), interleaved, seqlen_offsets=7)
        for b in range(2):
            expected = rotate(x[b], angles.cos(), angles.sin(), interleaved, torch.arange(7, 12))
            assert torch.equal(ours[b], expected)


def _cpu_case():
    return make_case("cpu", torch.float32, 2, 1, 1, 4, 2, 64, 16, case_seed("errors"))  # 16 pages, capacity 112


def _int32(*values):
    return torch.tensor(values, dtype=torch.int32)


def _contiguous(c):
    c.pop("block_table")
    c["k_cache"], c["v_cache"] = torch.randn(2, 112, 2, 64), torch.randn(2, 112, 2, 64)


def _rotary(c, rows):
    c.update(rotary_cos=torch.ones(rows, 16), rotary_sin=torch.zeros(rows, 16))


@pytest.mark.parametrize("change, error, words", [
    (lambda c: c.update(block_table=c["block_table"].long()), TypeError, "block_table must be int32"),
    (lambda c: c.update(block_table=c["block_table"][:1]), ValueError, "block_table must have shape"),
    (lambda c: c.update(cache_seqlens=c["cache_seqlens"].float()), TypeError, "cache_seqlens must be int32"),
    (lambda c: c.update(cache_seqlens=c["cache_seqlens"][:1]), ValueError, "cache_seqlens must have shape"),
    (lambda c: c.pop("v"), ValueError, "k and v must be given together"),
    (lambda c: c.update(cache_batch_idx=torch.zeros(2, dtype=torch.int32)), ValueError, "cache_batch_idx cannot"),
    (lambda c: c.update(cache_seqlens=torch.full((2,), 112, dtype=torch.int32)), ValueError, "cache_seqlens + seqlen_new"),
    (lambda c: c["block_table"].__setitem__((0, 0), 10_000), ValueError, "block_table entries"),
    (lambda c: c.update(rotary_cos=torch.ones(5, 40), rotary_sin=torch.ones(5, 40)), ValueError, "rotary_cos"),
    (lambda c: c.update(q=c["q"][..., :32]), ValueError, "head dims differ"),
    (lambda c: c.update(num_splits=-1), ValueError, "num_splits"),
    (lambda c: c.update(cache_leftpad=c["cache_seqlens"] + 1), ValueError, "cache_leftpad must be in [0, cache_seqlens]"),
    (lambda c: c.update(block_table=None, k_cache=c["k_cache"][:1], v_cache=c["v_cache"][:1]), ValueError,
     "k_cache holds 1 sequences but q has a batch of 2"),
    (lambda c: c.update(v=torch.cat((c["v"], c["v"]), 1)), ValueError, "must have the same seqlen_new"),
    # index tensors: dtypes and shapes
    (lambda c: c.update(cache_seqlens=c["cache_seqlens"].long()), TypeError, "cache_seqlens must be int32"),
    (lambda c: c.update(cache_seqlens=3.0), TypeError, "cache_seqlens must be an int"),
    (lambda c: c.update(cache_leftpad=torch.zeros(2, dtype=torch.long)), TypeError, "cache_leftpad must be int32"),
    (lambda c: c.update(cache_leftpad=_int32(0, 0, 0)), ValueError, "cache_leftpad must have shape"),
    (lambda c: c.update(block_table=c["block_table"][0]), ValueError, "block_table must have shape"),
    (lambda c: (_contiguous(c), c.update(cache_batch_idx=torch.zeros(2, dtype=torch.long))), TypeError,
     "cache_batch_idx must be int32"),
    # data tensors
    (lambda c: c.update(q=c["q"][0]), ValueError, "q must be 4-D"),
    (lambda c: c.update(q=c["q"].int()), TypeError, "q has dtype"),
    (lambda c: c.update(k_cache=c["k_cache"].double()), TypeError, "k_cache has dtype"),
    (lambda c: c.update(v_cache=c["v_cache"][:-1]), ValueError, "k_cache"),
    (lambda c: c.update(q=c["q"][:, :, :3]), ValueError, "query heads (3)"),
    (lambda c: c.update(k=c["k"][:, :, :1]), ValueError, "k must have shape"),
    (lambda c: c.update(v=c["v"][:1]), ValueError, "v must have shape"),
    (lambda c: c.update(k=c["k"].half()), TypeError, "k must be a torch.float32 tensor"),
    (lambda c: c.pop("k"), ValueError, "k and v must be given together"),
    (lambda c: (_contiguous(c), c.update(q=torch.randn(3, 1, 4, 64), k=torch.randn(3, 1, 2, 64),
                                         v=torch.randn(3, 1, 2, 64), cache_seqlens=_int32(1, 2, 3))), ValueError,
     "k_cache holds 2 sequences but q has a batch of 3"),
    (lambda c: c.update(v=torch.randn(2, 3, 2, 64)), ValueError, "k (2, 1, 2, 64) and v (2, 3, 2, 64)"),
    (lambda c: c.update(rotary_cos=torch.ones(9, 16)), ValueError, "rotary_cos and rotary_sin must be given together"),
    (lambda c: (_rotary(c, 9), c.update(rotary_sin=torch.ones(8, 16))), ValueError, "rotary_cos and rotary_sin"),
    # values, checked on the host for CPU tensors (on CUDA by the kernels, which record a fault: test_kvcache_faults.py)
    (lambda c: c.update(cache_seqlens=_int32(-1, 3)), ValueError, "cache_seqlens + seqlen_new must be in [0, 112]"),
    (lambda c: c.update(cache_seqlens=_int32(3, 112)), ValueError, "cache_seqlens + seqlen_new must be in [0, 112]"),
    (lambda c: c.update(cache_seqlens=113), ValueError, "cache_seqlens=113"),
    (lambda c: c.pop("cache_seqlens"), ValueError, "cache_seqlens + seqlen_new"),
    (lambda c: c["block_table"].__setitem__((0, 0), -1), ValueError, "block_table entries must be in [0, 16)"),
    (lambda c: (_contiguous(c), c.update(cache_batch_idx=_int32(0, 2))), ValueError,
     "cache_batch_idx entries must be in [0, 2)"),
    (lambda c: c.update(cache_leftpad=_int32(-1, 0)), ValueError, "cache_leftpad must be in [0, cache_seqlens]"),
    # leftpad past cache_seqlens: the padding must lie within the cached rows
    (lambda c: (_rotary(c, 20), c.update(cache_seqlens=_int32(0, 3), cache_leftpad=_int32(1, 0))), ValueError,
     "cache_leftpad must be in [0, cache_seqlens]"),
    (lambda c: (_rotary(c, 9), c.update(cache_seqlens=_int32(5, 9))), ValueError,
     "rotary positions up to 9 need rotary_cos/sin of at least 10 rows, got 9"),
    # options
    (lambda c: c.update(num_splits=True), ValueError, "num_splits"),
    (lambda c: c.update(window_size=(1, 2, 3)), ValueError, "window_size"),
    (lambda c: c.update(softcap=-1.0), ValueError, "softcap"),
    (lambda c: c.update(alibi_slopes=torch.ones(3)), ValueError, "alibi_slopes"),
    (lambda c: c.update(softmax_scale=0.0), ValueError, "softmax_scale"),
])
def test_bad_arguments_name_themselves(change, error, words):
    flash_attn_with_kvcache(**_cpu_case())  # valid as built
    case = _cpu_case()
    change(case)
    with pytest.raises(error, match=re.escape(words)):
        flash_attn_with_kvcache(**case)


@pytest.mark.parametrize("device", DEVICES)
def test_unused_block_table_entries_are_not_read(device):
    """Serving systems pad block tables (-1 here): entries past a sequence's rows are never looked at."""
    dtype = DTYPES[device][0]
    case = make_case(device, dtype, 2, 1, 1, 4, 2, 64, 16, case_seed("padded table", device))
    case["cache_seqlens"] = torch.tensor([20, 47], dtype=torch.int32, device=device)
    padded = case["block_table"].clone()
    for b, rows in enumerate((21, 48)):
        padded[b, -(-rows // 16):] = -1
    outs, caches = [], []
    for table in (case["block_table"], padded):
        trial = {**case, "k_cache": case["k_cache"].clone(), "v_cache": case["v_cache"].clone(), "block_table": table}
        outs.append(flash_attn_with_kvcache(**trial))
        caches.append(trial["k_cache"])
    assert torch.equal(outs[0], outs[1]) and torch.equal(caches[0], caches[1])
    if device == "cpu":  # the last entry a sequence uses is still checked (48 rows: entry 2 of page size 16)
        padded[1, 2] = -1
        with pytest.raises(ValueError, match=re.escape("block_table entries must be in [0, 16)")):
            flash_attn_with_kvcache(**{**case, "block_table": padded})


def test_rotary_table_needs_rows_up_to_the_last_position():
    """Without causal/window every query sits at cache_seqlens; with causal, query i at + i."""
    case = make_case("cpu", torch.float32, 1, 3, 2, 4, 2, 64, None, case_seed("rotary rows"), rotary=(32, False))
    case["cache_seqlens"] = torch.tensor([10], dtype=torch.int32)
    case["rotary_cos"], case["rotary_sin"] = case["rotary_cos"][:12], case["rotary_sin"][:12]  # positions 0 .. 11
    flash_attn_with_kvcache(**{**case, "k_cache": case["k_cache"].clone(), "v_cache": case["v_cache"].clone()})
    for options in ({"causal": True}, {"window_size": (4, 4)}):  # query i at 10 + i
        with pytest.raises(ValueError, match=re.escape("rotary positions up to 12 need rotary_cos/sin of at least "
                                                       "13 rows, got 12")):
            flash_attn_with_kvcache(**case, **options)
    # Positions are cache rows whatever cache_leftpad is (flash-attn's convention): 2 rows of padding
    # move no position, so causal queries still reach 12.
    with pytest.raises(ValueError, match=re.escape("rotary positions up to 12 need rotary_cos/sin of at least "
                                                   "13 rows, got 12")):
        flash_attn_with_kvcache(**case, causal=True, cache_leftpad=_int32(2))
    # The new keys need rows too: 10 and 11, even when every query sits at 10.
    short = {**case, "rotary_cos": case["rotary_cos"][:11], "rotary_sin": case["rotary_sin"][:11]}
    with pytest.raises(ValueError, match=re.escape("rotary positions up to 11 need rotary_cos/sin of at least 12 "
                                                   "rows, got 11")):
        flash_attn_with_kvcache(**short)


@pytest.mark.parametrize("device", DEVICES)
def test_rows_that_see_no_key(device):
    """An empty cache, a sequence whose cache_leftpad equals its cache_seqlens (allowed: the bound), causal
    queries above the first key: out 0, LSE -inf (check also asserts where -inf is)."""
    dtype = DTYPES[device][0]
    case = make_case(device, dtype, 3, 5, 0, 4, 2, 64, None, case_seed("empty", device), leftpad=True)
    case["cache_seqlens"] = torch.tensor([0, 7, 2], dtype=torch.int32, device=device)
    case["cache_leftpad"] = torch.tensor([0, 7, 0], dtype=torch.int32, device=device)
    out = check(case, causal=True)
    assert (out[:2] == 0).all() and (out[2, :3] == 0).all() and (out[2, 3:] != 0).any()


@pytest.mark.parametrize("device", DEVICES)
def test_strided_views(device):
    """q a (B, H, S, D) tensor seen as (B, S, H, D); the caches the K and V halves of one packed
    (B, S, 2, Hk, D) tensor: strides are honoured, and the append writes through the views."""
    dtype = DTYPES[device][-1]
    gen = torch.Generator(device=device).manual_seed(case_seed("strided", device))
    batch, capacity, heads, heads_k, head_dim = 2, 80, 8, 2, 64
    kv = torch.randn(batch, capacity, 2, heads_k, head_dim, generator=gen, device=device, dtype=dtype)
    case = {
        "q": torch.randn(batch, heads, 2, head_dim, generator=gen, device=device, dtype=dtype).transpose(1, 2),
        "k_cache": kv[:, :, 0], "v_cache": kv[:, :, 1],
        "k": torch.randn(batch, heads_k, 2, head_dim, generator=gen, device=device, dtype=dtype).transpose(1, 2),
        "v": torch.randn(batch, 2, heads_k, head_dim, generator=gen, device=device, dtype=dtype),
        "cache_seqlens": torch.tensor([31, 78], dtype=torch.int32, device=device),
    }
    before = kv.clone()
    check(case, causal=True)
    assert not torch.equal(kv, before), "the append must write into the packed tensor"
