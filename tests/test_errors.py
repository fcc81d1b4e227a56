"""Every bad input gets an error of the right type whose message names the argument.

CPU path unless marked; GPU twins where the CUDA path differs (dtypes, devices).
"""

import importlib
import importlib.util
import re
from types import SimpleNamespace

import pytest
import torch

from flashattn import (
    _extension,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    interface,
)


def _qkv(device="cpu", dtype=torch.float16, q_shape=(2, 5, 4, 16), kv_shape=(2, 7, 2, 16)):
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(q_shape, generator=gen, dtype=dtype, device=device)
    k = torch.randn(kv_shape, generator=gen, dtype=dtype, device=device)
    v = torch.randn(kv_shape, generator=gen, dtype=dtype, device=device)
    return q, k, v


def _replace(index, value):
    """A case that replaces q (0), k (1) or v (2) of valid inputs."""

    def make(q, k, v):
        qkv = [q, k, v]
        qkv[index] = value(qkv[index])
        return qkv

    return make


BAD_INPUTS = [
    # id, change to valid (q, k, v), expected exception, message pattern
    ("q-not-tensor", _replace(0, lambda t: t.tolist()), TypeError, r"q must be a torch\.Tensor, got list"),
    ("k-3d", _replace(1, lambda t: t[0]), ValueError, r"k must be 4-D .*got shape \(7, 2, 16\)"),
    ("v-5d", _replace(2, lambda t: t[None]), ValueError, r"v must be 4-D"),
    ("v-other-device", _replace(2, lambda t: t.to("meta")), RuntimeError, r"v is on meta but q is on cpu"),
    (
        "all-on-meta",
        lambda q, k, v: [t.to("meta") for t in (q, k, v)],
        RuntimeError,
        r"q is on meta; accepted devices: cpu, cuda",
    ),
    (
        "q-float64",
        lambda q, k, v: [t.double() for t in (q, k, v)],
        TypeError,
        r"q has dtype torch\.float64; accepted on cpu: torch\.float16, torch\.bfloat16, torch\.float32",
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
    ("kv-shapes-differ", _replace(2, lambda t: t[:, :6]), ValueError, r"k and v must have the same shape"),
    (
        "head-dims-differ",
        lambda q, k, v: [q[..., :8], k, v],
        ValueError,
        r"head dims differ \(q \(2, 5, 4, 8\), k \(2, 7, 2, 16\)",
    ),
    (
        "head-dim-too-large",
        lambda q, k, v: [t.new_zeros(*t.shape[:3], 257) for t in (q, k, v)],
        ValueError,
        r"headdim 257 .*accepted: 1 to 256",
    ),
    (
        "head-dim-zero",
        lambda q, k, v: [t[..., :0] for t in (q, k, v)],
        ValueError,
        r"headdim 0 .*accepted: 1 to 256",
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
        "v-last-dim-strided",
        _replace(2, lambda t: t.repeat_interleave(2, dim=3)[..., ::2]),
        ValueError,
        r"last dimension of v must be contiguous",
    ),
]


@pytest.mark.parametrize(
    "change, error, match", [case[1:] for case in BAD_INPUTS], ids=[case[0] for case in BAD_INPUTS]
)
def test_bad_qkv(change, error, match):
    with pytest.raises(error, match=match):
        flash_attn_func(*change(*_qkv()))


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
def test_bad_softmax_scale(softmax_scale, error):
    with pytest.raises(error, match=r"softmax_scale must be a positive finite number"):
        flash_attn_func(*_qkv(), softmax_scale=softmax_scale)


UNIMPLEMENTED = [
    ("dropout_p", 0.1),
    ("window_size", (4, 0)),
    ("softcap", 30.0),
    ("alibi_slopes", torch.ones(4)),
    ("return_attn_probs", True),
]


@pytest.mark.parametrize("name, value", UNIMPLEMENTED, ids=[name for name, _ in UNIMPLEMENTED])
@pytest.mark.parametrize("func", ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func"])
def test_unimplemented_options_are_refused_by_name(func, name, value):
    q, k, v = _qkv(q_shape=(2, 7, 2, 16))
    args = {
        "flash_attn_func": (q, k, v),
        "flash_attn_qkvpacked_func": (torch.stack([q, k, v], dim=2),),
        "flash_attn_kvpacked_func": (q, torch.stack([k, v], dim=2)),
    }[func]
    with pytest.raises(NotImplementedError, match=rf"{name}=.* is not implemented yet"):
        getattr(interface, func)(*args, **{name: value})


def test_defaults_of_unimplemented_options_are_accepted():
    q, k, v = _qkv()
    out = flash_attn_func(q, k, v, 0.0, None, False, [-1, -1], 0.0, None, True, False)
    assert torch.equal(out, flash_attn_func(q, k, v))


@pytest.mark.parametrize(
    "qkv, error, match",
    [
        (
            torch.zeros(2, 5, 4, 16),
            ValueError,
            r"qkv must have shape \(batch, seqlen, 3, nheads, headdim\), got \(2, 5, 4, 16\)",
        ),
        (torch.zeros(2, 5, 2, 4, 16), ValueError, r"qkv must have shape .*got \(2, 5, 2, 4, 16\)"),
        ("qkv", TypeError, r"qkv must be a torch\.Tensor, got str"),
        (
            torch.zeros(2, 5, 3, 4, 16, dtype=torch.float64),
            TypeError,
            r"qkv\[:, :, 0\] has dtype torch\.float64",
        ),
    ],
)
def test_bad_qkvpacked(qkv, error, match):
    with pytest.raises(error, match=match):
        flash_attn_qkvpacked_func(qkv)


@pytest.mark.parametrize(
    "kv, error, match",
    [
        (
            torch.zeros(2, 7, 3, 2, 16, dtype=torch.float16),
            ValueError,
            r"kv must have shape \(batch, seqlen_k, 2, nheads_k, headdim\)",
        ),
        (None, TypeError, r"kv must be a torch\.Tensor, got NoneType"),
        (
            torch.zeros(2, 7, 2, 2, 8, dtype=torch.float16),
            ValueError,
            r"head dims differ \(q \(2, 5, 4, 16\), kv\[:, :, 0\] \(2, 7, 2, 8\)",
        ),
    ],
)
def test_bad_kvpacked(kv, error, match):
    with pytest.raises(error, match=match):
        flash_attn_kvpacked_func(_qkv()[0], kv)


@pytest.mark.gpu
def test_fp32_refused_on_cuda():
    with pytest.raises(
        TypeError, match=r"q has dtype torch\.float32; accepted on cuda: torch\.float16, torch\.bfloat16"
    ):
        flash_attn_func(*_qkv("cuda", torch.float32))


@pytest.mark.gpu
def test_cuda_and_cpu_mixed():
    q, k, v = _qkv("cuda")
    with pytest.raises(RuntimeError, match=r"k is on cpu but q is on cuda:\d"):
        flash_attn_func(q, k.cpu(), v)


def test_cuda_without_built_kernels_says_how_to_build(monkeypatch):
    """A CUDA tensor with no kernels built gets NOT_BUILT_REASON, which says how to build them."""
    reason = _extension._not_built_reason(SimpleNamespace(WITH_CUDA=False, REASON="no CUDA toolkit found"))
    monkeypatch.setattr(interface, "HAS_CUDA_KERNELS", False)
    monkeypatch.setattr(interface, "NOT_BUILT_REASON", reason)
    with pytest.raises(RuntimeError, match=r"CUDA kernels were not built \(no CUDA toolkit found\)") as info:
        interface._check_cuda_ready(torch.device("cuda", 0))
    assert "CUDA_HOME=/usr/local/cuda pip install --no-build-isolation -e ." in str(info.value)
    assert "TORCH_CUDA_ARCH_LIST" in str(info.value) and "8.0+PTX;9.0a" in str(info.value)


def test_not_built_reason_without_build_info():
    assert "no CUDA toolkit or a CPU-only torch at install time" in _extension._not_built_reason(None)


def test_not_built_reason_when_a_cuda_build_left_no_extension():
    """A CUDA build for another Python (or one that failed) is reported as such, not as 'no toolkit'."""
    info = SimpleNamespace(
        WITH_CUDA=True, TORCH_VERSION="2.14.1+cu130", CUDA_VERSION="13.0", ARCH_LIST="9.0a"
    )
    reason = _extension._not_built_reason(info)
    assert "CUDA kernels are missing" in reason and "torch 2.14.1+cu130 (CUDA 13.0, archs 9.0a)" in reason
    assert "pip install --no-build-isolation -e ." in reason


def test_gpu_older_than_ampere_is_refused(monkeypatch):
    turing = SimpleNamespace(major=7, minor=5, name="Tesla T4")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: turing)
    monkeypatch.setattr(interface, "HAS_CUDA_KERNELS", True)
    with pytest.raises(
        RuntimeError,
        match=r"needs a GPU of compute capability sm_80 \(Ampere\) or newer; cuda:0 is a Tesla T4 \(sm_75\)",
    ):
        interface._check_cuda_ready(torch.device("cuda", 0))


def _pretend_extension_exists(monkeypatch, build_info):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: SimpleNamespace(name=name))
    monkeypatch.setattr(_extension, "_read_build_info", lambda: build_info)


def test_extension_built_against_other_torch_is_refused(monkeypatch):
    _pretend_extension_exists(
        monkeypatch,
        SimpleNamespace(WITH_CUDA=True, TORCH_VERSION="2.4.0", CUDA_VERSION="12.1", ARCH_LIST="8.0"),
    )
    installed = re.escape(f"torch {torch.__version__} (CUDA {torch.version.cuda})")
    expected = (
        rf"built against torch 2\.4\.0 \(CUDA 12\.1, archs 8\.0\) but {installed} is installed; "
        r"rebuild with: CUDA_HOME="
    )
    with pytest.raises(ImportError, match=expected):
        _extension._load_extension()


@pytest.mark.parametrize(
    "build_info, described",
    [
        (None, r"an unknown torch \(flashattn/_build_info\.py is missing\)"),
        (
            SimpleNamespace(WITH_CUDA=False, TORCH_VERSION=torch.__version__),
            re.escape(f"torch {torch.__version__} without CUDA"),
        ),
    ],
)
def test_extension_with_unknown_or_cpu_build_info_is_refused(monkeypatch, build_info, described):
    _pretend_extension_exists(monkeypatch, build_info)
    with pytest.raises(ImportError, match=rf"built against {described}"):
        _extension._load_extension()


def test_extension_that_fails_to_load_is_reported(monkeypatch):
    _pretend_extension_exists(
        monkeypatch,
        SimpleNamespace(
            WITH_CUDA=True, TORCH_VERSION=torch.__version__, CUDA_VERSION=torch.version.cuda, ARCH_LIST="9.0a"
        ),
    )
    undefined = OSError("_C.so: undefined symbol: _ZN3c104cuda9SetDeviceEi")

    def fail(name):
        raise undefined

    monkeypatch.setattr(importlib, "import_module", fail)
    with pytest.raises(
        ImportError, match=r"failed to load \(_C\.so: undefined symbol.*\)\. .*archs 9\.0a"
    ) as info:
        _extension._load_extension()
    assert info.value.__cause__ is undefined


def _binding_cases():
    """(label, make(q, k, v) -> op args, message fragment) for the C++ binding's own checks.

    flash_attn_func stops bad input before it reaches the binding; calling the
    operator directly exercises the binding's messages (numbers and shapes in
    them included) on the device."""

    def args(q, k, v, scale=0.125, causal=False):
        return (q, k, v, scale, causal)

    return [
        ("fp32", lambda q, k, v: args(q.float(), k.float(), v.float()), "q must be float16 or bfloat16"),
        ("dtype mix", lambda q, k, v: args(q, k.bfloat16(), v), "k has dtype"),
        ("3-D q", lambda q, k, v: args(q[0], k, v), "q must be 4-D"),
        ("last dim strided", lambda q, k, v: args(q, k.transpose(1, 3).contiguous().transpose(1, 3), v),
         "last dimension of k must be contiguous"),
        ("row stride", lambda q, k, v: args(q, torch.cat([k, k[..., :1]], -1)[..., :64], v),
         "k stride"),
        ("kv shapes", lambda q, k, v: args(q, k, v[:, :-1]), "k (2, 40, 2, 64) and v (2, 39, 2, 64)"),
        ("batch", lambda q, k, v: args(q, k[:1], v[:1]), "batch sizes differ"),
        ("head dim %8", lambda q, k, v: args(q[..., :60], k[..., :60], v[..., :60]),
         "multiple of 8 (got 60)"),
        ("heads", lambda q, k, v: args(q[:, :, :3], k, v), "query heads (3) must be a multiple"),
        ("scale", lambda q, k, v: args(q, k, v, scale=-1.0), "softmax_scale must be a positive finite number"),
    ]


@pytest.mark.gpu
@pytest.mark.parametrize("label, make, match", _binding_cases(), ids=[c[0] for c in _binding_cases()])
def test_binding_rejects_bad_input(label, make, match):
    q = torch.randn(2, 30, 4, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(2, 40, 2, 64, device="cuda", dtype=torch.float16)
    v = torch.randn(2, 40, 2, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(RuntimeError, match=re.escape(match)):
        torch.ops.flashattn.fwd(*make(q, k, v))


@pytest.mark.gpu
def test_binding_rejects_head_dim_over_256():
    q = torch.randn(1, 8, 2, 264, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match=re.escape("head_dim 264 is not supported; the maximum is 256")):
        torch.ops.flashattn.fwd(q, q, q, 0.1, False)
