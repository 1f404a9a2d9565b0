"""The CUDA backend's LayerNorm kernel (minfer/ops/cuda/layer_norm.py) in Triton's interpreter
against the CPU reference (minfer/ops/reference.py layer_norm): rows of widths that are and are
not powers of two, one weight or one per head (G rows, row r with weight r % G), float32 and
bf16 outputs. The GPU run is tests/gpu/test_layer_norm_gpu.py."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import interpreted_modules  # noqa: E402


@pytest.fixture(scope="module")
def ln():
    yield from interpreted_modules(["minfer.ops.cuda.layer_norm"])


@pytest.mark.parametrize("n,d,g", [(5, 64, 1), (3, 100, 1), (12, 16, 4), (6, 24, 2)])
@pytest.mark.parametrize("out_dtype", [None, torch.bfloat16])
def test_layer_norm_kernel_matches_reference(ln, n, d, g, out_dtype):
    from minfer.ops import paths, reference

    gen = torch.Generator().manual_seed(n * d + g)
    x = torch.randn(n, d, generator=gen) * 2 + 0.7          # a mean far from 0: centring matters
    w = torch.randn(d, generator=gen) if g == 1 else torch.randn(g, d, generator=gen)
    paths.reset()
    got = ln["layer_norm"].layer_norm(x, w, 1e-5, out_dtype)
    want = reference.layer_norm(x, w, 1e-5, out_dtype)
    assert got.dtype == want.dtype == (out_dtype or torch.float32)
    tol = 1e-5 if out_dtype is None else 1e-2
    assert (got.float() - want.float()).abs().max() <= tol * want.float().abs().max()
    assert paths.snapshot()["counts"].get("layer_norm.triton") == 1


def test_layer_norm_kernel_takes_a_strided_input(ln):
    """q's rows as a view of a wider projection (not contiguous) give the same result."""
    from minfer.ops import reference

    x = torch.randn(4, 48)[:, 8:40]
    w = torch.randn(32)
    assert torch.allclose(ln["layer_norm"].layer_norm(x, w, 1e-6), reference.layer_norm(x, w, 1e-6), atol=1e-5)


def test_layer_norm_kernel_refuses_a_weight_that_does_not_fit(ln):
    from minfer.errors import MinferError

    with pytest.raises(MinferError, match="layer_norm"):
        ln["layer_norm"].layer_norm(torch.randn(5, 16), torch.randn(2, 16), 1e-5)
