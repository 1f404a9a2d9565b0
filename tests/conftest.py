import pytest


def pytest_collection_modifyitems(config, items):
    """Skip `gpu` tests on machines without CUDA (CI); run them with `pytest -m gpu` on the device."""
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # torch missing or broken: no GPU tests
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
