"""Correctness before speed: every backend's output (its gradients in the gradient passes)
is checked against the accurate reference with the tests' bound (flashattn.testing),
so that a broken kernel cannot post a fast number.

On the GPU the reference runs on a slice of the batch and heads (REF_SLICE), so that
it fits in memory at S = 16k; the rows record the largest error on that slice.
"""
import math
from dataclasses import dataclass

import torch

from flashattn.reference import attention_ref
from flashattn.testing import (grad_bound, grad_eps, max_abs_diff, output_bound, reference_dtype,
                               rounding_floor)

GRAD_NAMES = ("dq", "dk", "dv")
REF_CHECK_BATCH, REF_CHECK_HEADS = 1, 2
REF_SLICE = (slice(0, REF_CHECK_BATCH), slice(None), slice(0, REF_CHECK_HEADS))  # of [B, S, H, D]
WHOLE = (slice(None),)


@dataclass
class Reference:
    """The accurate reference's outputs on q[where], k[where], v[where] (out, or dq, dk, dv)
    and the most each may differ from ours (the tests' bound)."""
    where: tuple
    outputs: list
    bounds: list

    @property
    def name(self):
        name = f"the {'fp32' if self.outputs[0].dtype == torch.float32 else 'float64'} reference"
        if self.where == WHOLE:
            return name
        batch, _, heads = self.where
        return f"{name} on batch[:{batch.stop}], heads[:{heads.stop}]"


def output_reference(q, k, v, scale, causal, where=WHOLE):
    """The Reference of the forward: OUT_FACTOR x the error of attention_ref in q's dtype."""
    q, k, v = (t[where] for t in (q, k, v))
    accurate = reference_dtype(q.dtype)
    out, _ = attention_ref(q.to(accurate), k.to(accurate), v.to(accurate), scale, causal)
    lowp, _ = attention_ref(q, k, v, scale, causal, upcast=False)
    return Reference(where, [out], [output_bound(max_abs_diff(lowp, out), rounding_floor(out, q.dtype))])


def reference_grads(q, k, v, dout, scale, causal, upcast):
    """(dq, dk, dv) of attention_ref through autograd, in the dtype of q."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out, _ = attention_ref(*leaves, softmax_scale=scale, causal=causal, upcast=upcast)
    return torch.autograd.grad(out, leaves, dout.to(out.dtype))


def grad_reference(q, k, v, dout, scale, causal, where=WHOLE):
    """The Reference of the gradients: GRAD_FACTOR x the error of attention_ref's gradients in q's dtype.

    The tests' bound also lets dq and dk carry the error they inherit from the forward's
    rounded out; the benchmark leaves that term out (it is far below the factor's share on
    the sweep's shapes), which only makes its check stricter."""
    q, k, v, dout = (t[where] for t in (q, k, v, dout))
    accurate = reference_dtype(q.dtype)
    refs = reference_grads(*(t.to(accurate) for t in (q, k, v, dout)), scale, causal, upcast=True)
    lowps = reference_grads(q, k, v, dout, scale, causal, upcast=False)
    eps = grad_eps(scale, q.shape[-1])
    bounds = [grad_bound(max_abs_diff(lowp, ref), rounding_floor(ref, q.dtype), eps=eps)
              for lowp, ref in zip(lowps, refs)]
    return Reference(where, list(refs), bounds)


def check(row, outputs, reference):
    """Record in the row the largest error of outputs (out, or dq, dk, dv) on the
    reference's slice; mark the row a mismatch where one passes its bound."""
    outputs = [outputs] if isinstance(outputs, torch.Tensor) else outputs
    errors = [max_abs_diff(got[reference.where], want) for got, want in zip(outputs, reference.outputs)]
    row.max_abs_diff = max(errors, key=lambda e: e if math.isfinite(e) else math.inf)
    names = GRAD_NAMES if len(errors) == len(GRAD_NAMES) else ("out",)
    row.notes = f"diff vs {reference.name}" + ("" if len(errors) == 1 else ": " + ", ".join(
        f"{n} {e:.3g}" for n, e in zip(names, errors)))
    bad = [f"{n} {e:.3g} > bound {b:.3g}" for n, e, b in zip(names, errors, reference.bounds) if not e <= b]
    if bad:
        row.status = "mismatch"
        row.notes = f"max abs diff vs {reference.name}: " + ", ".join(bad)
    return not bad
