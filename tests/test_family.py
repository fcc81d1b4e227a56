"""Which kernel family serves a GPU (csrc/api/family.h): chosen from the compute
capability, forced with FLASHATTN_FAMILY, and visible in the kernels that run."""
import os
import subprocess
import sys

import pytest
import torch

import flashattn

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


def run_with_family(value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "FLASHATTN_FAMILY"}
    if value is not None:
        env["FLASHATTN_FAMILY"] = value
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def kernels_run_by(fn) -> list[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [event.name for event in prof.events() if event.device_type == torch.autograd.DeviceType.CUDA]


def test_every_gpu_gets_the_sm80_family_today():
    assert flashattn.kernel_family() == "sm80"
    assert flashattn.kernel_family(torch.device("cuda", torch.cuda.current_device())) == "sm80"


def test_the_forward_and_backward_run_the_family_kernels():
    family = flashattn.kernel_family()
    q, k, v = (torch.randn(2, 300, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    names = kernels_run_by(lambda: flashattn.flash_attn_func(q, k, v, causal=True).sum().backward())
    ours = [name for name in names if "flash::" in name]
    assert any(f"flash::{family}::fwd_kernel" in name for name in ours), names
    assert any(f"flash::{family}::bwd_dk_dv_kernel" in name for name in ours), names
    assert all(f"flash::{family}::" in name for name in ours), ours


@pytest.mark.parametrize("value", [None, "auto", "sm80"])
def test_flashattn_family_selects_a_family(value):
    assert run_with_family(value) == "family sm80"


def test_an_unknown_family_is_a_clear_error():
    out = run_with_family("sm75")
    assert out.startswith("ValueError") and "FLASHATTN_FAMILY=sm75" in out and "sm80" in out, out
