"""Which kernel family serves a GPU (csrc/api/family.h): chosen from the compute
capability, forced with FLASHATTN_FAMILY, and visible in the kernels that run.

A 9.x GPU runs the sm90 family when the build includes 9.0a: its forward kernels
(namespace flash::sm90::) serve what csrc/sm90/sm90.h's serves() accepts, and
everything else (ALiBi, dropout, head dims up to 32, ...) runs on the sm80 family's
kernels (flash::sm80::) on the same GPU. FLASHATTN_FAMILY=sm80 forces sm80. The sm90
backward's main kernel serves what serves_bwd() accepts; its row-wise passes
(preprocess, dQ conversion) and the backwards it does not serve are sm80's."""
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile

import pytest
import torch

import flashattn
from flashattn._extension import BUILD_INFO
from helpers import assert_grads_match_reference, case_seed, random_qkv, run_backward

pytestmark = pytest.mark.gpu

SCRIPT = """
import torch, flashattn
q = torch.randn(1, 64, 2, 64, device="cuda", dtype=torch.float16)
try:
    flashattn.flash_attn_func(q, q, q)
    print("family", flashattn.kernel_family())
except ValueError as err:
    print("ValueError", err)
torch.cuda.synchronize()
"""

# Prints the namespaces of the forward kernels one call runs (one line: sorted, space-separated).
FORWARD_KERNELS_SCRIPT = """
import torch, flashattn
q, k, v = (torch.randn(2, 300, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
flashattn.flash_attn_func(q, k, v, causal=True)  # warm-up: module load outside the profile
torch.cuda.synchronize()
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    flashattn.flash_attn_func(q, k, v, causal=True)
    torch.cuda.synchronize()
names = {e.name.split("fwd_kernel")[0].split()[-1] for e in prof.events()
         if e.device_type == torch.autograd.DeviceType.CUDA and "fwd_kernel" in e.name}
print(" ".join(sorted(names)))
"""


def sm90_in_build() -> bool:
    arch_list = (BUILD_INFO or {}).get("arch_list", "")
    return any(arch.strip().removesuffix("+PTX") == "9.0a" for arch in arch_list.replace(" ", ";").split(";"))


def default_family() -> str:
    """The family the current GPU gets without FLASHATTN_FAMILY."""
    major = torch.cuda.get_device_capability()[0]
    return "sm90" if major == 9 and sm90_in_build() else "sm80"


def family_env(value: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "FLASHATTN_FAMILY"}
    if value is not None:
        env["FLASHATTN_FAMILY"] = value
    return env


def run_script(script: str, value: str | None) -> str:
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=family_env(value),
                            timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def run_with_family(value: str | None) -> str:
    return run_script(SCRIPT, value)


def kernels_run_by(fn) -> list[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [event.name for event in prof.events() if event.device_type == torch.autograd.DeviceType.CUDA]


def test_the_default_family_follows_the_compute_capability():
    assert flashattn.kernel_family() == default_family()
    assert flashattn.kernel_family(torch.device("cuda", torch.cuda.current_device())) == default_family()


def test_the_forward_and_backward_run_the_family_kernels():
    """The forward runs the family's own kernel; so does the backward's main kernel (this call is
    one sm90's serves_bwd() accepts), whose row-wise passes are sm80's on every family."""
    family = flashattn.kernel_family()
    q, k, v = (torch.randn(2, 300, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    names = kernels_run_by(lambda: flashattn.flash_attn_func(q, k, v, causal=True).sum().backward())
    ours = [name for name in names if "flash::" in name]
    assert any(f"flash::{family}::fwd_kernel" in name for name in ours), names
    main_kernel = "flash::sm90::bwd_kernel" if family == "sm90" else "flash::sm80::bwd_dk_dv_kernel"
    assert any(main_kernel in name for name in ours), names
    assert all(f"flash::{family}::" in name or "flash::sm80::bwd" in name for name in ours), ours


@pytest.mark.parametrize("value", [None, "auto", "sm80"])
def test_flashattn_family_selects_a_family(value):
    assert run_with_family(value) == f"family {default_family() if value in (None, 'auto') else value}"


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9 or not sm90_in_build(),
                    reason="the sm90 family runs on 9.x GPUs of builds that include 9.0a")
@pytest.mark.parametrize("value, namespace", [(None, "flash::sm90::"), ("sm90", "flash::sm90::"),
                                              ("sm80", "flash::sm80::")])
def test_hopper_forward_runs_sm90_kernels_unless_forced(value, namespace):
    """On a 9.x GPU the forward runs the sm90 kernels by default and the sm80 ones under
    FLASHATTN_FAMILY=sm80, so that a test sweep cannot silently test the other family."""
    assert run_script(FORWARD_KERNELS_SCRIPT, value) == namespace


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9 or not sm90_in_build(),
                    reason="the sm90 family runs on 9.x GPUs of builds that include 9.0a")
@pytest.mark.parametrize("case", ["alibi", "dropout", "d32", "softcap", "window", "d256", "d320", "d512"])
def test_sm90_serves_or_delegates(case):
    """What the sm90 forward kernels do not serve (ALiBi, dropout, head dims up to 32 and past 256,
    whose kernel only the sm80 family compiles) runs on sm80's kernels under the sm90 family; softcap,
    windows and every other head dim on sm90's."""
    head_dim = {"d32": 32, "d256": 256, "d320": 320, "d512": 512}.get(case, 64)
    q, k, v = (torch.randn(2, 200, 4, head_dim, device="cuda", dtype=torch.float16) for _ in range(3))
    options = {"alibi": {"alibi_slopes": torch.rand(4, device="cuda")}, "dropout": {"dropout_p": 0.1},
               "softcap": {"softcap": 30.0}, "window": {"window_size": (50, 10)}}.get(case, {})
    names = [n for n in kernels_run_by(lambda: flashattn.flash_attn_func(q, k, v, **options)) if "fwd_kernel" in n]
    expected = "flash::sm80::" if case in ("alibi", "dropout", "d32", "d320", "d512") else "flash::sm90::"
    assert names and all(expected in name for name in names), names


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9 or not sm90_in_build(),
                    reason="the sm90 family runs on 9.x GPUs of builds that include 9.0a")
@pytest.mark.parametrize("mode", ["auto", "tma", "gather", "gather8"])
@pytest.mark.parametrize("page_size, head_dim", [(16, 128), (256, 64), (256, 256), (7, 128), (4, 64), (12, 96)])
def test_sm90_takes_pages_it_can_copy(page_size, head_dim, mode, monkeypatch):
    """Paged keys run on sm90 at any page size where its producer gathers their rows (auto: where a
    key tile would take more than one TMA box per column block; FLASHATTN_SM90_PAGED_COPY=gather:
    always); under FLASHATTN_SM90_PAGED_COPY=tma, only pages whose boxes are whole 8-row swizzle
    atoms (kv_box_rows: page sizes that are multiples of 8), the others on sm80."""
    if flashattn.kernel_family() != "sm90":
        pytest.skip("FLASHATTN_FAMILY forces another family")
    monkeypatch.setenv("FLASHATTN_SM90_PAGED_COPY", mode)
    family = "sm90" if mode != "tma" or page_size % 8 == 0 else "sm80"
    lengths = [150, 40]
    blocks = [-(-n // page_size) for n in lengths]
    q = torch.randn(sum(lengths), 4, head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(sum(blocks), page_size, 2, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    table = torch.arange(sum(blocks), device="cuda", dtype=torch.int32).flip(0)
    table = torch.stack([table[: blocks[0]], torch.nn.functional.pad(table[blocks[0]:], (0, blocks[0] - blocks[1]))])
    cu = torch.tensor([0, lengths[0], sum(lengths)], device="cuda", dtype=torch.int32)
    run = lambda: flashattn.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=True,  # noqa: E731
                                                   block_table=table)
    names = [n for n in kernels_run_by(run) if "fwd_kernel" in n]
    assert names and all(f"flash::{family}::" in name for name in names), names


BACKWARD_CASES = {  # case: (head dim, KV heads of 4 query heads, options); alibi_slopes: drawn per call;
    # varlen: a packed batch's (query lengths, key lengths); head_dim_v: v's head dim (default: q's)
    "d64": (64, 4, {}), "d40": (40, 4, {}), "d128_causal": (128, 4, {"causal": True}),
    "window": (64, 4, {"window_size": (50, 10)}), "gqa": (128, 2, {}), "d96": (96, 4, {}),
    "d80": (80, 4, {}), "d72_causal_gqa": (72, 2, {"causal": True}), "softcap": (64, 4, {"softcap": 30.0}),
    "softcap_window": (128, 2, {"softcap": 30.0, "window_size": (50, 10)}),
    "softcap_d96_causal": (96, 1, {"softcap": 30.0, "causal": True}),
    "softcap_alibi": (64, 4, {"softcap": 30.0, "alibi_slopes": True}), "alibi": (64, 4, {"alibi_slopes": True}),
    "dropout": (64, 4, {"dropout_p": 0.1}), "deterministic": (64, 4, {"deterministic": True}),
    "varlen": (64, 4, {"varlen": ([300, 1, 0, 177], [250, 7, 3, 177])}),
    "varlen_gqa_causal": (128, 2, {"varlen": ([300, 1, 0, 177], [250, 7, 3, 177]), "causal": True}),
    "deterministic_d128_causal_gqa": (128, 2, {"deterministic": True, "causal": True}),
    "varlen_deterministic_causal": (64, 2, {"varlen": ([300, 1, 0, 177], [250, 7, 3, 177]), "causal": True,
                                            "deterministic": True}),
    "softcap_varlen_deterministic": (80, 2, {"varlen": ([300, 1, 0, 177], [250, 7, 3, 177]), "softcap": 30.0,
                                             "causal": True, "deterministic": True}),
    "d192": (192, 4, {}), "d160_causal_gqa": (160, 2, {"causal": True}), "mla": (192, 4, {"head_dim_v": 128}),
    "d256_softcap_window": (256, 1, {"softcap": 30.0, "window_size": (50, 10)}),
    "d224_varlen_causal": (224, 2, {"varlen": ([300, 1, 0, 177], [250, 7, 3, 177]), "causal": True}),
    "d192_deterministic": (192, 4, {"deterministic": True}), "d320": (320, 4, {}),
    "mla_deterministic_causal": (192, 2, {"head_dim_v": 128, "deterministic": True, "causal": True}),
    "d256_varlen_deterministic_window": (256, 2, {"varlen": ([300, 1, 0, 177], [250, 7, 3, 177]),
                                                  "window_size": (50, 10), "deterministic": True}),
}


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9 or not sm90_in_build(),
                    reason="the sm90 family runs on 9.x GPUs of builds that include 9.0a")
@pytest.mark.parametrize("case, family", [("d64", "sm90"), ("d40", "sm90"), ("d128_causal", "sm90"), ("window", "sm90"),
                                          ("gqa", "sm90"), ("d96", "sm90"), ("d80", "sm90"),
                                          ("d72_causal_gqa", "sm90"), ("softcap", "sm90"),
                                          ("softcap_window", "sm90"), ("softcap_d96_causal", "sm90"),
                                          ("varlen", "sm90"), ("varlen_gqa_causal", "sm90"),
                                          ("deterministic", "sm90"), ("deterministic_d128_causal_gqa", "sm90"),
                                          ("varlen_deterministic_causal", "sm90"),
                                          ("softcap_varlen_deterministic", "sm90"),
                                          ("softcap_alibi", "sm80"), ("alibi", "sm80"), ("dropout", "sm80"),
                                          ("d192", "sm90"), ("d160_causal_gqa", "sm90"), ("mla", "sm90"),
                                          ("d256_softcap_window", "sm90"), ("d224_varlen_causal", "sm90"),
                                          ("d192_deterministic", "sm90"), ("mla_deterministic_causal", "sm90"),
                                          ("d256_varlen_deterministic_window", "sm90"), ("d320", "sm80")])
def test_sm90_backward_serves_or_delegates(case, family):
    """The backward's main kernel is sm90's for what serves_bwd() accepts (head dims 33..256, each
    padded up to the next of 64, 128, 192 and 256, MLA's narrower V at 192; causal, windows,
    softcap, GQA, variable lengths, deterministic=True, and these together) and sm80's for the rest
    (ALiBi, dropout, with or without softcap, head dims past 256; FLASHATTN_FAMILY=sm80 forces sm80
    for all:
    test_the_forward_and_backward_run_the_family_kernels in the suite's sm80 pass)."""
    if flashattn.kernel_family() != "sm90":
        pytest.skip("FLASHATTN_FAMILY forces another family")
    head_dim, kv_heads, options = BACKWARD_CASES[case]
    options = dict(options)
    if options.get("alibi_slopes") is True:
        options["alibi_slopes"] = torch.rand(4, device="cuda")
    lengths = options.pop("varlen", None)  # (query lengths, key lengths) of a packed batch
    head_dim_v = options.pop("head_dim_v", head_dim)
    dims = (head_dim, head_dim, head_dim_v)
    if lengths is None:
        q, k, v = (torch.randn(2, 300, heads, dim, device="cuda", dtype=torch.float16, requires_grad=True)
                   for heads, dim in zip((4, kv_heads, kv_heads), dims))
        run = lambda: flashattn.flash_attn_func(q, k, v, **options).sum().backward()  # noqa: E731
    else:
        lengths_q, lengths_k = lengths
        q, k, v = (torch.randn(sum(rows), heads, dim, device="cuda", dtype=torch.float16, requires_grad=True)
                   for (rows, heads), dim in zip(((lengths_q, 4), (lengths_k, kv_heads), (lengths_k, kv_heads)), dims))
        cu_q, cu_k = (torch.tensor([0, *itertools.accumulate(n)], device="cuda", dtype=torch.int32)
                      for n in (lengths_q, lengths_k))
        run = lambda: flashattn.flash_attn_varlen_func(  # noqa: E731
            q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), **options).sum().backward()
    run()  # module load outside the profile
    names = [n for n in kernels_run_by(run) if "bwd_kernel" in n or "bwd_dk_dv" in n]
    assert names and all(f"flash::{family}::" in name for name in names), names


SM90_GRID_Y = 65535  # csrc/sm90/schedule.h: kMaxGridY, the tiles a default backward grid's y holds


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9 or not sm90_in_build(),
                    reason="the sm90 family runs on 9.x GPUs of builds that include 9.0a")
@pytest.mark.parametrize("extra_keys, family", [(0, "sm90"), (1, "sm80")])
def test_sm90_backward_takes_the_key_tiles_its_grid_holds(extra_keys, family):
    """Under a causal mask the sm90 backward's default grid has its key tiles in grid.y (at most 65535
    blocks): a longer sequence runs the sm80 backward (serves_bwd), and both are right. Head dim 192
    has the shortest tiles (64 keys), so the shortest sequence past the limit: 65535 * 64 + 1 keys."""
    if flashattn.kernel_family() != "sm90":
        pytest.skip("FLASHATTN_FAMILY forces another family")
    seqlen_k = SM90_GRID_Y * 64 + extra_keys
    q, k, v = random_qkv(1, 3, seqlen_k, 1, 1, 192, torch.bfloat16, "cuda", case_seed("grid", extra_keys))
    dout = torch.randn_like(q)
    grads = []
    names = [n for n in kernels_run_by(lambda: grads.extend(run_backward(q, k, v, dout, 192**-0.5, causal=True)))
             if "bwd_kernel" in n or "bwd_dk_dv" in n]
    assert names and all(f"flash::{family}::" in name for name in names), names
    assert_grads_match_reference(grads, q, k, v, dout, 192**-0.5, causal=True)


@pytest.mark.slow  # 8.4M query rows at d256: tens of GB of GPU memory for the reference
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9 or not sm90_in_build(),
                    reason="the sm90 family runs on 9.x GPUs of builds that include 9.0a")
@pytest.mark.parametrize("extra_queries, family", [(0, "sm90"), (1, "sm80")])
def test_sm90_backward_takes_the_query_tiles_its_dq_grid_holds(extra_queries, family):
    """At head dim 256 dQ has a kernel over query tiles of 128, under a mask in grid.y: a longer
    sequence of queries runs the sm80 backward, and both are right. The window bounds its right side
    past every key, so that it masks nothing. dout is 0 but in the first and the last 4096 rows (the
    last query tile holds the last of them): dV and dK then sum 8192 rows' terms, not 8.4M (a sum of 8.4M
    terms in one order put sm80's dV 6% past the bound of PyTorch's own pairwise-summed error, round 38)."""
    if flashattn.kernel_family() != "sm90":
        pytest.skip("FLASHATTN_FAMILY forces another family")
    seqlen_q = SM90_GRID_Y * 128 + extra_queries
    q, k, v = random_qkv(1, seqlen_q, 5, 1, 1, 256, torch.bfloat16, "cuda", case_seed("dq grid", extra_queries))
    dout = torch.zeros_like(q)
    dout[:, :4096], dout[:, -4096:] = torch.randn_like(q[:, :4096]), torch.randn_like(q[:, -4096:])
    grads = []
    window = {"window_size": (-1, seqlen_q)}
    names = [n for n in kernels_run_by(lambda: grads.extend(run_backward(q, k, v, dout, 256**-0.5, False, **window)))
             if "bwd_kernel" in n or "bwd_dk_dv" in n or "bwd_dq_kernel" in n]
    assert names and all(f"flash::{family}::" in name for name in names), names
    assert_grads_match_reference(grads, q, k, v, dout, 256**-0.5, False, **window)


def kernel_grids_run_by(fn) -> list[tuple[str, list[int]]]:
    """The CUDA kernels fn() launches with their grids, from the profiler's trace."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as file:
            events = json.load(file)["traceEvents"]
    return [(event["name"], event["args"]["grid"]) for event in events if event.get("cat") == "kernel"]


# The items of the default backward grids without a mask (csrc/sm90/kernel_traits.h): a key tile of
# the d64 and d128 main kernels (BwdTraits, two warpgroups of 64 keys) and of d256's (BwdSliceTraits,
# 80 keys), a query tile of d256's dQ kernel (BwdDqTraits).
SM90_BWD_BLOCK_KEYS = {64: 128, 128: 128, 256: 80}
SM90_DQ_BLOCK_QUERIES = 128


def sm90_tail_split(items: int, before: int, sms: int) -> tuple[int, int]:
    """csrc/sm90/schedule.h: tail_split, the rule this test holds the launcher to: the first item in
    parts and the parts an item."""
    rem = (before + items) % sms
    first, parts, best = items, 1, 1.0
    if 0 < rem <= items:
        for p in range(2, 5):
            wave = -(-rem * p // sms) / p + 0.02 * p
            if wave < best:
                first, parts, best = items - rem, p, wave
    return first, parts


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9 or not sm90_in_build(),
                    reason="the sm90 family runs on 9.x GPUs of builds that include 9.0a")
@pytest.mark.parametrize("head_dim", [64, 100, 128, 256])
@pytest.mark.parametrize("deterministic", [False, True])
def test_sm90_backward_runs_the_last_wave_in_parts(head_dim, deterministic):
    """Without a mask the items of a default backward grid's last wave run in parts (schedule.h:
    TailSplit), a block a part over its share of the item's tiles, handing their sums on in order:
    d64 and d128's main kernel by query tiles (12 items; on 132 SMs four parts, for 3 query tiles:
    one part has none), d256's dQ kernel by key tiles, in both modes (1500 rows: its 72 items behind
    the main kernel's 114; on 132 SMs the last 54 in two parts). The deterministic main kernels never
    split. The grid holds a block a part, the gradients are right, and what the parts hand on is
    added in one order: run twice, dK and dV are bitwise the same (and dQ where no atomics add it:
    d256, and the deterministic mode)."""
    if flashattn.kernel_family() != "sm90":
        pytest.skip("FLASHATTN_FAMILY forces another family")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    kernel_dim = 64 if head_dim <= 64 else 128 if head_dim <= 128 else 256
    if kernel_dim == 256:
        seqlen_q, seqlen_k, heads, kv_heads = 1500, 1500, 6, 6
    else:
        seqlen_q, seqlen_k, heads, kv_heads = 170, 500, 6, 3
    q, k, v = random_qkv(1, seqlen_q, seqlen_k, heads, kv_heads, head_dim, torch.bfloat16, "cuda",
                         case_seed("parts", head_dim, deterministic))
    dout = torch.randn_like(q)
    scale = head_dim**-0.5
    main_items = -(-seqlen_k // SM90_BWD_BLOCK_KEYS[kernel_dim]) * kv_heads
    if kernel_dim == 256:
        kernel, items = "bwd_dq_kernel", -(-seqlen_q // SM90_DQ_BLOCK_QUERIES) * heads
        first, parts = sm90_tail_split(items, main_items, sms)
    else:
        kernel, items = "bwd_kernel", main_items
        first, parts = (items, 1) if deterministic else sm90_tail_split(items, 0, sms)
    if sms == 132:  # what the docstring says of an H100 SXM or H200: the test splits something
        assert parts > 1 or (deterministic and kernel_dim != 256)
    grads = []
    grids = [grid for name, grid in kernel_grids_run_by(
        lambda: grads.extend(run_backward(q, k, v, dout, scale, False, deterministic=deterministic)))
        if f"flash::sm90::{kernel}<" in name]
    assert len(grids) == 1, grids
    assert math.prod(grids[0]) == first + (items - first) * parts, (grids, first, parts)
    assert_grads_match_reference(grads, q, k, v, dout, scale, False)
    again = run_backward(q, k, v, dout, scale, False, deterministic=deterministic)
    reproducible = (0, 1, 2) if deterministic or kernel_dim == 256 else (1, 2)
    assert all(torch.equal(grads[i], again[i]) for i in reproducible)


def test_an_unknown_family_is_a_clear_error():
    out = run_with_family("sm75")
    assert out.startswith("ValueError") and "FLASHATTN_FAMILY=sm75" in out and "sm80" in out, out
