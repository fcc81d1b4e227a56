"""The build's own invariants, checked without a GPU."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_instantiations_match_generator():
    """csrc/instantiations/ is generated; a hand edit or a stale list fails here."""
    result = subprocess.run([sys.executable, str(ROOT / "csrc" / "generate_instantiations.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_headdim_switch_matches_generator():
    """Every head dim the dispatch switch can pick has a generated instantiation."""
    switch = (ROOT / "csrc" / "common" / "static_switch.h").read_text()
    sys.path.insert(0, str(ROOT / "csrc"))
    try:
        import generate_instantiations as gen
    finally:
        sys.path.pop(0)
    for head_dim in gen.HEAD_DIMS:
        assert f"constexpr static int CONST_NAME = {head_dim};" in switch
    assert switch.count("constexpr static int CONST_NAME") == len(gen.HEAD_DIMS)


def test_kernels_hold_no_torch_headers():
    """Kernel files stay plain CUDA C++: torch headers belong to the binding only."""
    for path in (ROOT / "csrc").rglob("*"):
        if path.suffix in {".h", ".cuh", ".cu"}:
            text = path.read_text()
            assert "#include <torch" not in text and "#include <ATen" not in text, path
