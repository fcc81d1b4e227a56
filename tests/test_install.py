"""Issue 17: flashattn installs like a library and refuses what it would otherwise take silently.

The build's decisions (setup.py's kernel_plan, where the build facts go, how the
compiler's output becomes progress lines and a spill summary) are checked
without compiling anything; the arguments that used to pass silently (a truthy
string as causal, SDPA's layout) and the rows past cu_seqlens_q[-1] through the
public functions, on CPU and, where there is one, on the GPU.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import DEVICES, poisoned_allocations

from flashattn import _extension, flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

ROOT = Path(__file__).resolve().parents[1]


def _setup_module():
    """setup.py's helpers, without running setup()."""
    spec = importlib.util.spec_from_file_location("flashattn_setup", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- booleans ------------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["causal", "deterministic", "return_attn_probs"])
@pytest.mark.parametrize("value", ["yes", "False", None, 2, 1.0, torch.tensor(True)])
def test_flags_must_be_bools(flag, value):
    q, k, v = (torch.randn(1, 5, 2, 16) for _ in range(3))
    with pytest.raises(TypeError, match=rf"flashattn: {flag} must be a bool \(True or False\), got"):
        flash_attn_func(q, k, v, **{flag: value})


@pytest.mark.parametrize("value", [True, False, 0, 1])
def test_bools_and_0_1_are_accepted(value):
    """What FlashAttention-2's callers pass: bools, and ints 0/1 (C++ reads them as bool)."""
    q, k, v = (torch.randn(1, 5, 2, 16) for _ in range(3))
    out = flash_attn_func(q, k, v, causal=value, deterministic=value)
    assert torch.equal(out, flash_attn_func(q, k, v, causal=bool(value)))


@pytest.mark.parametrize("flag", ["causal", "rotary_interleaved"])
def test_kvcache_flags_must_be_bools(flag):
    q = torch.randn(1, 1, 2, 16)
    k_cache, v_cache = torch.randn(1, 8, 2, 16), torch.randn(1, 8, 2, 16)
    with pytest.raises(TypeError, match=rf"flashattn: {flag} must be a bool"):
        flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=4, **{flag: "yes"})


# --- SDPA's layout -------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_sdpa_layout_is_named(device):
    """q, k, v in SDPA's (B, H, S, D): the heads error says so, naming q, on both implementations."""
    q = torch.randn(2, 8, 100, 64, device=device, dtype=torch.bfloat16)  # (B, H, Sq, D)
    k, v = (torch.randn(2, 2, 37, 64, device=device, dtype=torch.bfloat16) for _ in range(2))  # (B, Hk, Sk, D)
    with pytest.raises(ValueError) as info:
        flash_attn_func(q, k, v)
    message = str(info.value)
    assert "the number of query heads (q.shape[2] = 100)" in message
    assert (
        "q looks like SDPA's (batch, nheads, seqlen, headdim) layout (q.shape[1] = 8 heads, k.shape[1] = 2): "
        "flashattn takes (batch, seqlen, nheads, headdim), e.g. q.transpose(1, 2)"
    ) in message


def test_heads_error_without_an_sdpa_reading_has_no_hint():
    q = torch.randn(2, 7, 6, 16)
    k, v = torch.randn(2, 7, 4, 16), torch.randn(2, 7, 4, 16)  # 7 % 7 == 0, but 6 % 4 != 0: read as (B, H, S, D)
    with pytest.raises(ValueError, match="SDPA"):
        flash_attn_func(q, k, v)
    k, v = torch.randn(2, 5, 4, 16), torch.randn(2, 5, 4, 16)  # 7 % 5 != 0 as well: no SDPA reading
    with pytest.raises(ValueError) as info:
        flash_attn_func(q, k, v)
    assert "SDPA" not in str(info.value)


# --- rows past cu_seqlens_q[-1] ------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_rows_past_the_last_sequence_are_zero(device):
    """A packed batch padded past cu_seqlens[-1] (as serving stacks pad for CUDA graphs) is
    accepted; those rows' out and gradients are 0, the sequences' rows as without padding."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    cu = torch.tensor([0, 5, 12], dtype=torch.int32, device=device)
    total, padded = 12, 20
    q, k, v = (torch.randn(padded, 4, 32, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    with poisoned_allocations():
        out = flash_attn_varlen_func(q, k, v, cu, cu, 7, 7, causal=True)
        out.backward(torch.randn_like(out))
    assert torch.equal(out[total:], torch.zeros_like(out[total:]))
    for grad in (q.grad, k.grad, v.grad):
        assert torch.equal(grad[total:], torch.zeros_like(grad[total:]))
    expected = flash_attn_varlen_func(q[:total], k[:total], v[:total], cu, cu, 7, 7, causal=True)
    assert torch.equal(out[:total], expected)


# --- the build -----------------------------------------------------------------------------------


def _plan(**changes):
    facts = dict(skip=False, torch_version="2.14.1+cu130", torch_cuda="13.0", cuda_home="/usr/local/cuda",
                 arch_list=None, gpu_count=1)
    return _setup_module().kernel_plan(**{**facts, **changes})


def test_kernel_plan():
    """Kernels only where they can be built and run; otherwise why, and the one command."""
    assert _plan() == (True, "")
    assert _plan(gpu_count=0, arch_list="9.0a") == (True, "")  # a login node building for a chosen GPU
    cases = {
        "FLASHATTN_SKIP_CUDA_BUILD=1": _plan(skip=True),
        "no torch was installed when flashattn was built": _plan(torch_version=None, torch_cuda=None),
        "is a CPU-only build": _plan(torch_version="2.13.0+cpu", torch_cuda=None),
        "no CUDA toolkit found": _plan(cuda_home=None),
        "no GPU visible and TORCH_CUDA_ARCH_LIST unset": _plan(gpu_count=0),
    }
    for expected, (build, why) in cases.items():
        assert not build and expected in why, why
    for _, why in list(cases.values())[1:]:
        assert "pip install -v --force-reinstall --no-deps --no-cache-dir SOURCE" in why


def test_pyproject_never_requires_torch_to_build():
    """A torch in build-system.requires is what pip's build isolation downloads (the newest one)."""
    text = (ROOT / "pyproject.toml").read_text()
    requires = text[text.index("[build-system]") : text.index("[project]")]
    assert "torch" not in requires.split("requires =")[1].split("]")[0]
    assert '"numpy"' in text[text.index("dependencies") :].split("]")[0]  # python -m flashattn.explain


def test_build_info_lives_beside_the_extension():
    setup = _setup_module()
    path = setup._build_info_path("/site/flashattn/_C.cpython-312-x86_64-linux-gnu.so")
    assert path == Path("/site/flashattn/_C.cpython-312-x86_64-linux-gnu.json")
    source = (ROOT / "setup.py").read_text()
    assert '"flashattn" / "_build_info' not in source and "_build_info.py" not in source


def test_a_python_only_build_writes_nothing_into_the_package(tmp_path):
    """Building (FLASHATTN_SKIP_CUDA_BUILD=1, as any CPU-only install) changes no file in flashattn/."""
    before = {p: p.stat().st_mtime_ns for p in (ROOT / "flashattn").rglob("*") if "__pycache__" not in p.parts}
    env = {**os.environ, "FLASHATTN_SKIP_CUDA_BUILD": "1"}
    result = subprocess.run([sys.executable, "setup.py", "-q", "build", "--build-base", str(tmp_path)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    after = {p: p.stat().st_mtime_ns for p in (ROOT / "flashattn").rglob("*") if "__pycache__" not in p.parts}
    assert after == before
    assert "without CUDA kernels (CPU tensors work): FLASHATTN_SKIP_CUDA_BUILD=1" in result.stdout


def test_compile_monitor_reports_progress_and_spills(tmp_path, capfd):
    """ninja's lines become '[k/n] file, elapsed, about ... left' on the terminal; every line goes to
    the log; spill warnings are counted per file and not printed."""
    setup = _setup_module()
    lines = [
        "[1/2] /usr/local/cuda/bin/nvcc -c /src/csrc/instantiations/sm80_fwd_bf16_hdim64.cu -o a.o\n",
        "ptxas warning : Registers are spilled to local memory in function '_Z3fwdv', 8 bytes spill stores\n",
        "[2/2] /usr/local/cuda/bin/nvcc -c /src/csrc/instantiations/sm80_bwd_bf16_hdim64.cu -o b.o\n",
        "/src/csrc/sm80/x.cuh(3): error: something\n",
    ]
    with open(tmp_path / "compile.log", "w") as log:
        with setup.CompileMonitor(log, "sm80 kernels") as monitor:
            for line in lines:
                os.write(1, line.encode())
    terminal = capfd.readouterr().out
    assert (tmp_path / "compile.log").read_text() == "".join(lines)
    assert "flashattn build: sm80 kernels [1/2] " in terminal and "sm80_fwd_bf16_hdim64.cu" in terminal
    assert "elapsed, about" in terminal and "[2/2]" in terminal
    assert "error: something" in terminal and "Registers are spilled" not in terminal
    assert monitor.compiled == 2
    assert [(Path(f).name, k) for f, k in monitor.spills.items()] == [("sm80_fwd_bf16_hdim64.cu", ["_Z3fwdv"])]


# --- what the installed package says -------------------------------------------------------------


def test_build_command_names_what_was_installed(monkeypatch):
    """The hint's command reinstalls from where flashattn came from (pip's direct_url.json)."""
    cases = {
        '{"url": "file:///home/me/flashattn", "dir_info": {"editable": true}}':
            "pip install -v --no-build-isolation --no-deps -e /home/me/flashattn",
        '{"url": "file:///home/me/flashattn", "dir_info": {}}':
            "pip install -v --force-reinstall --no-deps --no-cache-dir /home/me/flashattn",
        '{"url": "https://github.com/o/flashattn", "vcs_info": {"vcs": "git", "commit_id": "abc"}}':
            "pip install -v --force-reinstall --no-deps --no-cache-dir git+https://github.com/o/flashattn@abc",
    }
    for direct_url, command in cases.items():
        dist = type("Dist", (), {"read_text": lambda self, name, text=direct_url: text})()
        monkeypatch.setattr(_extension.importlib.metadata, "distribution", lambda name, d=dist: d)
        assert _extension.build_command() == command


def test_import_never_fails_and_cpu_works():
    """However the kernels stand, import flashattn works and CPU tensors run."""
    code = (
        "import torch, flashattn\n"
        "q = torch.randn(1, 3, 2, 8)\n"
        "print(flashattn.flash_attn_func(q, q, q).shape)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True, timeout=120,
                            env=env)
    assert result.returncode == 0, result.stderr
    assert "torch.Size([1, 3, 2, 8])" in result.stdout

