"""flash_attn_with_kvcache over an FP8 (e4m3) cache on the FP8 KV-cache kernel (torch.ops.flashattn.
fwd_kvcache_fp8, the decoding kernel reading e4m3 tiles; flashattn.fp8.runs_kvcache_kernel).

The kernel converts the stored e4m3 values to q's 16-bit type exactly and folds the descales into
the scores and the output, so it is held to the 16-bit bound (tests/test_kvcache.py's check: twice
PyTorch's own error in q's dtype on the same real values, plus eps) against the fp32 reference on
the real values, stored x descale of the sequence that reads them (test_kvcache.reference on a
dequantised copy of the cache). Every finite e4m3 code is read exactly through both operands.
Appended rows are stored as given (with rotary: rotated and re-quantised, byte for byte). The
calls the kernel does not take run the dequantising route (tests/test_fp8.py holds that route).
Without a GPU: which calls the kernel takes (runs_kvcache_kernel), the operator's fake, and an FP8 q
dequantised before the call (on CPU through the route; on CUDA through the kernel).
"""

import pytest
import torch
from test_kvcache import LSE_EPS, OUT_EPS, make_case, reference, rotate

import flashattn
from flashattn import flash_attn_with_kvcache, fp8
from helpers import DEVICES, case_seed, poisoned_allocations, rounding_floor

FP8 = torch.float8_e4m3fn


def fp8_case(case, gen):
    """case (test_kvcache.make_case, 16-bit) with its caches and new rows quantised to e4m3 under
    per-(sequence, KV head) descales: (the FP8 call's arguments, the real values' case for the
    reference: fp32 caches holding stored x descale of the sequence that owns each row, rows no
    sequence owns x 1)."""
    batch, heads_k = case["q"].shape[0], case["k_cache"].shape[2]
    device = case["q"].device
    descale = {name: torch.rand(batch, heads_k, generator=gen).add(0.5).mul(2.0 ** -3).to(device)
               for name in ("k_descale", "v_descale")}
    owner_scale = {}
    for name, cache in (("k", case["k_cache"]), ("v", case["v_cache"])):
        per_row = torch.ones(cache.shape[0], heads_k, device=device)  # the descale of a cache row or page
        if "block_table" in case:
            per_row[case["block_table"].long()] = descale[f"{name}_descale"][:, None, :].expand(
                -1, case["block_table"].shape[1], -1)
        else:
            rows = case["cache_batch_idx"].long() if "cache_batch_idx" in case else torch.arange(batch, device=device)
            per_row[rows] = descale[f"{name}_descale"]
        owner_scale[name] = per_row
    fp8_args, real = dict(case), dict(case)
    for name in ("k", "v"):
        cache, scale = case[f"{name}_cache"], owner_scale[name]
        stored = (cache.float() / scale[:, None, :, None]).to(FP8)
        fp8_args[f"{name}_cache"] = stored
        real[f"{name}_cache"] = stored.float() * scale[:, None, :, None]
        if name in case:
            stored_new = (case[name].float() / descale[f"{name}_descale"][:, None, :, None]).to(FP8)
            fp8_args[name] = stored_new
            real[name] = stored_new.float() * descale[f"{name}_descale"][:, None, :, None]
    fp8_args.update(descale)
    return fp8_args, real


def check_fp8(case, gen, causal=False, window_size=(-1, -1), softcap=0.0, alibi=False, num_splits=0, sink=False):
    """The FP8 call on case's quantised caches against the fp32 reference on the real values, with the
    16-bit bound; the appended rows hold k and v byte for byte; no other cache row changes."""
    q = case["q"]
    args, real = fp8_case(case, gen)
    assert fp8.runs_kvcache_kernel(q, args["k_cache"], args["v_cache"], args.get("k"), args.get("v"),
                                   True if alibi else None), "the kernel should take this call"
    slopes = torch.rand(q.shape[2], device=q.device) * 0.3 if alibi else None
    learnable_sink = torch.randn(q.shape[2], device=q.device) if sink else None
    ref_out, ref_lse, _, _ = reference(real, causal, window_size, softcap, slopes, upcast=True)
    # PyTorch's own error: the same real values in q's dtype.
    low = {**real, **{n: real[n].to(q.dtype) for n in ("k_cache", "v_cache", "k", "v") if n in real}}
    low_out, low_lse, _, _ = reference(low, causal, window_size, softcap, slopes, upcast=False)
    if sink:  # the reference with the sink: one more logit in every row's denominator
        ref_out, ref_lse = with_sink(ref_out, ref_lse, learnable_sink)
        low_out, low_lse = with_sink(low_out.float(), low_lse.float(), learnable_sink)
    before = [args[n].view(torch.uint8).clone() for n in ("k_cache", "v_cache")]
    with poisoned_allocations():
        out, lse = flash_attn_with_kvcache(**args, causal=causal, window_size=window_size, softcap=softcap,
                                           alibi_slopes=slopes, num_splits=num_splits, learnable_sink=learnable_sink,
                                           return_softmax_lse=True)
    assert out.dtype == q.dtype and lse.dtype == torch.float32
    # The cache after the append: every row as before, the appended rows k and v's bytes.
    for name, old in zip(("k", "v"), before):
        expected = old.clone()
        if name in args:
            rows = appended_rows(case)
            expected[rows] = args[name].view(torch.uint8).reshape(-1, *expected.shape[2:])
        assert torch.equal(args[f"{name}_cache"].view(torch.uint8), expected), f"{name}_cache after the append"
    err = (out.double() - ref_out.double()).abs().max().item()
    bound = max(2 * (low_out.double() - ref_out.double()).abs().max().item(), rounding_floor(ref_out, q.dtype)) + OUT_EPS
    assert err <= bound, f"out: {err:.3g} > {bound:.3g}"
    seen = torch.isfinite(ref_lse)
    assert torch.equal(torch.isinf(lse) & (lse < 0), ~seen), "rows that see no key: lse -inf"
    if seen.any():
        lse_err = (lse[seen].double() - ref_lse[seen].double()).abs().max().item()
        lse_bound = 2 * (low_lse[seen].double() - ref_lse[seen].double()).abs().max().item() + LSE_EPS
        assert lse_err <= lse_bound, f"lse: {lse_err:.3g} > {lse_bound:.3g}"


def with_sink(out, lse, sink):
    """out [B, Sq, H, Dv], lse [B, H, Sq] with a sink logit per head joining each row's denominator."""
    new_lse = torch.logaddexp(lse, sink[None, :, None].to(lse.dtype))
    return out * torch.exp(lse - new_lse).transpose(1, 2)[..., None].to(out.dtype), new_lse


def appended_rows(case):
    """The (cache row or page, row) index tensors of the rows the call appends, in (b, j) order."""
    batch, seqlen_new = case["k"].shape[:2]
    rows = case["cache_seqlens"].long()[:, None] + torch.arange(seqlen_new, device=case["q"].device)
    if "block_table" in case:
        page = case["k_cache"].shape[1]
        return case["block_table"].long().gather(1, rows // page).flatten(), (rows % page).flatten()
    owner = case["cache_batch_idx"].long() if "cache_batch_idx" in case else torch.arange(batch, device=rows.device)
    return owner[:, None].expand_as(rows).flatten(), rows.flatten()


OPTIONS = [
    pytest.param({}, id="plain"),
    pytest.param({"causal": True}, id="causal"),
    pytest.param({"causal": True, "window_size": (40, 0), "leftpad": True}, id="window-leftpad"),
    pytest.param({"softcap": 15.0, "batch_idx": True}, id="softcap-idx"),
    pytest.param({"alibi": True, "causal": True}, id="alibi"),
    pytest.param({"sink": True, "num_splits": 3}, id="sink-splits3"),
]
# (seqlen_q, seqlen_new, H, Hk): decoding with GQA (packed), MQA of 16 heads (16 rows), a few queries
# (speculative decoding, not packed), MHA.
SHAPES = [(1, 1, 8, 2), (1, 0, 16, 1), (3, 2, 4, 2), (2, 0, 4, 4)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("page", [None, 16, 8, 256], ids=["contiguous", "page16", "page8", "page256"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"q{s[0]}new{s[1]}h{s[2]}kv{s[3]}")
@pytest.mark.parametrize("options", OPTIONS)
def test_fp8_kvcache_kernel_matches_reference(dtype, head_dim, page, shape, options):
    seqlen_q, seqlen_new, heads, heads_k = shape
    options = dict(options)
    make = {key: options.pop(key) for key in ("leftpad", "batch_idx") if key in options}
    if page and make.get("batch_idx"):
        pytest.skip("cache_batch_idx is for contiguous caches")
    seed = case_seed("fp8 kvcache", dtype, head_dim, page, shape, sorted(options), sorted(make))
    capacity = 600 if page == 256 else 300
    case = make_case("cuda", dtype, 3, seqlen_q, seqlen_new, heads, heads_k, head_dim, page, seed, capacity=capacity,
                     **make)
    check_fp8(case, torch.Generator().manual_seed(seed), **options)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("head_dim, v_head_dim", [(80, 80), (128, 64), (192, 128), (48, 48)])
@pytest.mark.parametrize("num_splits", [1, 0, 7])
def test_fp8_kvcache_kernel_padded_head_dims_and_splits(dtype, head_dim, v_head_dim, num_splits):
    """Head dims the kernel pads up (80 on 128, 48 on 64), a narrower v, long ragged caches split
    across 1, automatic and 7 blocks."""
    seed = case_seed("fp8 kvcache dims", dtype, head_dim, v_head_dim, num_splits)
    case = make_case("cuda", dtype, 4, 1, 1, 8, 2, head_dim, 16, seed, capacity=900, v_head_dim=v_head_dim)
    check_fp8(case, torch.Generator().manual_seed(seed), num_splits=num_splits)


@pytest.mark.gpu
@pytest.mark.parametrize("seqlen_q, heads", [(1, 8), (4, 2)], ids=["packed", "rows"])
def test_fp8_kvcache_kernel_bf16_q_rows_of_any_magnitude(seqlen_q, heads):
    """q rows of every magnitude a bf16 q takes where scores stay within fp32's exact range (2^-40 to
    2^20, past fp16's range both ways), a row of zeros, a row with one large and many tiny (2^-30)
    components: all within the 16-bit bound."""
    seed = case_seed("fp8 kvcache q magnitudes", seqlen_q, heads)
    case = make_case("cuda", torch.bfloat16, 2, seqlen_q, 1, heads, 2, 128, 16, seed, capacity=200)
    q = case["q"].float()
    rows = q.view(-1, 128)  # every (batch, query, head) row
    exponents = torch.tensor([-40, -20, 0, 17, 20, 0, 5, -5], device="cuda").repeat(rows.shape[0] // 8 + 1)
    rows.mul_(torch.exp2(exponents[: rows.shape[0]].float())[:, None])
    rows[1].zero_()
    rows[2, 1:] *= 2.0 ** -30  # one large component, the rest 2^-30 of it
    case["q"] = q.to(torch.bfloat16)
    check_fp8(case, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_fp8_kvcache_fp8_q_is_its_dequantised_q(device, out_dtype):
    """An FP8 q over an FP8 cache is dequantised first (fp8.times with its KV head's q_descale, into
    out_dtype), then the call runs as with that 16-bit q (on CUDA the kernel, on CPU the route): bit
    for bit the call with it."""
    seed = case_seed("fp8 kvcache fp8 q", out_dtype)
    case = make_case(device, torch.bfloat16, 3, 1, 0, 8, 2, 128, 16, seed, capacity=300)
    args, _ = fp8_case(case, torch.Generator().manual_seed(seed))
    q8 = (case["q"].float() * 4).to(FP8)
    q_descale = torch.rand(3, 2).add(0.5).to(device)
    dequantised = fp8.times(q8, fp8.query_factors(q_descale, 8, 2), out_dtype)
    assert fp8.runs_kvcache_kernel(dequantised, args["k_cache"], args["v_cache"], None, None) == (device == "cuda")
    out = flash_attn_with_kvcache(**dict(args, q=q8), q_descale=q_descale, out_dtype=out_dtype)
    expected = flash_attn_with_kvcache(**dict(args, q=dequantised))
    assert out.dtype == out_dtype and torch.equal(out, expected)


def every_finite_e4m3(device):
    """The 256 e4m3 codes with the two NaNs (0x7f, 0xff) replaced by zeros, in code order."""
    codes = torch.arange(256, dtype=torch.int32)
    codes[(codes == 0x7F) | (codes == 0xFF)] = 0
    return codes.to(torch.uint8).view(FP8).to(device)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_fp8_kvcache_kernel_reads_every_e4m3_code_exactly(dtype, paged):
    """A cache of one key whose k and v rows hold every finite e4m3 code (subnormals, zeros, +-448)
    at head dim 256: with one key the softmax is exactly 1, so out is v's row, bit for bit in q's
    dtype (every e4m3 value is one); q one-hot at column 16 b + h makes the score k's code there,
    so the LSE is that code's value (times softmax_scale 1) to fp32 rounding."""
    batch, heads = 16, 16
    codes = every_finite_e4m3("cuda")
    row = codes.view(torch.uint8)
    k_bytes = row.view(1, 1, 1, 256).expand(batch, 1, heads, 256).contiguous()
    v_bytes = row.flip(0).view(1, 1, 1, 256).expand(batch, 1, heads, 256).contiguous()
    q = torch.zeros(batch, 1, heads, 256, device="cuda", dtype=dtype)
    column = torch.arange(batch * heads, device="cuda").view(batch, heads)
    q.view(batch, heads, 256).scatter_(2, column[..., None], 1.0)
    extra = {}
    if paged:  # one page of 16 rows per sequence, in reverse order
        table = torch.arange(batch - 1, -1, -1, device="cuda", dtype=torch.int32)[:, None]
        pools = []
        for t in (k_bytes, v_bytes):
            pool = torch.zeros(batch, 16, heads, 256, device="cuda", dtype=torch.uint8)
            pool[table[:, 0].long(), 0] = t[:, 0]
            pools.append(pool)
        k_bytes, v_bytes = pools
        extra = {"block_table": table}
    k_cache, v_cache = k_bytes.view(FP8), v_bytes.view(FP8)
    seqlens = torch.ones(batch, device="cuda", dtype=torch.int32)
    assert fp8.runs_kvcache_kernel(q, k_cache, v_cache, None, None)
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, softmax_scale=1.0,
                                       return_softmax_lse=True, **extra)
    expected_out = row.flip(0).view(FP8).to(dtype).expand(batch, 1, heads, 256)
    assert torch.equal(out, expected_out), "v's codes through the P V operand"
    expected_lse = codes.float()[column]  # [B, H]
    assert torch.allclose(lse[..., 0], expected_lse, rtol=1e-6, atol=0), "k's codes through the Q K^T operand"


@pytest.mark.gpu
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_fp8_kvcache_kernel_rotary_stores_the_rotated_keys_requantised(interleaved, dtype):
    """Rotary with an FP8 cache: the appended keys are dequantised (x k_descale, rounded to q's dtype),
    rotated as apply_rotary_emb rotates, and stored re-quantised (/ k_descale, e4m3), byte for byte;
    values as given; the output is attention over the cache as stored afterwards, q rotated at its
    positions (causal: cache_seqlens + i)."""
    seed = case_seed("fp8 kvcache rotary", interleaved, dtype)
    gen = torch.Generator().manual_seed(seed)
    case = make_case("cuda", dtype, 3, 2, 2, 4, 2, 128, 16, seed, capacity=200, rotary=(64, interleaved))
    args, _ = fp8_case(case, gen)
    rows = appended_rows(case)
    start = case["cache_seqlens"].long()
    out = flash_attn_with_kvcache(**args, causal=True)
    kd = args["k_descale"]
    for b in range(3):
        positions = start[b] + torch.arange(2, device="cuda")
        new = (args["k"][b].float() * kd[b][None, :, None]).to(dtype)  # dequantised, in q's dtype
        rotated = rotate(new, case["rotary_cos"], case["rotary_sin"], interleaved, positions)
        expected = (rotated.float() / kd[b][None, :, None]).clamp(-448, 448).to(FP8)
        got = args["k_cache"].view(torch.uint8)[rows[0][2 * b:2 * b + 2], rows[1][2 * b:2 * b + 2]]
        assert torch.equal(got, expected.view(torch.uint8)), f"sequence {b}'s rotated keys"
    # The output: attention over what the cache now holds (rotary only on q).
    real = {"q": torch.stack([rotate(case["q"][b], case["rotary_cos"], case["rotary_sin"], interleaved,
                                     start[b] + torch.arange(2, device="cuda")) for b in range(3)]),
            "cache_seqlens": (start + 2).to(torch.int32), "block_table": case["block_table"]}
    for name in ("k", "v"):  # each page times its sequence's descale (the unused pages hold no key read)
        scale = torch.ones(args[f"{name}_cache"].shape[0], 2, device="cuda")
        scale[case["block_table"].long()] = args[f"{name}_descale"][:, None, :]
        real[f"{name}_cache"] = args[f"{name}_cache"].float() * scale[:, None, :, None]
    ref_out, _, _, _ = reference(real, True, (-1, -1), 0.0, None, upcast=True)
    low = dict(real, k_cache=real["k_cache"].to(dtype), v_cache=real["v_cache"].to(dtype))
    low_out, _, _, _ = reference(low, True, (-1, -1), 0.0, None, upcast=False)
    err = (out.double() - ref_out.double()).abs().max().item()
    bound = max(2 * (low_out.double() - ref_out.double()).abs().max().item(), rounding_floor(ref_out, dtype)) + OUT_EPS
    assert err <= bound, f"out: {err:.3g} > {bound:.3g}"


@pytest.mark.gpu
def test_fp8_kvcache_kernel_bad_block_table_then_a_good_call():
    """A used block_table entry past the pool: recorded, flashattn.check_faults() raises naming
    block_table, the context survives; then a good call matches the reference."""
    seed = case_seed("fp8 kvcache bad table")
    case = make_case("cuda", torch.bfloat16, 3, 1, 1, 8, 2, 128, 16, seed, capacity=300)
    args, _ = fp8_case(case, torch.Generator().manual_seed(seed))
    bad = dict(args, block_table=args["block_table"].clone())
    bad["block_table"][1, 0] = args["k_cache"].shape[0] + 9
    flash_attn_with_kvcache(**bad)
    torch.cuda.synchronize()
    with pytest.raises(RuntimeError, match="block_table"):
        flashattn.check_faults()
    good = make_case("cuda", torch.bfloat16, 3, 1, 1, 8, 2, 128, 16, seed + 1, capacity=300)
    check_fp8(good, torch.Generator().manual_seed(seed + 1))


@pytest.mark.gpu
def test_fp8_kvcache_kernel_refuses_what_it_does_not_serve():
    """The operator raises, naming the limit, for a call over 16 rows a block and for a head dim
    that is not a multiple of 16 (flash_attn_with_kvcache sends those to the dequantising route)."""
    gen = torch.Generator(device="cuda").manual_seed(case_seed("fp8 kvcache refuses"))
    cache = (torch.randn(2, 64, 2, 128, generator=gen, device="cuda")).to(FP8)
    seqlens = torch.full((2,), 10, device="cuda", dtype=torch.int32)

    def op(q, k_cache=cache, v_cache=cache):
        return torch.ops.flashattn.fwd_kvcache_fp8(q, k_cache, v_cache, None, None, None, None, None, None, seqlens,
                                                   None, None, None, 0.1, False, -1, -1, 0.0, False, None, 0)

    with pytest.raises(ValueError, match="16 query rows"):
        op(torch.randn(2, 17, 2, 128, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="multiple of 16"):  # a view: its strides stay aligned
        op(torch.randn(2, 1, 2, 120, device="cuda", dtype=torch.bfloat16), cache[..., :120], cache[..., :120])
    with pytest.raises(ValueError, match="multiple of 16 elements"):
        op(torch.randn(2, 1, 2, 120, device="cuda", dtype=torch.bfloat16), cache[..., :120].contiguous(),
           cache[..., :120].contiguous())
    with pytest.raises(TypeError, match="v_cache"):
        op(torch.randn(2, 1, 2, 128, device="cuda", dtype=torch.bfloat16), cache, cache.to(torch.bfloat16))
    out = op(torch.randn(2, 1, 4, 128, device="cuda", dtype=torch.bfloat16))[0]  # then a good call
    assert torch.isfinite(out).all()


def test_runs_kvcache_kernel_takes_decoding_calls_only():
    """Which FP8 KV-cache calls the kernel takes (CPU-only: the answer for CPU tensors is always no;
    the shape rules are checked through a CUDA-less stand-in of the device question)."""
    q = torch.zeros(2, 1, 8, 128, dtype=torch.bfloat16)
    cache = torch.zeros(2, 64, 2, 128).to(FP8)
    assert not fp8.runs_kvcache_kernel(q, cache, cache, None, None)  # CPU
    assert fp8.kvcache_block_rows(1, 4, False) == 4
    assert fp8.kvcache_block_rows(1, 4, True) == 1
    assert fp8.kvcache_block_rows(5, 4, False) == 5
    assert fp8.kvcache_block_rows(1, 1, False) == 1


def test_fwd_kvcache_fp8_fake_shapes():
    """The operator's fake (torch.compile's shapes): out like q with v_cache's head dim, lse (B, H, Sq)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(2, 1, 8, 128, dtype=torch.bfloat16)
        k_cache = torch.empty(4, 16, 2, 128, dtype=FP8)
        v_cache = torch.empty(4, 16, 2, 64, dtype=FP8)
        seqlens = torch.empty(2, dtype=torch.int32)
        out, lse = torch.ops.flashattn.fwd_kvcache_fp8(q, k_cache, v_cache, None, None, None, None, None, None,
                                                       seqlens, None, None, None, 0.1, False, -1, -1, 0.0, False,
                                                       None, 0)
        assert out.shape == (2, 1, 8, 64) and out.dtype == torch.bfloat16
        assert lse.shape == (2, 8, 1) and lse.dtype == torch.float32
