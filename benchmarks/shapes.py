"""What is measured: dtypes, passes, the sweep's sizes, one result row, one shape and the sweep of them."""
from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
PASSES = ("fwd", "bwd", "fwdbwd")
PASS_TITLES = {"fwd": "forward", "bwd": "backward", "fwdbwd": "forward + backward"}

# The sweep of the FlashAttention papers: a fixed token count and model width,
# so that every row moves the same amount of Q/K/V/O through memory.
SWEEP_TOKENS = 16384
SWEEP_MODEL_DIM = 2048
SWEEP_HEADDIMS = (64, 128, 256)
SWEEP_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)

# CPU configs: flashattn's blockwise CPU path is the readable statement of the
# algorithm, not a fast kernel, so the CPU sizes only check the path and the tools.
CPU_BATCH, CPU_HEADS, CPU_HEADDIM = 1, 8, 64

GPU_BACKENDS = ("flashattn", "flashattn_det", "flash", "cudnn", "fa4", "fa3", "efficient", "naive")
# Timed only when --backends names them: flashattn with deterministic=True (its backward).
OPT_IN_BACKENDS = ("flashattn_det",)
DEFAULT_GPU_BACKENDS = tuple(b for b in GPU_BACKENDS if b not in OPT_IN_BACKENDS)
CPU_BACKENDS = ("flashattn", "naive")
# Names for plots and prose; the tables keep the short keys.
BACKEND_LABELS = {"flashattn": "flashattn", "flashattn_det": "flashattn deterministic", "flash": "SDPA flash",
                  "cudnn": "SDPA cuDNN", "fa4": "FlashAttention-4", "fa3": "FlashAttention-3",
                  "efficient": "SDPA efficient", "naive": "naive"}


@dataclass
class Shape:
    """One benchmarked configuration; it makes the rows of its backends."""
    device: str
    dtype: str
    causal: bool
    batch: int
    heads: int
    seqlen: int
    headdim: int

    def row(self, backend, pass_, kind="speed"):
        return Row(self.device, self.dtype, self.causal, self.batch, self.heads, self.seqlen, self.headdim,
                   backend, kind, pass_)

    def inputs(self, count=3):
        """q, k, v (and dout with count=4), each [B, S, H, D], flash_attn_func's layout, seeded by the shape."""
        gen = torch.Generator(device=self.device).manual_seed(self.seqlen + self.headdim)
        size = (self.batch, self.seqlen, self.heads, self.headdim)
        return [torch.randn(size, generator=gen, device=self.device, dtype=DTYPES[self.dtype]) for _ in range(count)]

    @property
    def label(self):
        return (f"B={self.batch} S={self.seqlen} H={self.heads} D={self.headdim} {self.dtype} "
                f"{'causal' if self.causal else 'non-causal'}")


@dataclass
class Row(Shape):
    """One measurement of a shape; its fields are the CSV's columns (kind first, see benchmarks.tables)."""
    backend: str
    kind: str = "speed"       # "speed" or "memory"
    pass_: str = "fwd"        # fwd | bwd | fwdbwd; the CSV column "pass"
    status: str = "ok"        # ok | n/a | OOM | mismatch | error
    median_ms: float | None = None
    tflops: float | None = None
    max_abs_diff: float | None = None
    peak_mem_bytes: int | None = None   # memory rows: the inputs' bytes + extra_mem_bytes
    extra_mem_bytes: int | None = None  # memory rows: the call's peak above what was allocated before it
    call_ms: float | None = None        # memory rows: wall time of the one measured call, not a benchmark
    notes: str = ""


@dataclass(frozen=True)
class Sweep:
    """The speed sweep: every config (dtype x causal x head dim x sequence length), pass and backend.

    GPU configs keep B*S = tokens and H*D = model_dim, the FlashAttention
    papers' sweep; CPU configs are B = CPU_BATCH, H = CPU_HEADS.
    """
    dtypes: tuple
    causal: tuple
    headdims: tuple
    seqlens: tuple
    passes: tuple
    backends: tuple = DEFAULT_GPU_BACKENDS
    tokens: int = SWEEP_TOKENS
    model_dim: int = SWEEP_MODEL_DIM

    def shapes(self, device):
        """[(progress label, Shape)] of every config, in table order."""
        configs = []
        for dtype in self.dtypes:
            for causal in self.causal:
                for headdim in self.headdims:
                    for seqlen in self.seqlens:
                        if device == "cuda":
                            batch, heads = max(1, self.tokens // seqlen), max(1, self.model_dim // headdim)
                        else:
                            batch, heads = CPU_BATCH, CPU_HEADS
                        configs.append((f"{dtype} causal={causal} D={headdim} S={seqlen}",
                                        Shape(device, dtype, causal, batch, heads, seqlen, headdim)))
        return configs
