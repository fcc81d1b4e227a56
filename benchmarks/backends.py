"""The attention implementations that are timed against each other: flashattn, SDPA's
flash, cuDNN and efficient backends, FlashAttention-4 (when it imports), FlashAttention-3
(when scripts/stage_fa3.sh's library is there), and the naive reference; and the calls
that the gradient passes time."""
import contextlib
import ctypes
import gc
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SDPA_BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION,
                 "cudnn": SDPBackend.CUDNN_ATTENTION,
                 "efficient": SDPBackend.EFFICIENT_ATTENTION}


def sdpa_fn(q, k, v, causal, scale):
    """SDPA wants [B, H, S, D]: transposed views of the same [B, S, H, D] tensors.
    Its is_causal is top-left aligned, the same as ours only because Sq == Sk here.
    The backend is chosen by the caller's sdpa_kernel context. The result is a
    [B, S, H, D] view, like flashattn's output."""
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    return lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, scale=scale).transpose(1, 2)


def flash_attention_4(function="flash_attn_func"):
    """FlashAttention-4's `function` (flash_attn_func or flash_attn_varlen_func: its CuTe-DSL kernels; sm90
    and newer), or the reason it does not import. It is no dependency: FLASHATTN_FA4_DIR names a folder its
    wheels were installed into with `pip install --no-index --no-deps --target DIR`
    (../shared/guides/hopper.md), added as a site dir."""
    import importlib
    import os
    import site

    if folder := os.environ.get("FLASHATTN_FA4_DIR"):
        site.addsitedir(folder)
    try:
        return getattr(importlib.import_module("flash_attn.cute"), function), None
    except Exception as exc:  # ImportError, or its own import-time errors
        return None, f"{type(exc).__name__}: {exc}"


def fa4_fn(fa4_func, q, k, v, causal, scale):
    """A call of FlashAttention-4 on the [B, S, H, D] tensors: its out (it may return (out, lse))."""
    def call():
        out = fa4_func(q, k, v, softmax_scale=scale, causal=causal)
        return out[0] if isinstance(out, tuple) else out
    return call


FA3_DTYPES = {torch.bfloat16: 1, torch.float8_e4m3fn: 2}  # the dtypes stage_fa3.sh builds (fa3_driver.cu: 0 is fp16)


class _Fa3Call(ctypes.Structure):
    """benchmarks/fa3_driver.cu's Fa3Call, field for field."""
    _fields_ = ([(name, ctypes.c_void_p) for name in (
        "q", "k", "v", "out", "lse", "q_descale", "k_descale", "v_descale", "semaphore",
        "dout", "dq", "dk", "dv", "dq_accum", "dk_accum", "dv_accum", "softmax_d", "lse_log2", "dq_semaphore")]
        + [(name, ctypes.c_int64 * 3) for name in ("q_strides", "k_strides", "v_strides", "o_strides")]
        + [(name, ctypes.c_int) for name in (
            "b", "seqlen_q", "seqlen_k", "h", "h_k", "d", "seqlen_q_rounded", "seqlen_k_rounded")]
        + [("softmax_scale", ctypes.c_float), ("causal", ctypes.c_int), ("dtype", ctypes.c_int)])


class FlashAttention3:
    """FlashAttention-3's sm90 kernels through scripts/stage_fa3.sh's libfa3.so (ctypes, no torch in it):
    forward on bf16 and float8_e4m3fn [B, S, H, D] tensors (FP8: descales (B, Hk) fp32, out bf16)
    and the bf16 backward, at the head dims the library was built with (64, 128 and 256). Workspaces are
    allocated per call, as FA3's own binding does; its FP8 V stays row-major (transposed in its kernel).
    FA3's launcher exits the process on a CUDA error, so _call raises first for what it does not serve."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        for name in ("fa3_forward", "fa3_backward"):
            getattr(self.lib, name).argtypes = [ctypes.POINTER(_Fa3Call), ctypes.c_void_p]
            getattr(self.lib, name).restype = ctypes.c_int

    @staticmethod
    def _call(q, k, v, causal, scale, m_block=128, n_block=128):
        if q.shape[-1] not in (64, 128, 256) or q.dtype not in FA3_DTYPES:
            raise RuntimeError(f"FlashAttention-3 as built here serves head dims 64, 128 and 256 in "
                               f"{sorted(str(d) for d in FA3_DTYPES)}; got {q.shape[-1]}, {q.dtype}")
        if q.shape[1] != k.shape[1] or q.shape[2] != k.shape[2]:
            raise RuntimeError("FlashAttention-3 as called here needs Sq == Sk and H == Hk")
        b, s, h, d = q.shape
        c = _Fa3Call()
        c.q, c.k, c.v = q.data_ptr(), k.data_ptr(), v.data_ptr()
        for field, t in (("q_strides", q), ("k_strides", k), ("v_strides", v)):
            if t.stride(-1) != 1:
                raise RuntimeError("FlashAttention-3 needs a contiguous last dimension")
            getattr(c, field)[:] = (t.stride(0), t.stride(1), t.stride(2))
        c.b, c.seqlen_q, c.seqlen_k, c.h, c.h_k, c.d = b, s, s, h, h, d
        c.seqlen_q_rounded = -(-s // m_block) * m_block
        c.seqlen_k_rounded = -(-s // n_block) * n_block
        c.softmax_scale, c.causal, c.dtype = scale, int(causal), FA3_DTYPES[q.dtype]
        return c

    def _run(self, fn, c):
        rc = fn(ctypes.byref(c), torch.cuda.current_stream().cuda_stream)
        if rc != 0:
            raise RuntimeError(f"FlashAttention-3: cudaError {rc}")

    def forward(self, q, k, v, causal, scale, descales=None):
        """(out, lse [B, H, S] fp32)."""
        c = self._call(q, k, v, causal, scale)
        out = torch.empty(q.shape, dtype=torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype,
                          device=q.device)
        lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32, device=q.device)
        semaphore = torch.empty(1, dtype=torch.int32, device=q.device)
        c.out, c.lse, c.semaphore = out.data_ptr(), lse.data_ptr(), semaphore.data_ptr()
        c.o_strides[:] = (out.stride(0), out.stride(1), out.stride(2))
        if descales is not None:
            scales = [descales[n].float().contiguous() for n in ("q_descale", "k_descale", "v_descale")]
            c.q_descale, c.k_descale, c.v_descale = (t.data_ptr() for t in scales)
        self._run(self.lib.fa3_forward, c)
        return out, lse

    def backward(self, dout, q, k, v, out, lse, causal, scale):
        """(dq, dk, dv); FA3's own blocks (its binding's kBlockM and kBlockN) size the workspaces."""
        d = q.shape[-1]
        m_block, n_block = {64: (128, 128), 128: (64 if causal else 80, 128)}.get(d, (64, 80))
        c = self._call(q, k, v, causal, scale, m_block, n_block)
        dout = dout.contiguous()  # out is: the two share o_strides
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        b, s, h, _ = q.shape
        softmax_d = torch.empty(b, h, c.seqlen_q_rounded, dtype=torch.float32, device=q.device)
        lse_log2 = torch.empty_like(softmax_d)
        dq_accum = torch.empty(b, h, c.seqlen_q_rounded * d, dtype=torch.float32, device=q.device)
        dq_semaphore = torch.empty(-(-s // m_block), b, h, dtype=torch.int32, device=q.device)
        c.out, c.lse, c.dout = out.data_ptr(), lse.data_ptr(), dout.data_ptr()
        c.o_strides[:] = (out.stride(0), out.stride(1), out.stride(2))
        c.dq, c.dk, c.dv = dq.data_ptr(), dk.data_ptr(), dv.data_ptr()
        c.dq_accum, c.softmax_d, c.lse_log2 = dq_accum.data_ptr(), softmax_d.data_ptr(), lse_log2.data_ptr()
        c.dq_semaphore = dq_semaphore.data_ptr()
        self._run(self.lib.fa3_backward, c)
        return dq, dk, dv


class _Fa3Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fa3, q, k, v, causal, scale):
        out, lse = fa3.forward(q, k, v, causal, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.fa3, ctx.causal, ctx.scale = fa3, causal, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        return (None, *ctx.fa3.backward(dout, *ctx.saved_tensors, ctx.causal, ctx.scale), None, None)


def flash_attention_3():
    """FlashAttention-3 (FlashAttention3 above), or the reason it is not there. It is no dependency:
    FLASHATTN_FA3_LIB names the libfa3.so that scripts/stage_fa3.sh built (default: .fa3/lib/libfa3.so
    in this checkout)."""
    import os
    from pathlib import Path

    path = os.environ.get("FLASHATTN_FA3_LIB") or str(Path(__file__).resolve().parents[1] / ".fa3/lib/libfa3.so")
    if not Path(path).is_file():
        return None, f"no {path} (scripts/stage_fa3.sh builds it)"
    try:
        return FlashAttention3(path), None
    except OSError as exc:
        return None, f"{type(exc).__name__}: {exc}"


def fa3_fn(fa3, q, k, v, causal, scale):
    """A call of FlashAttention-3 on the [B, S, H, D] tensors, differentiable: its out."""
    return lambda: _Fa3Attention.apply(fa3, q, k, v, causal, scale)


def backend_fns(q, k, v, causal, scale):
    """{backend: fn() -> out [B, S, H, D]} on q, k, v, and {backend: its context}:
    flashattn (and with deterministic=True: flashattn_det) and naive, and on CUDA tensors
    SDPA's three backends and FlashAttention-4 and -3 too (where one is not there, its call
    raises why, and its rows say n/a).

    Each backend runs, checked and timed, inside its context: SDPA's backend
    choice stays out of the timed calls.
    """
    from flashattn import flash_attn_func
    from flashattn.reference import attention_ref

    fns = {
        "flashattn": lambda: flash_attn_func(q, k, v, softmax_scale=scale, causal=causal),
        "flashattn_det": lambda: flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, deterministic=True),
        "naive": lambda: attention_ref(q, k, v, softmax_scale=scale, causal=causal, upcast=False)[0],
    }
    contexts = dict.fromkeys(fns, contextlib.nullcontext)
    if q.is_cuda:
        for name, backend in SDPA_BACKENDS.items():
            fns[name] = sdpa_fn(q, k, v, causal, scale)
            contexts[name] = lambda backend=backend: sdpa_kernel(backend)
        fa4, missing = flash_attention_4()
        fns["fa4"] = fa4_fn(fa4, q, k, v, causal, scale) if fa4 is not None else unavailable(missing)
        contexts["fa4"] = contextlib.nullcontext
        fa3, missing = flash_attention_3()
        fns["fa3"] = fa3_fn(fa3, q, k, v, causal, scale) if fa3 is not None else unavailable(missing)
        contexts["fa3"] = contextlib.nullcontext
    return fns, contexts


def unavailable(why):
    """A backend's call that raises why it cannot run."""
    def call():
        raise RuntimeError(f"not available: {why}")
    return call


def call_capturing_warnings(fn):
    """Run fn; on failure re-raise with SDPA's warnings (which say why a backend
    refused the inputs) folded into the message."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return fn()
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as exc:  # an unsupported backend raises RuntimeError
            # SDPA warns "<backend> kernel not used because:" and then the reason;
            # keep the reasons, once each, before the error itself.
            reasons = dict.fromkeys(" ".join(str(w.message).split()) for w in caught)
            reasons = [r for r in reasons if r and not r.endswith("because:")]
            raise RuntimeError("; ".join(reasons + [str(exc)])) from None


def grad_leaves(tensors):
    """Leaves that share the tensors' storage and require grad: the gradient
    passes get their own, so that the forward pass times inputs without autograd."""
    return [t.detach().requires_grad_() for t in tensors]


def grad_step(fn, inputs, dout, pass_):
    """The call that a gradient pass times, for fn() -> out computed from the leaves inputs.

    bwd: the forward runs here, once, outside the timed call, and the call
    keeps its graph (retain_graph) so that it can repeat. fwdbwd: the call runs
    the forward and the backward."""
    if pass_ == "bwd":
        out = fn()
        return lambda: torch.autograd.grad(out, inputs, dout, retain_graph=True)
    return lambda: torch.autograd.grad(fn(), inputs, dout)


def free_cuda_memory():
    gc.collect()
    torch.cuda.empty_cache()


def short_reason(text, limit=300):
    """An exception's message on one line, cut at limit characters, for a row's notes."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
