"""The LayerNorm kernel (minfer/ops/cuda/layer_norm.py: command-r, cohere2) on the GPU against the
CPU reference (minfer/ops/reference.py layer_norm), on random rows of the real models' widths
(Command-R 8192, Command-R+ 12288, Command R7B 4096, a head of 128 with per-head weights) and
awkward ones. The output block is poisoned with NaN first, so an unwritten element fails. The
interpreter run of the same kernel is tests/ops/test_layer_norm_interpreted.py."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
DEV = "cuda"


@pytest.mark.parametrize("n,d,g", [(7, 4096, 1), (3, 8192, 1), (2, 12288, 1), (96, 128, 96), (40, 128, 8),
                                   (5, 1000, 1), (1, 64, 1)])
@pytest.mark.parametrize("x_dtype,out_dtype", [(torch.float32, torch.bfloat16), (torch.float32, None),
                                               (torch.bfloat16, None)])
def test_layer_norm_matches_reference(n, d, g, x_dtype, out_dtype):
    from minfer import ops
    from minfer.ops import paths, reference

    gen = torch.Generator().manual_seed(n + d + g)
    x = (torch.randn(n, d, generator=gen) * 3 + 1.5).to(x_dtype)
    w = torch.randn(d, generator=gen) if g == 1 else torch.randn(g, d, generator=gen)
    t = torch.full((64 << 20,), float("nan"), device=DEV)
    del t
    paths.reset()
    got = ops.layer_norm(x.to(DEV), w.to(DEV), 1e-5, out_dtype).cpu()
    want = reference.layer_norm(x, w, 1e-5, out_dtype)
    assert got.dtype == want.dtype
    err = float((got.float() - want.float()).abs().max() / want.float().abs().max())
    assert err < (1e-5 if got.dtype == torch.float32 else 1e-2), err
    assert paths.snapshot()["counts"].get("layer_norm.triton") == 1
