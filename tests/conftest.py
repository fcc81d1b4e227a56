"""GPU tests (marked ``gpu``) are skipped, with the reason, where flashattn cannot run on CUDA.

Tests marked ``slow`` (also ``gpu``) run for a minute or more; scripts/gpu_round.sh
leaves them out of its pytest run and runs what they wrap as a step of its own.
"""

import pytest

import flashattn


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: takes a minute or more (the long-context run)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = flashattn.cuda_unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU and the built kernels: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
