"""Every bad input gets an error of the right type whose message names the argument.

Each case runs on the CPU path and, where there is a GPU, on the CUDA path: the
public functions check their Python arguments, and the operator's
implementations (flashattn/cpu.py, the C++ binding) check the tensors with the
same messages and exception types, except for what depends on the device (the
accepted dtypes, mixed devices, the GPU's age). The binding's checks of inputs
the public functions never pass it (a head dim that is not a multiple of 8, a
bad softmax_lse, ...) have GPU tests of their own at the end.

What is accepted, in short: q (B, Sq, H, D), k (B, Sk, Hk, D) and v (B, Sk,
Hk, Dv) on one device with one dtype (fp16 or bf16 on CUDA; fp16, bf16 or fp32
on CPU), H a multiple of Hk, 1 <= Dv <= D <= 512 (v's head dims:
test_mla_head_dims.py; flash_attn_with_kvcache's D at most 256:
test_head_dim_512.py), the last dimension contiguous (an error, not a silent
copy: FlashAttention-2 refuses it too, and a copy would hide a layout bug
upstream); empty batches and sequences are fine (see test_forward.py and
test_backward.py). The variable-length functions take q (total_q, H, D), k and
v (total_k, Hk, D), cu_seqlens_q/k int32 (B + 1,) on q's device (their values
checked on CPU only) and max_seqlen_q/k non-negative ints (paged k and v, seqused and their
errors: test_paged_varlen.py).
"""

import importlib
import importlib.util
import re
from types import SimpleNamespace

import pytest
import torch
from helpers import DEVICES

from flashattn import (
    _extension,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    interface,
)

FUNCS = ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func"]
VARLEN_FUNCS = ["flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func"]


def _qkv(device="cpu", dtype=torch.float16, q_shape=(2, 5, 4, 16), kv_shape=(2, 7, 2, 16)):
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(q_shape, generator=gen, dtype=dtype, device=device)
    k = torch.randn(kv_shape, generator=gen, dtype=dtype, device=device)
    v = torch.randn(kv_shape, generator=gen, dtype=dtype, device=device)
    return q, k, v


def _call(func, q, k, v, **options):
    """Calls one of the public functions on q, k, v, packed as it takes them. The variable-length
    ones get the batch's sequences packed, with their cu_seqlens and max_seqlen."""
    if func in VARLEN_FUNCS:
        batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
        q, k, v = (t.flatten(0, 1) for t in (q, k, v))
        cu_q, cu_k = (
            torch.arange(0, (batch + 1) * n, n, dtype=torch.int32, device=q.device) for n in (seqlen_q, seqlen_k)
        )
        if func == "flash_attn_varlen_qkvpacked_func":
            return flash_attn_varlen_qkvpacked_func(torch.stack([q, k, v], dim=1), cu_q, seqlen_q, **options)
        if func == "flash_attn_varlen_kvpacked_func":
            kv = torch.stack([k, v], dim=1)
            return flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, seqlen_q, seqlen_k, **options)
        return flash_attn_varlen_func(q, k, v, cu_q, cu_k, seqlen_q, seqlen_k, **options)
    if func == "flash_attn_qkvpacked_func":
        return flash_attn_qkvpacked_func(torch.stack([q, k, v], dim=2), **options)
    if func == "flash_attn_kvpacked_func":
        return flash_attn_kvpacked_func(q, torch.stack([k, v], dim=2), **options)
    return flash_attn_func(q, k, v, **options)


def _replace(index, value):
    """A case that replaces q (0), k (1) or v (2) of valid inputs."""

    def make(q, k, v):
        qkv = [q, k, v]
        qkv[index] = value(qkv[index])
        return qkv

    return make


BAD_INPUTS = [
    # id, change to valid (q, k, v), expected exception, message pattern ({device}: cpu or cuda)
    ("q-not-tensor", _replace(0, lambda t: t.tolist()), TypeError, r"q must be a torch\.Tensor, got list"),
    ("k-3d", _replace(1, lambda t: t[0]), ValueError, r"k must be 4-D .*got shape \(7, 2, 16\)"),
    ("v-5d", _replace(2, lambda t: t[None]), ValueError, r"v must be 4-D"),
    ("q-2d", _replace(0, lambda t: t[0, 0]), ValueError, r"q must be 4-D .*got shape \(4, 16\)"),
    ("k-other-device", _replace(1, lambda t: t.to("meta")), RuntimeError, r"k is on meta but q is on {device}"),
    ("v-other-device", _replace(2, lambda t: t.to("meta")), RuntimeError, r"v is on meta but q is on {device}"),
    (
        "all-on-meta",
        lambda q, k, v: [t.to("meta") for t in (q, k, v)],
        RuntimeError,
        r"q is on meta; accepted devices: cpu, cuda",
    ),
    (
        "k-other-dtype",
        _replace(1, lambda t: t.bfloat16()),
        TypeError,
        r"k has dtype torch\.bfloat16 but q has torch\.float16",
    ),
    (
        "v-int",
        _replace(2, lambda t: t.int()),
        TypeError,
        r"v has dtype torch\.int32 but q has torch\.float16",
    ),
    (
        "batch-differs",
        lambda q, k, v: [q[:1], k, v],
        ValueError,
        r"batch sizes differ \(q \(1, 5, 4, 16\), k \(2, 7, 2, 16\)",
    ),
    ("kv-seqlens-differ", _replace(2, lambda t: t[:, :6]), ValueError, r"k and v must have the same shape"),
    ("kv-heads-differ", _replace(2, lambda t: t[:, :, :1]), ValueError, r"k and v must have the same shape"),
    (
        "v-head-dim-larger",
        _replace(2, lambda t: torch.cat([t, t], dim=-1)),
        ValueError,
        r"v has headdim 32 \(q \(2, 5, 4, 16\), k \(2, 7, 2, 16\), v \(2, 7, 2, 32\)\); accepted: 1 to 16",
    ),
    ("v-head-dim-zero", _replace(2, lambda t: t[..., :0]), ValueError, r"v has headdim 0 .*accepted: 1 to 16"),
    (
        "head-dims-differ",
        lambda q, k, v: [q[..., :8], k, v],
        ValueError,
        r"head dims differ \(q \(2, 5, 4, 8\), k \(2, 7, 2, 16\)",
    ),
    (
        "head-dim-too-large",
        lambda q, k, v: [t.new_zeros(*t.shape[:3], 513) for t in (q, k, v)],
        ValueError,
        r"headdim 513 .*accepted: 1 to 512",
    ),
    (
        "head-dim-zero",
        lambda q, k, v: [t[..., :0] for t in (q, k, v)],
        ValueError,
        r"headdim 0 .*accepted: 1 to 512",
    ),
    (
        "heads-not-multiple",
        lambda q, k, v: [q[:, :, :3], k, v],
        ValueError,
        r"query heads \(q\.shape\[2\] = 3\) must be a multiple of "
        r"the number of key/value heads \(k\.shape\[2\] = 2\)",
    ),
    ("no-kv-heads", lambda q, k, v: [q, k[:, :, :0], v[:, :, :0]], ValueError, r"k\.shape\[2\] = 0"),
    (
        "q-last-dim-strided",
        _replace(0, lambda t: t.transpose(2, 3).contiguous().transpose(2, 3)),
        ValueError,
        r"last dimension of q must be contiguous .*call \.contiguous\(\)",
    ),
    (
        "k-last-dim-strided",
        _replace(1, lambda t: t.repeat_interleave(2, dim=3)[..., ::2]),
        ValueError,
        r"last dimension of k must be contiguous",
    ),
    (
        "v-last-dim-strided",
        _replace(2, lambda t: t.repeat_interleave(2, dim=3)[..., ::2]),
        ValueError,
        r"last dimension of v must be contiguous",
    ),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "change, error, match", [case[1:] for case in BAD_INPUTS], ids=[case[0] for case in BAD_INPUTS]
)
def test_bad_qkv(device, change, error, match):
    with pytest.raises(error, match=match.format(device=device)):
        flash_attn_func(*change(*_qkv(device)))


@pytest.mark.parametrize(
    "device, dtype",
    [
        ("cpu", torch.float64),
        ("cpu", torch.int32),
        ("cpu", torch.complex64),
        pytest.param("cuda", torch.float32, marks=pytest.mark.gpu),
        pytest.param("cuda", torch.float64, marks=pytest.mark.gpu),
        pytest.param("cuda", torch.int32, marks=pytest.mark.gpu),
    ],
)
@pytest.mark.parametrize("func", FUNCS)
def test_dtype_refused(func, device, dtype):
    """CUDA takes fp16 and bf16 (the kernels' tensor-core types); CPU fp32 as well."""
    accepted = "torch.float16, torch.bfloat16" + (", torch.float32" if device == "cpu" else "")
    q, k, v = (t.to(dtype) for t in _qkv(device, q_shape=(2, 7, 2, 16)))
    q_name = "qkv[:, :, 0]" if func == "flash_attn_qkvpacked_func" else "q"
    match = re.escape(f"{q_name} has dtype {dtype}; accepted on {device}: {accepted}")
    with pytest.raises(TypeError, match=match):
        _call(func, q, k, v)


@pytest.mark.gpu
@pytest.mark.parametrize("on_cpu", ["q", "k", "v", "k and v"])
def test_cuda_and_cpu_mixed(on_cpu):
    """Any of q, k, v on the CPU while the others are on the GPU; the error names the first
    tensor on a device other than q's."""
    q, k, v = _qkv("cuda")
    tensors = {"q": q, "k": k, "v": v}
    for name in on_cpu.split(" and "):
        tensors[name] = tensors[name].cpu()
    first = "k" if on_cpu == "q" or on_cpu.startswith("k") else "v"
    where, q_where = (r"cuda:\d", "cpu") if on_cpu == "q" else ("cpu", r"cuda:\d")
    with pytest.raises(RuntimeError, match=rf"{first} is on {where} but q is on {q_where}"):
        flash_attn_func(*tensors.values())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "softmax_scale, error",
    [
        (0.0, ValueError),
        (-0.5, ValueError),
        (float("inf"), ValueError),
        (float("nan"), ValueError),
        ("0.1", TypeError),
        (True, TypeError),
        (torch.tensor(0.1), TypeError),
    ],
)
def test_bad_softmax_scale(device, softmax_scale, error):
    with pytest.raises(error, match=r"softmax_scale must be a positive finite number"):
        flash_attn_func(*_qkv(device), softmax_scale=softmax_scale)


# Values FlashAttention-2 itself refuses: the error says what is accepted.
BAD_OPTIONS = [
    # id, option, value (a function of q for tensors), expected exception, message pattern
    ("dropout-negative", "dropout_p", -0.1, ValueError, r"dropout_p must be in \[0, 1\), got -0\.1"),
    ("dropout-one", "dropout_p", 1.0, ValueError, r"dropout_p must be in \[0, 1\), got 1\.0"),
    ("dropout-nan", "dropout_p", float("nan"), ValueError, r"dropout_p must be in \[0, 1\), got nan"),
    ("dropout-str", "dropout_p", "0.1", TypeError, r"dropout_p must be a number in \[0, 1\), got str"),
    ("dropout-bool", "dropout_p", True, TypeError, r"dropout_p must be a number .*got bool"),
    ("window-float-tensor", "window_size", lambda q: torch.tensor([1.0, 0.0]), TypeError,
     r"window_size must be a pair \(left, right\) of ints .*got a torch\.float32 tensor"),
    ("window-0d-tensor", "window_size", lambda q: torch.tensor(3), ValueError,
     r"window_size must be .*got a tensor of shape \(\)"),
    ("window-2d-tensor", "window_size", lambda q: torch.zeros(1, 2, dtype=torch.int64), ValueError,
     r"window_size must be .*got a tensor of shape \(1, 2\)"),
    ("window-tensor-of-3", "window_size", lambda q: torch.tensor([1, 2, 3]), ValueError,
     r"window_size must be a pair .*got tensor\(\[1, 2, 3\]\)"),
    ("window-bool", "window_size", (True, 0), TypeError, r"window_size must be .*got \(True, 0\)"),
    ("window-three", "window_size", (1, 2, 3), ValueError, r"window_size must be a pair .*got \(1, 2, 3\)"),
    ("window-int", "window_size", 4, TypeError, r"window_size must be a pair \(left, right\) .*got int"),
    ("window-float", "window_size", (1.5, 0), TypeError, r"window_size must be .*got \(1\.5, 0\)"),
    ("softcap-negative", "softcap", -1.0, ValueError, r"softcap must be a finite number >= 0 .*got -1\.0"),
    ("softcap-inf", "softcap", float("inf"), ValueError, r"softcap must be a finite number >= 0 .*got inf"),
    ("softcap-nan", "softcap", float("nan"), ValueError, r"softcap must be a finite number >= 0 .*got nan"),
    ("softcap-str", "softcap", "30", TypeError, r"softcap must be a finite number >= 0, got str"),
    ("alibi-list", "alibi_slopes", lambda q: [1.0] * q.shape[2], TypeError, r"alibi_slopes must be .*got list"),
    (
        "alibi-fp16",
        "alibi_slopes",
        lambda q: torch.ones(q.shape[2], dtype=torch.float16, device=q.device),
        TypeError,
        r"alibi_slopes must be a float32 tensor .*got dtype torch\.float16",
    ),
    (
        "alibi-wrong-heads",
        "alibi_slopes",
        lambda q: torch.ones(q.shape[2] + 1, device=q.device),
        ValueError,
        r"alibi_slopes must be a float32 tensor of shape \(nheads,\) = \(2,\) or "
        r"\(batch, nheads\) = \(2, 2\), got shape \(3,\)",
    ),
    (
        "alibi-3d",
        "alibi_slopes",
        lambda q: torch.ones(q.shape[0], q.shape[2], 1, device=q.device),
        ValueError,
        r"alibi_slopes must be .*got shape \(2, 2, 1\)",
    ),
    (
        "alibi-other-device",
        "alibi_slopes",
        lambda q: torch.ones(q.shape[2], device="meta"),
        RuntimeError,
        r"alibi_slopes is on meta but q is on {device}",
    ),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("func", FUNCS + VARLEN_FUNCS)
@pytest.mark.parametrize(
    "name, value, error, match", [case[1:] for case in BAD_OPTIONS], ids=[case[0] for case in BAD_OPTIONS]
)
def test_bad_option_values(device, func, name, value, error, match):
    """Every public function checks the options' values (the variable-length ones against the
    number of sequences, here 2)."""
    q, k, v = _qkv(device, q_shape=(2, 7, 2, 16))
    with pytest.raises(error, match=match.format(device=device)):
        _call(func, q, k, v, **{name: value(q) if callable(value) else value})


VALID_OPTIONS = [
    # id, option, a valid value other than the default (a function of q for tensors)
    ("dropout_p", "dropout_p", 0.1),
    ("window_size", "window_size", (4, 0)),
    ("window_size-left-unbounded", "window_size", [-1, 0]),
    ("window_size-any-negative-unbounded", "window_size", (-2, -7)),
    ("window_size-tensor", "window_size", lambda q: torch.tensor([4, 0], device=q.device)),
    ("window_size-0d-tensors", "window_size", lambda q: (torch.tensor(4), torch.tensor(-1, dtype=torch.int32))),
    ("softcap", "softcap", 30.0),
    ("alibi_slopes-per-head", "alibi_slopes", lambda q: torch.rand(q.shape[2], device=q.device)),
    ("alibi_slopes-per-batch", "alibi_slopes", lambda q: torch.rand(q.shape[0], q.shape[2], device=q.device)),
    ("return_attn_probs", "return_attn_probs", True),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("func", FUNCS + VARLEN_FUNCS)
@pytest.mark.parametrize("name, value", [case[1:] for case in VALID_OPTIONS], ids=[case[0] for case in VALID_OPTIONS])
def test_valid_options_are_accepted(device, func, name, value):
    """Every option of FlashAttention-2's signature is implemented: a valid value runs."""
    q, k, v = _qkv(device, q_shape=(2, 7, 2, 16))
    result = _call(func, q, k, v, **{name: value(q) if callable(value) else value})
    out = result[0] if name == "return_attn_probs" else result
    assert out.shape == ((2, 7, 2, 16) if func in FUNCS else (14, 2, 16)) and not out.isnan().any()


@pytest.mark.parametrize("device", DEVICES)
def test_defaults_of_options_are_accepted(device):
    q, k, v = _qkv(device)
    out = flash_attn_func(q, k, v, 0.0, None, False, [-1, -1], 0.0, None, True, False)
    assert torch.equal(out, flash_attn_func(q, k, v))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "make_qkv, error, match",
    [
        (
            lambda device: torch.zeros(2, 5, 4, 16, device=device),
            ValueError,
            r"qkv must have shape \(batch, seqlen, 3, nheads, headdim\), got \(2, 5, 4, 16\)",
        ),
        (
            lambda device: torch.zeros(2, 5, 2, 4, 16, device=device),
            ValueError,
            r"qkv must have shape .*got \(2, 5, 2, 4, 16\)",
        ),
        (lambda device: "qkv", TypeError, r"qkv must be a torch\.Tensor, got str"),
        (
            lambda device: torch.zeros(2, 5, 3, 4, 16, dtype=torch.float64, device=device),
            TypeError,
            r"qkv\[:, :, 0\] has dtype torch\.float64",
        ),
        (
            lambda device: torch.zeros(2, 5, 3, 4, 520, dtype=torch.float16, device=device),
            ValueError,
            r"headdim 520 \(qkv\[:, :, 0\] \(2, 5, 4, 520\), .*accepted: 1 to 512",
        ),
        (
            lambda device: torch.zeros(2, 5, 4, 16, 3, dtype=torch.float16, device=device).transpose(2, 4),
            ValueError,
            r"last dimension of qkv\[:, :, 0\] must be contiguous",
        ),
    ],
    ids=["4d", "2-in-dim-2", "not-tensor", "float64", "head-dim-520", "last-dim-strided"],
)
def test_bad_qkvpacked(device, make_qkv, error, match):
    with pytest.raises(error, match=match):
        flash_attn_qkvpacked_func(make_qkv(device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "make_kv, error, match",
    [
        (
            lambda device: torch.zeros(2, 7, 3, 2, 16, dtype=torch.float16, device=device),
            ValueError,
            r"kv must have shape \(batch, seqlen_k, 2, nheads_k, headdim\)",
        ),
        (lambda device: None, TypeError, r"kv must be a torch\.Tensor, got NoneType"),
        (
            lambda device: torch.zeros(2, 7, 2, 2, 8, dtype=torch.float16, device=device),
            ValueError,
            r"head dims differ \(q \(2, 5, 4, 16\), kv \(2, 7, 2, 2, 8\)\): kv packs k and v with one headdim, "
            r"which must be q's \(16\); for a v headdim other than q's pass k and v apart to flash_attn_func",
        ),
        (
            lambda device: torch.zeros(2, 7, 2, 3, 16, dtype=torch.float16, device=device),
            ValueError,
            r"query heads \(q\.shape\[2\] = 4\) must be a multiple of .*\(kv\[:, :, 0\]\.shape\[2\] = 3\)",
        ),
        (
            lambda device: torch.zeros(3, 7, 2, 2, 16, dtype=torch.float16, device=device),
            ValueError,
            r"batch sizes differ",
        ),
        (
            lambda device: torch.zeros(2, 7, 2, 2, 16, dtype=torch.bfloat16, device=device),
            TypeError,
            r"kv\[:, :, 0\] has dtype torch\.bfloat16 but q has torch\.float16",
        ),
    ],
    ids=["3-in-dim-2", "none", "head-dims-differ", "heads-not-divisor", "batch-differs", "dtype-differs"],
)
def test_bad_kvpacked(device, make_kv, error, match):
    with pytest.raises(error, match=match):
        flash_attn_kvpacked_func(_qkv(device)[0], make_kv(device))


def _varlen_args(device="cpu") -> dict:
    """Valid arguments of flash_attn_varlen_func: three sequences of (3, 5), (0, 1) and (7, 6) tokens."""
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(10, 4, 16, generator=gen, dtype=torch.float16, device=device)
    k, v = (torch.randn(12, 2, 16, generator=gen, dtype=torch.float16, device=device) for _ in range(2))
    return {
        "q": q,
        "k": k,
        "v": v,
        "cu_seqlens_q": torch.tensor([0, 3, 3, 10], dtype=torch.int32, device=device),
        "cu_seqlens_k": torch.tensor([0, 5, 6, 12], dtype=torch.int32, device=device),
        "max_seqlen_q": 7,
        "max_seqlen_k": 6,
    }


def _set(name, value):
    """A case that replaces argument `name` of _varlen_args by value(the valid one)."""
    return lambda args: {**args, name: value(args[name])}


BAD_VARLEN = [
    # id, change to valid arguments, expected exception, message pattern ({device}: cpu or cuda)
    ("q-4d", _set("q", lambda t: t[None]), ValueError,
     r"q must be 3-D \(total_q, nheads, headdim\), got shape \(1, 10, 4, 16\)"),
    ("k-2d", _set("k", lambda t: t[0]), ValueError,
     r"k must be 3-D \(total_k, nheads_k, headdim\), got shape \(2, 16\)"),
    ("v-not-tensor", _set("v", lambda t: t.tolist()), TypeError, r"v must be a torch\.Tensor, got list"),
    ("v-rows-differ", _set("v", lambda t: t[:-1]), ValueError,
     r"k and v must have the same shape \(total_k, nheads_k, headdim\), got q \(10, 4, 16\), k \(12, 2, 16\), "
     r"v \(11, 2, 16\)"),
    ("heads-not-multiple", _set("q", lambda t: t[:, :3]), ValueError,
     r"query heads \(q\.shape\[1\] = 3\) must be a multiple of the number of key/value heads \(k\.shape\[1\] = 2\)"),
    ("head-dims-differ", _set("q", lambda t: t[..., :8]), ValueError, r"head dims differ \(q \(10, 4, 8\)"),
    ("head-dim-too-large", lambda a: {**a, **{n: a[n].new_zeros(*a[n].shape[:2], 513) for n in "qkv"}}, ValueError,
     r"headdim 513 .*accepted: 1 to 512"),
    ("q-float64", lambda a: {**a, **{n: a[n].double() for n in "qkv"}}, TypeError,
     r"q has dtype torch\.float64; accepted on {device}"),
    ("k-other-dtype", _set("k", lambda t: t.bfloat16()), TypeError,
     r"k has dtype torch\.bfloat16 but q has torch\.float16"),
    ("k-other-device", _set("k", lambda t: t.to("meta")), RuntimeError, r"k is on meta but q is on {device}"),
    ("cu-q-int64", _set("cu_seqlens_q", lambda t: t.long()), TypeError,
     r"cu_seqlens_q must be an int32 tensor of shape \(batch \+ 1,\).*got dtype torch\.int64"),
    ("cu-k-float", _set("cu_seqlens_k", lambda t: t.float()), TypeError,
     r"cu_seqlens_k must be an int32 tensor .*float32"),
    ("cu-q-list", _set("cu_seqlens_q", lambda t: t.tolist()), TypeError,
     r"cu_seqlens_q must be an int32 tensor .*got list"),
    ("cu-k-none", _set("cu_seqlens_k", lambda t: None), TypeError, r"cu_seqlens_k must be .*got NoneType"),
    ("cu-q-2d", _set("cu_seqlens_q", lambda t: t[None]), ValueError, r"cu_seqlens_q must be .*got shape \(1, 4\)"),
    ("cu-k-empty", _set("cu_seqlens_k", lambda t: t[:0]), ValueError, r"cu_seqlens_k must be .*got shape \(0,\)"),
    ("cu-lengths-differ", _set("cu_seqlens_k", lambda t: t[:-1]), ValueError,
     r"cu_seqlens_q \(4,\) and cu_seqlens_k \(3,\) must have the same length \(batch \+ 1\)"),
    ("cu-q-other-device", _set("cu_seqlens_q", lambda t: t.to("meta")), RuntimeError,
     r"cu_seqlens_q is on meta but q is on {device}"),
    ("max-q-float", _set("max_seqlen_q", lambda x: 7.0), TypeError,
     r"max_seqlen_q must be a non-negative Python int \(or a 0-d integer tensor\), got float"),
    ("max-k-bool", _set("max_seqlen_k", lambda x: True), TypeError, r"max_seqlen_k must be .*got bool"),
    ("max-k-str", _set("max_seqlen_k", lambda x: "6"), TypeError, r"max_seqlen_k must be .*got str"),
    ("max-q-negative", _set("max_seqlen_q", lambda x: -1), ValueError, r"max_seqlen_q must be .*got -1"),
    ("max-k-1d-tensor", _set("max_seqlen_k", lambda x: torch.tensor([6])), TypeError,
     r"max_seqlen_k must be .*got a torch\.int64 tensor of shape \(1,\)"),
    ("max-q-float-tensor", _set("max_seqlen_q", lambda x: torch.tensor(7.0)), TypeError,
     r"max_seqlen_q must be .*got a torch\.float32 tensor of shape \(\)"),
]

# The offsets' values: read on CPU tensors only (on CUDA that would wait for the GPU).
BAD_VARLEN_VALUES = [
    ("cu-q-not-from-0", _set("cu_seqlens_q", lambda t: t + 1),
     r"cu_seqlens_q must start at 0, got cu_seqlens_q\[0\] = 1"),
    ("cu-k-decreasing", _set("cu_seqlens_k", lambda t: torch.tensor([0, 5, 4, 12], dtype=torch.int32)),
     r"cu_seqlens_k must be nondecreasing, got \[0, 5, 4, 12\]"),
    ("cu-q-past-end", _set("cu_seqlens_q", lambda t: torch.tensor([0, 3, 3, 11], dtype=torch.int32)),
     r"cu_seqlens_q\[-1\] = 11 is past the 10 rows of q; cu_seqlens_q must end at most at q\.shape\[0\]"),
    ("max-q-too-small", _set("max_seqlen_q", lambda x: 6), r"max_seqlen_q = 6 is less than the longest sequence "
     r"of cu_seqlens_q \(7\)"),
    ("max-k-too-small", _set("max_seqlen_k", lambda x: torch.tensor(5)), r"max_seqlen_k = 5 is less than the longest "
     r"sequence of cu_seqlens_k \(6\)"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "change, error, match", [case[1:] for case in BAD_VARLEN], ids=[case[0] for case in BAD_VARLEN]
)
def test_bad_varlen_arguments(device, change, error, match):
    with pytest.raises(error, match=match.format(device=device)):
        flash_attn_varlen_func(**change(_varlen_args(device)))


@pytest.mark.parametrize(
    "change, match", [case[1:] for case in BAD_VARLEN_VALUES], ids=[case[0] for case in BAD_VARLEN_VALUES]
)
def test_bad_varlen_values_on_cpu(change, match):
    with pytest.raises(ValueError, match=match):
        flash_attn_varlen_func(**change(_varlen_args()))


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_alibi_slopes_count_sequences(device):
    """(batch, nheads) ALiBi slopes of a variable-length batch: batch is the number of sequences."""
    args = _varlen_args(device)
    with pytest.raises(ValueError, match=r"\(batch, nheads\) = \(3, 4\), got shape \(10, 4\)"):
        flash_attn_varlen_func(**args, alibi_slopes=torch.ones(10, 4, device=device))
    assert flash_attn_varlen_func(**args, alibi_slopes=torch.ones(3, 4, device=device)).shape == (10, 4, 16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "func, change, error, match",
    [
        ("qkv", lambda a: {**a, "qkv": a["qkv"][None]}, ValueError,
         r"qkv must have shape \(total, 3, nheads, headdim\), got \(1, 10, 3, 4, 16\)"),
        ("qkv", lambda a: {**a, "qkv": a["qkv"][:, :2]}, ValueError, r"qkv must have shape .*got \(10, 2, 4, 16\)"),
        ("qkv", lambda a: {**a, "qkv": "qkv"}, TypeError, r"qkv must be a torch\.Tensor, got str"),
        ("qkv", lambda a: {**a, "qkv": a["qkv"].double()}, TypeError, r"qkv\[:, 0\] has dtype torch\.float64"),
        ("qkv", lambda a: {**a, "cu_seqlens": a["cu_seqlens"].long()}, TypeError,
         r"cu_seqlens must be an int32 tensor .*torch\.int64"),
        ("qkv", lambda a: {**a, "max_seqlen": -3}, ValueError, r"max_seqlen must be a non-negative .*got -3"),
        ("kv", lambda a: {**a, "kv": a["kv"][:, [0, 1, 0]]}, ValueError,
         r"kv must have shape \(total_k, 2, nheads_k, headdim\), got \(10, 3, 2, 16\)"),
        ("kv", lambda a: {**a, "kv": a["kv"].bfloat16()}, TypeError,
         r"kv\[:, 0\] has dtype torch\.bfloat16 but q has torch\.float16"),
        ("kv", lambda a: {**a, "kv": a["kv"][:, :, :1].expand(-1, -1, 3, -1)}, ValueError,
         r"query heads \(q\.shape\[1\] = 4\) must be a multiple .*\(kv\[:, 0\]\.shape\[1\] = 3\)"),
        ("kv", lambda a: {**a, "cu_seqlens_k": a["cu_seqlens_k"][1:]}, ValueError,
         r"cu_seqlens_q \(4,\) and cu_seqlens_k \(3,\) must have the same length"),
    ],
    ids=["qkv-5d", "qkv-2-in-dim-1", "qkv-not-tensor", "qkv-float64", "cu-int64", "max-negative", "kv-3-in-dim-1",
         "kv-dtype", "kv-heads", "cu-lengths-differ"],
)
def test_bad_varlen_packed(device, func, change, error, match):
    gen = torch.Generator(device=device).manual_seed(0)
    cu = torch.tensor([0, 3, 3, 10], dtype=torch.int32, device=device)
    with pytest.raises(error, match=match):
        if func == "qkv":
            qkv = torch.randn(10, 3, 4, 16, generator=gen, dtype=torch.float16, device=device)
            flash_attn_varlen_qkvpacked_func(**change({"qkv": qkv, "cu_seqlens": cu, "max_seqlen": 7}))
        else:
            q = torch.randn(10, 4, 16, generator=gen, dtype=torch.float16, device=device)
            kv = torch.randn(10, 2, 2, 16, generator=gen, dtype=torch.float16, device=device)
            args = {"q": q, "kv": kv, "cu_seqlens_q": cu, "cu_seqlens_k": cu, "max_seqlen_q": 7, "max_seqlen_k": 7}
            flash_attn_varlen_kvpacked_func(**change(args))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "options, match",
    [
        ({"dropout_p": 0.5}, "dropout_p > 0 needs rng_state"),
        ({"cu_seqlens_q": "cu"}, "cu_seqlens_q and cu_seqlens_k must be given together"),
    ],
    ids=["dropout-without-rng-state", "cu-seqlens-q-alone"],
)
def test_operator_refuses_incomplete_options(device, options, match):
    """Called directly, the operator (CPU implementation or binding) refuses what has no meaning:
    dropout without its seed, one of the two cu_seqlens."""
    q, k, v = _qkv(device)
    if options.get("cu_seqlens_q") == "cu":
        q, k, v = (t.flatten(0, 1) for t in (q, k, v))
        options = {"cu_seqlens_q": torch.tensor([0, 5, 10], dtype=torch.int32, device=device), "max_seqlen_q": 5}
    with pytest.raises(RuntimeError, match=re.escape(match)):
        torch.ops.flashattn.fwd(q, k, v, 0.25, False, **options)


def test_cuda_without_built_kernels_says_how_to_build(monkeypatch):
    """A CUDA tensor with no kernels built gets NOT_BUILT_REASON, which gives the one command."""
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    reason = _extension._not_built_reason()
    monkeypatch.setattr(interface, "HAS_CUDA_KERNELS", False)
    monkeypatch.setattr(interface, "NOT_BUILT_REASON", reason)
    with pytest.raises(RuntimeError, match=r"installed without its CUDA kernels") as info:
        interface._check_cuda_ready(torch.device("cuda", 0))
    assert "pip install -v" in str(info.value) and "--no-deps" in str(info.value)
    assert "TORCH_CUDA_ARCH_LIST" in str(info.value) and "8.0+PTX;9.0a" in str(info.value)


def test_not_built_reason_with_a_cpu_only_torch_asks_for_a_cuda_torch(monkeypatch):
    """A rebuild cannot help a CPU-only torch: the reason says to install a CUDA build first."""
    monkeypatch.setattr(torch.version, "cuda", None)
    reason = _extension._not_built_reason()
    assert "is a CPU-only build" in reason and "install a CUDA build of torch, then" in reason


def test_gpu_older_than_ampere_is_refused(monkeypatch):
    turing = SimpleNamespace(major=7, minor=5, name="Tesla T4")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: turing)
    monkeypatch.setattr(interface, "HAS_CUDA_KERNELS", True)
    with pytest.raises(
        RuntimeError,
        match=r"needs a GPU of compute capability sm_80 \(Ampere\) or newer; cuda:0 is a Tesla T4 \(sm_75\)",
    ):
        interface._check_cuda_ready(torch.device("cuda", 0))


@pytest.mark.gpu
@pytest.mark.parametrize("func", FUNCS)
def test_gpu_older_than_ampere_is_refused_by_the_public_functions(monkeypatch, func):
    """CUDA tensors on a pre-Ampere GPU (simulated) stop in Python with the GPU named,
    before any kernel launch; the binding has the same check of its own."""
    q, k, v = _qkv("cuda", q_shape=(2, 7, 2, 16))
    turing = SimpleNamespace(major=7, minor=5, name="Tesla T4")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: turing)
    with pytest.raises(RuntimeError, match=r"sm_80 \(Ampere\) or newer; cuda:\d is a Tesla T4 \(sm_75\)"):
        _call(func, q, k, v)


def _pretend_extension_exists(monkeypatch, build_info):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: SimpleNamespace(name=name, origin="/x/_C.so"))
    monkeypatch.setattr(_extension, "_read_build_info", lambda origin: build_info)


def _build_info(**changes):
    info = {"torch_version": torch.__version__, "cuda_version": torch.version.cuda, "arch_list": "9.0a"}
    return {**info, **changes}


def test_extension_built_against_other_torch_is_not_loaded(monkeypatch):
    """Never an ImportError: the kernels stay unloaded, CPU tensors work, the reason names both torches."""
    _pretend_extension_exists(monkeypatch, _build_info(torch_version="2.4.0", cuda_version="12.1", arch_list="8.0"))
    monkeypatch.setattr(importlib, "import_module", lambda name: pytest.fail("a mismatched _C was loaded"))
    reason, info = _extension._load_extension()
    installed = f"torch {torch.__version__} (CUDA {torch.version.cuda})"
    assert f"built against torch 2.4.0 (CUDA 12.1, archs 8.0) but {installed} is installed" in reason
    assert "CPU tensors work; rebuild the kernels with: pip install" in reason
    assert info["torch_version"] == "2.4.0"


def test_extension_without_build_record_is_not_loaded(monkeypatch):
    _pretend_extension_exists(monkeypatch, None)
    monkeypatch.setattr(importlib, "import_module", lambda name: pytest.fail("an unknown _C was loaded"))
    reason, _ = _extension._load_extension()
    assert "built against an unknown torch (no build record beside flashattn._C)" in reason


def test_extension_that_fails_to_load_is_reported(monkeypatch):
    _pretend_extension_exists(monkeypatch, _build_info())
    undefined = OSError("_C.so: undefined symbol: _ZN3c104cuda9SetDeviceEi")

    def fail(name):
        raise undefined

    monkeypatch.setattr(importlib, "import_module", fail)
    reason, _ = _extension._load_extension()
    assert re.search(r"archs 9\.0a\)\) failed to load \(_C\.so: undefined symbol.*\); CPU tensors work", reason)


def _binding_cases():
    """(label, make(q, k, v) -> op args, exception type, message fragment) for the C++ binding's checks.

    Calling the operator directly exercises the binding's messages (numbers and
    shapes in them included) on the device, for inputs flash_attn_func never
    passes it as well (a head dim that is not a multiple of 8)."""

    def args(q, k, v, scale=0.125, causal=False):
        return (q, k, v, scale, causal)

    return [
        ("fp32", lambda q, k, v: args(q.float(), k.float(), v.float()), TypeError,
         "q has dtype torch.float32; accepted on cuda: torch.float16, torch.bfloat16"),
        ("dtype mix", lambda q, k, v: args(q, k.bfloat16(), v), TypeError, "k has dtype"),
        ("3-D q", lambda q, k, v: args(q[0], k, v), ValueError, "q must be 4-D"),
        ("last dim strided", lambda q, k, v: args(q, k.transpose(1, 3).contiguous().transpose(1, 3), v), ValueError,
         "last dimension of k must be contiguous"),
        ("kv shapes", lambda q, k, v: args(q, k, v[:, :-1]), ValueError,
         "k and v must have the same shape (batch, seqlen_k, nheads_k, headdim), got q (2, 30, 4, 64), "
         "k (2, 40, 2, 64), v (2, 39, 2, 64)"),
        ("batch", lambda q, k, v: args(q, k[:1], v[:1]), ValueError, "batch sizes differ"),
        ("head dim %8", lambda q, k, v: args(q[..., :60], k[..., :60], v[..., :60]), ValueError,
         "multiple of 8 (got 60)"),
        ("v head dim %8", lambda q, k, v: args(q, k, v[..., :44]), ValueError, "multiple of 8 (got 64, v's 44)"),
        ("v head dim over q's", lambda q, k, v: args(q[..., :32], k[..., :32], v[..., :40]), ValueError,
         "v has headdim 40 (q (2, 30, 4, 32), k (2, 40, 2, 32), v (2, 40, 2, 40)); accepted: 1 to 32"),
        ("heads", lambda q, k, v: args(q[:, :, :3], k, v), ValueError, "query heads (q.shape[2] = 3) must be a multiple"),
    ]


@pytest.mark.gpu
@pytest.mark.parametrize("label, make, error, match", _binding_cases(), ids=[c[0] for c in _binding_cases()])
def test_binding_rejects_bad_input(label, make, error, match):
    q = torch.randn(2, 30, 4, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(2, 40, 2, 64, device="cuda", dtype=torch.float16)
    v = torch.randn(2, 40, 2, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(error, match=re.escape(match)):
        torch.ops.flashattn.fwd(*make(q, k, v))


@pytest.mark.gpu
def test_binding_copies_rows_the_kernels_cannot_read_in_place():
    """Row strides that are not multiples of 8 elements, or a start off a 16-byte boundary: the
    binding reads a copy (the one place that copies for alignment), with the result of contiguous inputs."""
    q = torch.randn(2, 30, 4, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(2, 40, 2, 64, device="cuda", dtype=torch.float16)
    v = torch.randn(2, 40, 2, 64, device="cuda", dtype=torch.float16)
    k_strided = torch.cat([k, k[..., :1]], -1)[..., :64]  # row stride 130 elements
    v_offset = torch.cat([v.new_zeros(1), v.flatten()])[1:].view(v.shape)  # starts 2 bytes in
    want = torch.ops.flashattn.fwd(q, k, v, 0.125, False)
    got = torch.ops.flashattn.fwd(q, k_strided, v_offset, 0.125, False)
    for name, ours, theirs in zip(("out", "lse"), got, want):
        assert torch.equal(ours, theirs), name


@pytest.mark.gpu
def test_binding_rejects_head_dim_over_512():
    q = torch.randn(1, 8, 2, 520, device="cuda", dtype=torch.bfloat16)
    shapes = "q (1, 8, 2, 520), k (1, 8, 2, 520), v (1, 8, 2, 520)"
    with pytest.raises(ValueError, match=re.escape(f"headdim 520 ({shapes}) is not supported; accepted: 1 to 512")):
        torch.ops.flashattn.fwd(q, q, q, 0.1, False)


def _binding_backward_cases():
    """(label, make(dout, q, k, v, out, lse) -> bwd args, exception type, message fragment) for the
    backward's checks."""

    def args(dout, q, k, v, out, lse):
        return (dout, q, k, v, out, lse, 0.125, False, False)

    return [
        ("dout shape", lambda do, q, k, v, o, lse: args(do[:, :-1], q, k, v, o, lse), RuntimeError,
         "dout (2, 29, 4, 64) and out (2, 30, 4, 64) must have the shape of q (2, 30, 4, 64)"),
        ("out shape", lambda do, q, k, v, o, lse: args(do, q, k, v, o[:, :, :2], lse), RuntimeError,
         "and out (2, 30, 2, 64)"),
        ("dout dtype", lambda do, q, k, v, o, lse: args(do.bfloat16(), q, k, v, o, lse), TypeError, "dout has dtype"),
        ("dout on cpu", lambda do, q, k, v, o, lse: args(do.cpu(), q, k, v, o, lse), RuntimeError,
         "dout is on cpu but q is on cuda"),
        ("out last dim strided",
         lambda do, q, k, v, o, lse: args(do, q, k, v, o.transpose(1, 3).contiguous().transpose(1, 3), lse),
         ValueError, "last dimension of out must be contiguous"),
        ("lse dtype", lambda do, q, k, v, o, lse: args(do, q, k, v, o, lse.double()), RuntimeError,
         "softmax_lse must be the forward's contiguous float32 tensor of shape (2, 4, 30)"),
        ("lse shape", lambda do, q, k, v, o, lse: args(do, q, k, v, o, lse[:, :, :-1]), RuntimeError,
         "float32 tensor of shape (2, 4, 30) on q's device, got (2, 4, 29)"),
        ("lse strided", lambda do, q, k, v, o, lse: args(do, q, k, v, o, lse.mT.contiguous().mT), RuntimeError,
         "softmax_lse must be the forward's contiguous float32 tensor"),
    ]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "label, make, error, match", _binding_backward_cases(), ids=[c[0] for c in _binding_backward_cases()]
)
def test_binding_backward_rejects_bad_input(label, make, error, match):
    q = torch.randn(2, 30, 4, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(2, 40, 2, 64, device="cuda", dtype=torch.float16)
    v = torch.randn(2, 40, 2, 64, device="cuda", dtype=torch.float16)
    out, lse = torch.ops.flashattn.fwd(q, k, v, 0.125, False)
    dout = torch.randn_like(out)
    with pytest.raises(error, match=re.escape(match)):
        torch.ops.flashattn.bwd(*make(dout, q, k, v, out, lse))


def _binding_option_cases():
    """(label, keyword arguments of fwd given q, exception type, message fragment) for the binding's checks
    of the options' tensors and of the range of the values it converts for the kernels."""
    return [
        ("window below -1", lambda q: {"window_left": -2}, ValueError,
         "window_left and window_right must be ints >= -1"),
        ("dropout above 1", lambda q: {"dropout_p": 1.5}, ValueError, "dropout_p must be in [0, 1), got 1.5"),
        ("alibi fp16", lambda q: {"alibi_slopes": torch.ones(4, device=q.device, dtype=torch.float16)}, TypeError,
         "alibi_slopes must be a float32 tensor of shape (nheads,) = (4,) or (batch, nheads) = (2, 4), "
         "got dtype torch.float16"),
        ("alibi strided", lambda q: {"alibi_slopes": torch.ones(4, 2, device=q.device).t()}, ValueError,
         "alibi_slopes must be contiguous"),
        ("rng_state int32",
         lambda q: {"dropout_p": 0.1, "rng_state": torch.zeros(2, dtype=torch.int32, device=q.device)}, RuntimeError,
         "rng_state must be a contiguous int64 tensor of 2 elements on q's device"),
        ("rng_state on cpu", lambda q: {"dropout_p": 0.1, "rng_state": torch.zeros(2, dtype=torch.int64)},
         RuntimeError, "rng_state must be a contiguous int64 tensor of 2 elements on q's device"),
        ("cu_seqlens int64", lambda q: {"cu_seqlens_q": torch.zeros(3, dtype=torch.int64, device=q.device),
                                        "cu_seqlens_k": torch.zeros(3, dtype=torch.int64, device=q.device)},
         TypeError, "cu_seqlens_q must be an int32 tensor of shape (batch + 1,)"),
        ("varlen q 4-D", lambda q: {"cu_seqlens_q": torch.zeros(3, dtype=torch.int32, device=q.device),
                                    "cu_seqlens_k": torch.zeros(3, dtype=torch.int32, device=q.device)},
         ValueError, "q must be 3-D"),
    ]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "label, make, error, match", _binding_option_cases(), ids=[c[0] for c in _binding_option_cases()]
)
def test_binding_rejects_bad_options(label, make, error, match):
    q = torch.randn(2, 30, 4, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(2, 40, 2, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(error, match=re.escape(match)):
        torch.ops.flashattn.fwd(q, k, k, 0.125, False, **make(q))
