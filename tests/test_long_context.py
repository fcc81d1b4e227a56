"""scripts/long_context.py: its chunked reference on CPU (CI), and the long-context run itself (GPU, slow).

scripts/gpu_round.sh runs the script directly and keeps its Markdown; the slow
test is for running it as part of pytest (`pytest -m slow`).
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import case_seed, random_qkv, reference_grads

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "long_context.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("long_context", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_chunked_reference_is_the_reference(causal):
    """The script's gradients by chunks of query rows (each against the key prefix it sees)
    are attention_ref's gradients; and its checks pass flashattn's CPU path and fail a
    gradient that is off."""
    script = _load_script()
    script.CHUNK_ROWS = 64  # several chunks, the last one partial
    scale = script.HEAD_DIM**-0.5
    q, k, v = random_qkv(1, 300, 300, script.HEADS, script.HEADS, script.HEAD_DIM, torch.bfloat16, "cpu",
                         case_seed("long context", causal))
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(1), dtype=q.dtype)
    leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
    out, lse = torch.ops.flashattn.fwd(*leaves, scale, causal)
    grads = torch.autograd.grad(out, leaves, dout)
    out = out.detach()

    head = [t[:, :, -1:] for t in (q, k, v, out, dout)]
    chunked, _ = script.reference_head_grads(*head, scale, causal, upcast=True)
    whole = reference_grads(*(t.float() for t in (*head[:3], head[4])), scale, causal, upcast=True)
    for got, want in zip(chunked, whole):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)

    rows = script.sampled_rows(300, torch.Generator().manual_seed(0))
    checks = script.check_forward_rows(q, k, v, out, lse, scale, causal, rows)
    checks += script.check_head_grads(q, k, v, out, dout, grads, scale, causal, head=script.HEADS - 1)
    assert all(check.ok for check in checks), [str(check) for check in checks]
    off = (grads[0], grads[1], grads[2] * 1.1)
    assert not script.check_head_grads(q, k, v, out, dout, off, scale, causal, head=script.HEADS - 1)[2].ok


@pytest.mark.gpu
@pytest.mark.slow
def test_long_contexts(tmp_path):
    """B=1, H=8, D=128: S=262144 forward + backward and S=1048576 forward, causal and not,
    checked on sampled rows and one head's gradients (about a minute on an H100)."""
    result = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    assert "all checks pass" in (tmp_path / "long_context.md").read_text()
