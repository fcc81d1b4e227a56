"""Long contexts on the GPU, checked against the fp32 reference where it is affordable.

    python scripts/long_context.py OUTDIR [--train-seqlens 262144] [--forward-seqlens 1048576] [--dtype bf16]

B=1, H=8, D=128, causal and not: forward + backward at each --train-seqlens
length, forward only at each --forward-seqlens length (the defaults are issue
7's: 256k trains, 1M forward). Each run calls torch.ops.flashattn.fwd (what
flash_attn_func runs on such inputs, with the LSE) and its backward once, timed
with CUDA events after a warm-up on a small input, with its peak memory above
the inputs, and is checked:

* out and LSE on sampled query rows of every head: a row's reference needs only
  that row's scores, so attention_ref (flashattn/reference.py) runs on the row
  against the keys it sees (a prefix, under the causal mask), in fp32;
* (trained lengths) dq, dk and dv of one head, every row: dk and dv of a key
  sum over every query row that sees it, so attention_ref is differentiated on
  chunks of query rows against the key prefix each chunk sees (which keeps the
  bottom-right causal mask), the chunks' shares of dk and dv summed in fp32.

The bounds are the test suite's (flashattn.testing): at most 2x (outputs) or 3x
(gradients) the error of the same reference computed in the input dtype, plus
the error dq and dk inherit from the forward's rounded out, plus a small eps.
Writes OUTDIR/long_context.md and exits non-zero if a check fails.
"""

import argparse
import datetime as dt
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

import flashattn  # noqa: F401  registers torch.ops.flashattn
from flashattn.reference import attention_ref
from flashattn.testing import LSE_EPS, attention_flops, grad_bound, grad_eps, max_abs_diff, output_bound

ROOT = Path(__file__).resolve().parents[1]
BATCH, HEADS, HEAD_DIM = 1, 8, 128
SAMPLED_ROWS = 16
CHUNK_ROWS = 1024  # query rows per reference chunk of the gradient check: [1024, S] fp32 scores
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Check:
    name: str
    error: float
    bound: float

    @property
    def ok(self) -> bool:
        return self.error <= self.bound  # False for NaN

    def __str__(self) -> str:
        return f"{self.name} {self.error:.2e} <= {self.bound:.2e}" if self.ok else \
            f"**{self.name} {self.error:.2e} > {self.bound:.2e}**"


@dataclass
class Result:
    seqlen: int
    causal: bool
    train: bool
    forward_s: float
    backward_s: float | None
    peak_gib: float
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)


def timed(fn):
    """fn() and its GPU time in seconds."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    result = fn()
    end.record()
    torch.cuda.synchronize()
    return result, start.elapsed_time(end) / 1e3


def sampled_rows(seqlen: int, gen: torch.Generator) -> list[int]:
    """The first and last rows, rows on either side of 128-row tile edges, and random ones."""
    edges = [0, 1, 127, 128, seqlen // 2 - 1, seqlen // 2, seqlen - 129, seqlen - 128, seqlen - 1]
    randoms = torch.randint(0, seqlen, (SAMPLED_ROWS - len(edges),), generator=gen).tolist()
    return sorted(set(edges + randoms))


def check_forward_rows(q, k, v, out, lse, scale, causal, rows) -> list[Check]:
    """out and LSE of the sampled rows, every head, against attention_ref on each row's visible keys."""
    out_err = out_lowp_err = lse_err = lse_lowp_err = 0.0
    for row in rows:
        visible = row + 1 if causal else k.shape[1]  # Sq == Sk: row i sees keys 0..i
        q_row, k_seen, v_seen = q[:, row : row + 1], k[:, :visible], v[:, :visible]
        ref_out, ref_lse = attention_ref(q_row, k_seen, v_seen, scale)
        lowp_out, lowp_lse = attention_ref(q_row, k_seen, v_seen, scale, upcast=False)
        out_err = max(out_err, max_abs_diff(out[:, row : row + 1], ref_out))
        out_lowp_err = max(out_lowp_err, max_abs_diff(lowp_out, ref_out))
        lse_err = max(lse_err, max_abs_diff(lse[:, :, row : row + 1], ref_lse))
        lse_lowp_err = max(lse_lowp_err, max_abs_diff(lowp_lse, ref_lse))
    return [
        Check(f"out ({len(rows)} rows)", out_err, output_bound(out_lowp_err)),
        Check("lse", lse_err, output_bound(lse_lowp_err, eps=LSE_EPS)),
    ]


def reference_head_grads(q, k, v, out, dout, scale, causal, upcast):
    """dq, dk, dv of one head ([1, S, 1, D] each) in fp32, by chunks of query rows; with upcast,
    also the error of dq and dk that comes from D = rowsum(dO * O) taking our rounded out."""
    seqlen = q.shape[1]
    dtype = torch.float32 if upcast else q.dtype
    q, k, v = (t.to(dtype) for t in (q, k, v))
    grads = [torch.zeros(t.shape, dtype=torch.float32, device=t.device) for t in (q, k, v)]
    inherited = [torch.zeros(t.shape, dtype=torch.float32, device=t.device) for t in (q, k)]
    for start in range(0, seqlen, CHUNK_ROWS):
        stop = min(start + CHUNK_ROWS, seqlen)
        visible = stop if causal else seqlen  # the keys the chunk's last row sees
        leaves = (q[:, start:stop].detach().requires_grad_(), k[:, :visible].detach().requires_grad_(),
                  v[:, :visible].detach().requires_grad_())
        ref_out, ref_lse = attention_ref(*leaves, scale, causal, upcast=upcast)
        chunk_grads = torch.autograd.grad(ref_out, leaves, dout[:, start:stop].to(ref_out.dtype), retain_graph=upcast)
        for total, grad, rows in zip(grads, chunk_grads, (slice(start, stop), slice(0, visible), slice(0, visible))):
            total[:, rows] += grad.float()
        if upcast:
            d_error = (dout[:, start:stop].float() * (out[:, start:stop].float() - ref_out.detach())).sum(-1)
            dq_inh, dk_inh = torch.autograd.grad(ref_lse, leaves[:2], d_error.transpose(1, 2))
            inherited[0][:, start:stop] += dq_inh
            inherited[1][:, :visible] += dk_inh
    return grads, inherited


def check_head_grads(q, k, v, out, dout, grads, scale, causal, head) -> list[Check]:
    """Our dq, dk, dv of one head against the chunked reference (MHA: KV head == query head)."""
    one_head = [t[:, :, head : head + 1] for t in (q, k, v, out, dout)]
    ref, inherited = reference_head_grads(*one_head, scale, causal, upcast=True)
    lowp, _ = reference_head_grads(*one_head, scale, causal, upcast=False)
    eps = grad_eps(scale, q.shape[-1])
    checks = []
    for name, grad, want, low, inh in zip(("dq", "dk", "dv"), grads, ref, lowp, (*inherited, None)):
        from_out = inh.abs().max().item() if inh is not None else 0.0
        bound = grad_bound(max_abs_diff(low, want), inherited=from_out, eps=eps)
        checks.append(Check(f"{name} (head {head})", max_abs_diff(grad[:, :, head : head + 1], want), bound))
    return checks


def run_case(seqlen: int, causal: bool, train: bool, dtype: torch.dtype, seed: int) -> Result:
    gen = torch.Generator("cuda").manual_seed(seed)
    q, k, v = (torch.randn(BATCH, seqlen, HEADS, HEAD_DIM, generator=gen, device="cuda", dtype=dtype)
               for _ in range(3))
    dout = torch.randn(q.shape, generator=gen, device="cuda", dtype=dtype) if train else None
    scale = HEAD_DIM**-0.5
    torch.cuda.synchronize()
    inputs_bytes = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    backward_s = grads = None
    if train:
        leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
        (out, lse), forward_s = timed(lambda: torch.ops.flashattn.fwd(*leaves, scale, causal))
        grads, backward_s = timed(lambda: torch.autograd.grad(out, leaves, dout))
        out = out.detach()
    else:
        with torch.no_grad():
            (out, lse), forward_s = timed(lambda: torch.ops.flashattn.fwd(q, k, v, scale, causal))
    peak_gib = (torch.cuda.max_memory_allocated() - inputs_bytes) / 2**30
    result = Result(seqlen, causal, train, forward_s, backward_s, peak_gib)
    rows = sampled_rows(seqlen, torch.Generator().manual_seed(seed))
    result.checks += check_forward_rows(q, k, v, out, lse, scale, causal, rows)
    if train:
        result.checks += check_head_grads(q, k, v, out, dout, grads, scale, causal, head=HEADS - 1)
    return result


def tflops(seqlen: int, causal: bool, seconds: float, pass_: str = "fwd") -> float:
    return attention_flops(BATCH, HEADS, seqlen, HEAD_DIM, causal, pass_) / seconds / 1e12


def markdown(results: list[Result], dtype_name: str) -> str:
    props = torch.cuda.get_device_properties(0)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip() or "unknown"
    except OSError:
        commit = "unknown"
    lines = [
        "# Long contexts",
        "",
        f"{props.name}, torch {torch.__version__}, CUDA {torch.version.cuda}, commit {commit}, "
        f"{dt.date.today().isoformat()}. B={BATCH}, H={HEADS}, D={HEAD_DIM}, {dtype_name}; "
        "`python scripts/long_context.py OUTDIR`.",
        "",
        "| S | causal | passes | forward | backward | peak memory above inputs | checks (max error <= bound) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        forward = f"{r.forward_s * 1e3:.0f} ms ({tflops(r.seqlen, r.causal, r.forward_s):.0f} TFLOP/s)"
        backward = (f"{r.backward_s * 1e3:.0f} ms ({tflops(r.seqlen, r.causal, r.backward_s, 'bwd'):.0f} TFLOP/s)"
                    if r.backward_s is not None else "-")
        lines.append(f"| {r.seqlen} | {'yes' if r.causal else 'no'} | {'fwd + bwd' if r.train else 'fwd'} | "
                     f"{forward} | {backward} | {r.peak_gib:.2f} GiB | {'; '.join(map(str, r.checks))} |")
    verdict = "all checks pass" if all(r.ok for r in results) else "**SOME CHECKS FAIL**"
    lines += ["", f"{verdict}. Rows checked per run: {SAMPLED_ROWS} sampled rows (tile edges, ends, random) of "
              f"every head for out and LSE; every row of head {HEADS - 1} for dq, dk, dv.", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--train-seqlens", type=int, nargs="*", default=[262144])
    parser.add_argument("--forward-seqlens", type=int, nargs="*", default=[1048576])
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("long_context.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    dtype = DTYPES[args.dtype]
    for causal in (False, True):  # warm-up: every kernel the runs use, loaded
        leaves = [torch.randn(1, 300, HEADS, HEAD_DIM, device="cuda", dtype=dtype, requires_grad=True)
                  for _ in range(3)]
        out, _ = torch.ops.flashattn.fwd(*leaves, HEAD_DIM**-0.5, causal)
        torch.autograd.grad(out, leaves, torch.ones_like(out))
    plan = [(s, causal, True) for s in args.train_seqlens for causal in (False, True)]
    plan += [(s, causal, False) for s in args.forward_seqlens for causal in (False, True)]
    results = []
    for seed, (seqlen, causal, train) in enumerate(plan):
        result = run_case(seqlen, causal, train, dtype, seed)
        print(f"S={seqlen} causal={causal} {'fwd+bwd' if train else 'fwd'}: forward {result.forward_s:.2f} s"
              + (f", backward {result.backward_s:.2f} s" if result.backward_s is not None else "")
              + f", peak {result.peak_gib:.2f} GiB; " + "; ".join(map(str, result.checks)), flush=True)
        results.append(result)
        torch.cuda.empty_cache()
    args.outdir.mkdir(parents=True, exist_ok=True)
    table = markdown(results, args.dtype)
    (args.outdir / "long_context.md").write_text(table)
    print(table)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
