import os

# Before anything imports torch (its OpenMP runtime reads this once): threads that wait passively
# instead of spinning, as `minfer` itself sets (minfer/cli.py). On a machine shared with other
# work, spinning threads made an in-process chat test ~20x slower (800 s against 43 s).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402

# Without a GPU, Triton kernels run only in Triton's interpreter, and TRITON_INTERPRET is read
# when a kernel module is imported: set it before any test module imports minfer.ops.cuda.
if "TRITON_INTERPRET" not in os.environ:
    try:
        import torch

        if not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"
    except ImportError:
        pass


# The suite checks the CPU's float32 reference against llama.cpp's and transformers' numbers;
# the int8 CPU fast path (on by default for users, MINFER_CPU_QUANT) requantizes the weights and
# is tested on its own (tests/ops/test_cpu_quant.py passes Switches(cpu_quant=True)).
os.environ.setdefault("MINFER_CPU_QUANT", "0")


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
