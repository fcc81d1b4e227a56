"""The attention implementations that are timed against each other: flashattn, SDPA's
flash, cuDNN and efficient backends, FlashAttention-4 (when it imports), and the naive
reference; and the calls that the gradient passes time."""
import contextlib
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


def backend_fns(q, k, v, causal, scale):
    """{backend: fn() -> out [B, S, H, D]} on q, k, v, and {backend: its context}:
    flashattn (and with deterministic=True: flashattn_det) and naive, and on CUDA tensors
    SDPA's three backends and FlashAttention-4 too (where it does not import, its call
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
