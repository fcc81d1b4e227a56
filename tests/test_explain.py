"""flashattn.explain: the numbers it prints are the ones it claims, and it runs without torch."""

import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from flashattn import explain

EXPLAIN_PY = Path(explain.__file__)
GiB = 2**30
MiB = 2**20
KiB = 2**10


def _scores(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    return k @ q / math.sqrt(q.shape[-1])


@pytest.mark.parametrize("seed", [explain.SEED, 1, 2, 3])
def test_tiled_attention_equals_softmax(seed: int) -> None:
    q, k, v = explain.example(seed)
    out, _ = explain.tiled_attention(q, k, v)
    np.testing.assert_allclose(out, explain.softmax_attention(q, k, v), rtol=0, atol=1e-14)


@pytest.mark.parametrize("seed", [explain.SEED, 1, 2, 3])
def test_tile_steps_hold_the_running_max_sum_and_rescale(seed: int) -> None:
    """Each step's numbers, recomputed from the scores directly rather than incrementally."""
    q, k, v = explain.example(seed)
    _, steps = explain.tiled_attention(q, k, v)
    scores = _scores(q, k)
    assert [(s.first_key, s.last_key) for s in steps] == [
        (first, min(first + explain.TILE, explain.SEQLEN) - 1) for first in range(0, explain.SEQLEN, explain.TILE)
    ]
    previous_max = -math.inf
    for step in steps:
        seen = scores[: step.last_key + 1]
        tile = scores[step.first_key : step.last_key + 1]
        assert step.tile_max == pytest.approx(tile.max(), abs=1e-15)
        assert step.running_max == pytest.approx(seen.max(), abs=1e-15)
        assert step.rescale == pytest.approx(math.exp(previous_max - seen.max()), abs=1e-15)
        assert step.tile_sum == pytest.approx(np.exp(tile - seen.max()).sum(), rel=1e-14)
        assert step.running_sum == pytest.approx(np.exp(seen - seen.max()).sum(), rel=1e-14)
        previous_max = step.running_max


def test_default_example_shows_a_rescale_and_an_unchanged_max() -> None:
    """The printed walk-through is worth reading only if the max both rises and stays put."""
    _, steps = explain.tiled_attention(*explain.example())
    later = steps[1:]
    assert any(step.rescale < 1 for step in later)
    assert any(step.rescale == 1 for step in later)


def test_memory_arithmetic() -> None:
    scores, tiled = explain.memory_items(seqlen=128 * 1024, head_dim=128, block_m=128, block_n=64)
    assert [item.num_bytes for item in scores] == [32 * GiB, 64 * GiB]  # 2^17 * 2^17 * 2 and * 4 bytes
    assert [item.num_bytes for item in tiled] == [32 * MiB, 1 * MiB, 32 * KiB]  # N*d*2, 2*N*4, 128*64*4


def test_format_bytes() -> None:
    assert explain.format_bytes(512) == "512.0 B"
    assert explain.format_bytes(64 * KiB) == "64.0 KiB"
    assert explain.format_bytes(32 * GiB) == "32.0 GiB"
    assert explain.format_bytes(3 * 2**40) == "3.0 TiB"


def test_report_prints_its_claims() -> None:
    text = explain.report()
    assert re.search(r"max abs difference\s+= below 1e-15 \(float64 rounding\)", text)
    assert explain._format_difference(2e-15) == "2.0e-15"  # a real error would show as a number
    assert "32.0 GiB in fp16, 64.0 GiB in fp32" in text
    total = sum(item.num_bytes for item in explain.memory_items()[1])
    assert f"{32 * GiB / total:,.0f}x" in text
    rows = [line for line in text.splitlines() if re.match(r"\s+\d+\s+\d+-\d+\s", line)]
    _, steps = explain.tiled_attention(*explain.example())
    assert len(rows) == len(steps)
    for row, step in zip(rows, steps):
        numbers = [float(x) for x in row.split()[2:7]]
        expected = [step.tile_max, step.running_max, step.rescale, step.tile_sum, step.running_sum]
        assert numbers == pytest.approx(expected, abs=5e-5)


def test_runs_as_a_module_with_the_same_output_every_time() -> None:
    """`python -m flashattn.explain` prints report(), deterministically."""
    runs = [
        subprocess.run(
            [sys.executable, "-m", "flashattn.explain"], capture_output=True, text=True, check=True, timeout=120
        )
        for _ in range(2)
    ]
    assert runs[0].stdout == runs[1].stdout == explain.report() + "\n"


def test_needs_no_torch() -> None:
    """The file itself runs with torch made unimportable (numpy only)."""
    code = f"import runpy, sys; sys.modules['torch'] = None; runpy.run_path({str(EXPLAIN_PY)!r}, run_name='__main__')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert "max abs difference" in result.stdout


def test_readme_shows_the_real_output() -> None:
    """README's "How it works" pastes the explainer's output: it must be today's."""
    readme = (EXPLAIN_PY.parents[1] / "README.md").read_text()
    section = readme[readme.index("## How it works") :]
    assert explain.report() in section
