"""What the suite measures, per machine and mode: every size of every section, in one place.

GPU time is scarce, so the GPU sizes are chosen for it: on an H100 the full
plan should take about 9 minutes and --quick about 2.5, besides building flashattn (since round 43
every measurement starts with 200 ms of warm-up calls: benchmarks/timing.py, HEAT_MS).

GPU, full:
- speed: bf16, B*S = 16k tokens and H*D = 2048, D 64/128/256, S 512..16k,
  causal and not; forward, backward, forward + backward; flashattn, SDPA
  flash, cuDNN, efficient, naive: 36 configs of about 12 s each (do_bench runs
  each measurement for a fixed time; the quick plan's 8 configs took 93 s on an H200 in
  round 43).
- memory: B=1 H=8 D=128 bf16 causal, S 1k..64k doubling, for naive, SDPA flash
  and flashattn; then the probe: flashattn alone, doubling S up to 1M (the
  longest forward scripts/long_context.py checks at H=8) while the next call,
  predicted at 4x the last one, fits a budget of 30 s of calls per pass.
- regimes: B 1/4/16 x S 512/1k/2k/4k, H=16 D=128 bf16 causal, a training
  step of flashattn, SDPA flash and naive.
- profile: one training step at B=4 S=2048 H=16 D=128 bf16 causal, naive and
  flashattn.

GPU, --quick: the speed sweep at D 64/128 and S 2k/8k only (8 configs), a 10 s
probe budget per pass, regimes at B 1/16 x S 512/4k.

CPU: fp32, H=8, D=64; S up to 512 (speed), 2k (memory), 512 (regimes, B 1/4);
with --quick up to 256, 512 and 256. No probe and no profile.
"""
from dataclasses import dataclass, replace

from benchmarks.shapes import CPU_BACKENDS, CPU_HEADDIM, CPU_HEADS, PASSES, Shape, Sweep


@dataclass(frozen=True)
class Model:
    """An attention shape but for its batch and sequence length."""
    device: str
    heads: int
    headdim: int
    dtype: str
    causal: bool

    def shape(self, batch, seqlen):
        return Shape(self.device, self.dtype, self.causal, batch, self.heads, seqlen, self.headdim)


@dataclass(frozen=True)
class MemoryPlan:
    """Peak memory at B=1 over seqlens for every backend; on the GPU flashattn then goes on
    doubling S (the probe) while the next call, predicted at 4x the last one, fits
    probe_budget_s, up to probe_max_seqlen."""
    model: Model
    seqlens: tuple
    probe_budget_s: float | None = None
    probe_max_seqlen: int | None = None


@dataclass(frozen=True)
class RegimePlan:
    """A training step of every (batch, sequence length): time and peak memory."""
    model: Model
    batches: tuple
    seqlens: tuple


@dataclass(frozen=True)
class Plan:
    estimate: str                  # the expected wall time, printed when the run starts
    speed: Sweep
    memory: MemoryPlan
    regimes: RegimePlan
    profile: Shape | None    # None: no CUDA kernels to profile
    cpu_budget_s: float = 0.0      # CPU: seconds of timed calls per measurement (3 calls at least)


GPU_FULL = Plan(
    estimate="about 9 minutes on an H100",
    speed=Sweep(dtypes=("bf16",), causal=(False, True), headdims=(64, 128, 256),
                      seqlens=(512, 1024, 2048, 4096, 8192, 16384), passes=PASSES),
    memory=MemoryPlan(Model("cuda", heads=8, headdim=128, dtype="bf16", causal=True),
                      seqlens=(1024, 2048, 4096, 8192, 16384, 32768, 65536),
                      probe_budget_s=30.0, probe_max_seqlen=2**20),
    regimes=RegimePlan(Model("cuda", heads=16, headdim=128, dtype="bf16", causal=True),
                       batches=(1, 4, 16), seqlens=(512, 1024, 2048, 4096)),
    profile=Model("cuda", heads=16, headdim=128, dtype="bf16", causal=True).shape(batch=4, seqlen=2048),
)

GPU_QUICK = replace(
    GPU_FULL,
    estimate="about 2.5 minutes on an H100",
    speed=replace(GPU_FULL.speed, headdims=(64, 128), seqlens=(2048, 8192)),
    memory=replace(GPU_FULL.memory, probe_budget_s=10.0),
    regimes=replace(GPU_FULL.regimes, batches=(1, 16), seqlens=(512, 4096)),
)

CPU_MODEL = Model("cpu", heads=CPU_HEADS, headdim=CPU_HEADDIM, dtype="fp32", causal=True)

CPU_FULL = Plan(
    estimate="a minute or two",
    speed=Sweep(dtypes=("fp32",), causal=(False, True), headdims=(CPU_HEADDIM,),
                seqlens=(256, 512), passes=PASSES, backends=CPU_BACKENDS),
    memory=MemoryPlan(CPU_MODEL, seqlens=(256, 512, 1024, 2048)),
    regimes=RegimePlan(CPU_MODEL, batches=(1, 4), seqlens=(256, 512)),
    profile=None,
    cpu_budget_s=0.3,
)

CPU_QUICK = replace(
    CPU_FULL,
    estimate="under a minute",
    speed=replace(CPU_FULL.speed, seqlens=(128, 256)),
    memory=replace(CPU_FULL.memory, seqlens=(128, 256, 512)),
    regimes=replace(CPU_FULL.regimes, seqlens=(128, 256)),
    cpu_budget_s=0.0,
)


def make_plan(device, quick):
    if device == "cuda":
        return GPU_QUICK if quick else GPU_FULL
    return CPU_QUICK if quick else CPU_FULL
