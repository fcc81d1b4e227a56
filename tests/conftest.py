"""GPU tests (marked ``gpu``) are skipped, with the reason, where flashattn cannot run on CUDA."""

import pytest

import flashattn


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = flashattn.cuda_unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU and the built kernels: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
