"""What the tests, the benchmarks and scripts/long_context.py share: the FLOP count of
attention, the error bound that decides whether an output is correct, and a free loopback port for
the process groups of multi-process runs (tests/test_parallel.py, benchmarks/parallel.py).

The bound (the project's testing rule): against an accurate reference (fp32; float64
for fp32 inputs), our error may be at most twice the error of PyTorch doing the same
math in the same low precision (attention_ref with upcast=False), three times for
gradients, whose low-precision error compounds over more products:

    max|ours - ref| <= max(2 * max|torch_same_dtype - ref|, rounding floor) + eps

The rounding floor is one unit in the last place of the result's dtype (see
rounding_floor); where out cancels, the rounding of the probabilities before P V sets it
instead (probs_rounding_floor), and for gradients the rounding of P and dS before the backward's
GEMMs (grads_rounding_floors); gradients may add the error that FlashAttention's backward inherits
from the forward's rounded out (tests/helpers.py and scripts/long_context.py compute
it). Nothing here needs a GPU.
"""

import math
import socket

import torch
from torch import Tensor

__all__ = [
    "GRAD_EPS",
    "GRAD_FACTOR",
    "LSE_EPS",
    "OUT_EPS",
    "OUT_FACTOR",
    "PASS_FLOP_FACTORS",
    "attention_flops",
    "free_loopback_port",
    "grad_bound",
    "grad_eps",
    "grads_rounding_floors",
    "max_abs_diff",
    "output_bound",
    "probs_rounding_floor",
    "reference_dtype",
    "rounding_floor",
]

OUT_FACTOR = 2
GRAD_FACTOR = 3
# PyTorch's own error can be exactly 0 (one key per query, fp32); the eps keep the
# bound above our fp32 rounding there.
OUT_EPS = 1e-5
LSE_EPS = 1e-4
# Where PyTorch's low-precision gradient is exact (one key: the softmax's gradient
# is exactly 0), ours still carries fp32 rounding: sums of O(10) terms of O(10)
# differ by ~1e-6 when added in another order. 1e-4 covers that at the default
# softmax_scale and is far below any bf16/fp16 error on gradients of standard
# normal inputs (~1e-3 and up).
GRAD_EPS = 1e-4

# FLOPs of a pass in units of the forward's: the backward runs five GEMMs of the
# forward's size (S = Q K^T recomputed, dV, dP, dK, dQ) where the forward runs two.
PASS_FLOP_FACTORS = {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}


def attention_flops(batch: int, heads: int, seqlen: int, headdim: int, causal: bool, pass_: str = "fwd") -> float:
    """4*B*H*S*S*D (two GEMMs of 2*S*S*D each), halved for causal (Sq == Sk), times the
    pass's factor (PASS_FLOP_FACTORS: fwd 1, bwd 2.5, fwdbwd 3.5)."""
    flops = 4 * batch * heads * seqlen * seqlen * headdim * PASS_FLOP_FACTORS[pass_]
    return flops / 2 if causal else flops


def reference_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the accurate reference for inputs of dtype: fp32, or float64 for fp32
    inputs, whose "same precision" PyTorch run is the fp32 reference itself."""
    return torch.float64 if dtype == torch.float32 else torch.float32


def max_abs_diff(a: Tensor, b: Tensor) -> float:
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def rounding_floor(reference: Tensor, dtype: torch.dtype) -> float:
    """One unit in the last place of dtype at the reference's largest magnitude (0 for fp32).

    Storing a result in a 16-bit dtype rounds it by up to half a unit, so two correct
    implementations can differ by one; on a handful of elements (hypothesis shrinks to
    Sq = Sk = 2, head dim 1) PyTorch's own error can land far below that by luck, and
    twice it is no bound. The bounds take the larger of the two: on the regular sweep
    PyTorch's error is already of this size, so the factor decides there.
    """
    if dtype == torch.float32 or reference.numel() == 0:
        return 0.0
    return torch.finfo(dtype).eps * reference.abs().max().item()


def probs_rounding_floor(q: Tensor, k: Tensor, v: Tensor, softmax_scale: float | None, causal: bool,
                         **ref_options: object) -> float:
    """The error that storing the probabilities in q's dtype before P V (as every 16-bit kernel
    and PyTorch's own run do) leaves in out: each p_ij is rounded by up to half a unit,
    independently, so out[i, d] moves with a standard deviation of about eps / (2 sqrt 3) times
    ||p_i* v_*d||_2, the 2-norm over the keys of the terms it sums; the floor is eps times that
    norm at its largest (about 3.5 deviations). It exceeds rounding_floor only where out cancels
    (|out| far below its terms: one query over many keys of mixed sign, head dim 1, which
    hypothesis finds), on so few elements that PyTorch's own rounding can land far below it by
    luck. 0 for fp32 inputs. ref_options: attention_ref's keyword arguments."""
    if q.dtype == torch.float32 or q.numel() == 0 or k.shape[1] == 0:
        return 0.0
    from flashattn.reference import attention_probs

    probs, v_heads, _ = attention_probs(q, k, v, softmax_scale, causal, **ref_options)
    terms_sq = torch.einsum("bhqk,bkhd->bqhd", probs.square(), v_heads.square())
    return torch.finfo(q.dtype).eps * terms_sq.max().sqrt().item()


def grads_rounding_floors(q: Tensor, k: Tensor, v: Tensor, dout: Tensor, softmax_scale: float | None,
                          causal: bool, **ref_options: object) -> tuple[float, float, float]:
    """probs_rounding_floor's counterpart for the gradients (dq, dk, dv): a 16-bit backward (every
    FlashAttention kernel, and PyTorch's own run) rounds P to the input dtype before dV = P^T dO and
    dS = P * (dP - D) before dQ = scale * dS K and dK = scale * dS^T Q, each element by up to half
    a unit, independently. A gradient element then moves with a standard deviation of about
    eps / (2 sqrt 3) times the 2-norm of the terms it sums (for dk and dv over every query row of
    the KV head's query heads); the floor is eps times that norm at its largest (about 3.5
    deviations). It exceeds rounding_floor only where the gradient cancels (|dk| far below its
    terms: hypothesis found dk 0.0103 against 0.00987 at head dim 1, 444 query rows over 2 keys),
    on so few elements that PyTorch's own rounding can land far below it by luck. Dropout left
    out (its kept P is at most P / (1 - p)); softcap's chain factor 1 - tanh^2 taken into dS.
    0 for fp32 inputs. ref_options: attention_ref's keyword arguments."""
    if q.dtype == torch.float32 or q.numel() == 0 or k.shape[1] == 0:
        return 0.0, 0.0, 0.0
    from flashattn.reference import attention_probs

    options = {name: value for name, value in ref_options.items() if not name.startswith("dropout")}
    q32, k32, v32, dout32 = (t.float() for t in (q, k, v, dout))
    probs, v_heads, _ = attention_probs(q32, k32, v32, softmax_scale, causal, **options)  # [B, H, Sq, Sk]
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    group = q.shape[2] // k.shape[2]
    k_heads = k32.repeat_interleave(group, dim=2)
    out = torch.einsum("bhqk,bkhd->bqhd", probs, v_heads)
    d_rows = (dout32 * out).sum(dim=-1).transpose(1, 2).unsqueeze(-1)  # D, [B, H, Sq, 1]
    ds = probs * (torch.einsum("bqhd,bkhd->bhqk", dout32, v_heads) - d_rows)
    softcap = float(options.get("softcap", 0.0) or 0.0)
    if softcap > 0:
        capped = torch.tanh(torch.einsum("bqhd,bkhd->bhqk", q32, k_heads) * (scale / softcap))
        ds = ds * (1 - capped.square())
    eps = torch.finfo(q.dtype).eps

    def kv_heads(x: Tensor) -> Tensor:  # [B, Sk, H, D] summed over each KV head's query heads
        return x.reshape(*x.shape[:2], k.shape[2], group, x.shape[-1]).sum(dim=3)

    dq_sq = torch.einsum("bhqk,bkhd->bqhd", ds.square(), k_heads.square())
    dk_sq = kv_heads(torch.einsum("bhqk,bqhd->bkhd", ds.square(), q32.square()))
    dv_sq = kv_heads(torch.einsum("bhqk,bqhd->bkhd", probs.square(), dout32.square()))
    return (eps * scale * dq_sq.max().sqrt().item(), eps * scale * dk_sq.max().sqrt().item(),
            eps * dv_sq.max().sqrt().item())


def grad_eps(softmax_scale: float, head_dim: int) -> float:
    """GRAD_EPS, for a scale that makes dP = dO v^T and dq, dk = scale * (dS k, dS^T q) larger
    than the default scale 1/sqrt(headdim) does, scaled up alike."""
    return GRAD_EPS * max(1.0, softmax_scale * math.sqrt(head_dim))


def output_bound(lowp_error: float, floor: float = 0.0, eps: float = OUT_EPS) -> float:
    """The largest error an output (out, or the LSE with eps=LSE_EPS) may have: OUT_FACTOR
    times lowp_error, PyTorch's own same-dtype error, at least floor (rounding_floor), plus eps."""
    return max(OUT_FACTOR * lowp_error, floor) + eps


def grad_bound(lowp_error: float, floor: float = 0.0, inherited: float = 0.0, eps: float = GRAD_EPS) -> float:
    """The largest error a gradient may have: GRAD_FACTOR times lowp_error, PyTorch's own
    same-dtype error, at least floor (rounding_floor), plus the error it inherits from the
    forward's out (0 for dv), plus eps (grad_eps for another softmax_scale)."""
    return max(GRAD_FACTOR * lowp_error, floor) + inherited + eps


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now: the rendezvous of spawned ranks
    (init_method=f"tcp://127.0.0.1:{port}"), on this machine only."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
