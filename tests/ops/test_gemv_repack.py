"""The repacked Q4_K / Q6_K planes (minfer.ops.cuda.gemv_repack): byte-exact repack, and the
GEMV / dequant kernels run by Triton's interpreter on the CPU at small shapes.

References are independent of the code under test: the gguf package's dequantize of the raw
blocks (kernel_data.reference_dequant) and torch float64 math (reference_gemv is a few torch
lines). fp32 / fp16 activations only (the interpreter computes tl.dot on bf16 wrongly).
Fixed configs: the interpreter cannot autotune.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import interpreted_modules, random_weight, reference_dequant, rel_err  # noqa: E402

from minfer.errors import MinferError  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")

TYPES = [12, 14]
NAMES = {12: "Q4_K", 14: "Q6_K"}


@pytest.fixture(scope="module")
def G():
    for mods in interpreted_modules(["minfer.ops.cuda.gemv_repack"]):
        yield mods["gemv_repack"]


def _weight(G, qt, n, k, seed):
    raw = random_weight(qt, n, k, np.random.default_rng(seed))
    rw = G.repack(torch.from_numpy(raw), qt, n, k)
    return raw, rw, torch.from_numpy(reference_dequant(raw, qt, n, k))


@pytest.mark.parametrize("qt", TYPES, ids=NAMES.get)
@pytest.mark.parametrize("n,k", [(1, 256), (7, 768), (33, 1280)])
def test_repack_byte_exact(G, qt, n, k):
    raw, rw, ref = _weight(G, qt, n, k, seed=n * 10 + qt)
    G.check_repacked(raw, rw, qt)                                      # raises on any differing bit
    got = G.dequantize_planes(rw)
    assert np.array_equal(got.view(np.uint32), ref.numpy().view(np.uint32))   # against gguf directly
    assert rw.nbytes() == n * (k // 256) * {12: 148, 14: 210}[qt]


@pytest.mark.parametrize("qt", TYPES, ids=NAMES.get)
def test_repack_in_row_steps_matches_whole(G, qt):
    raw, rw, _ = _weight(G, qt, 37, 512, seed=3)
    rw2 = G.repack(torch.from_numpy(raw), qt, 37, 512, rows_per_step=8)
    assert all(torch.equal(a, b) for a, b in zip(rw.planes, rw2.planes))


@pytest.mark.parametrize("qt", TYPES, ids=NAMES.get)
@pytest.mark.parametrize("plane", [0, 1, 2])
def test_validator_catches_a_flipped_bit(G, qt, plane):
    raw, rw, _ = _weight(G, qt, 5, 512, seed=4)
    planes = [p.clone() for p in rw.planes]
    flat = planes[plane].view(torch.uint8).view(-1)
    flat[flat.numel() // 2 + 1] ^= 1 << 2                              # one bit of one value/scale
    with pytest.raises(MinferError, match=NAMES[qt]):
        G.check_repacked(raw, planes, qt, name="blk.0.ffn_down.weight")


def test_validator_rejects_wrong_shapes_and_types(G):
    raw, rw, _ = _weight(G, 12, 4, 256, seed=5)
    with pytest.raises(MinferError, match="shapes"):
        G.check_repacked(raw, rw.planes[:2], 12)
    with pytest.raises(MinferError, match="not repacked"):
        G.repack(torch.zeros(4, 34, dtype=torch.uint8), 8, 4, 32)
    assert G.is_repacked_type(12) and G.is_repacked_type(14) and not G.is_repacked_type(13)


@pytest.mark.parametrize("qt", TYPES, ids=NAMES.get)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_dequant_kernel_exact(G, qt, dtype):
    n, k = 13, 768                                                     # tail rows in the last tile
    _, rw, ref = _weight(G, qt, n, k, seed=6 + qt)
    out = torch.full((n, k + 5), float("nan"), dtype=dtype)
    G.dequantize_into(rw, out, interpret=True, tile=(4, 2))           # tail block in the last tile
    assert torch.equal(out[:, :k], ref.to(dtype))
    assert torch.isnan(out[:, k:]).all()


# (BN, BB, SPLIT, warps): one split; two splits reduced by the last program; three by the kernel
CONFIGS = [((16, 1, 1, 4), True), ((16, 2, 2, 4), True), ((16, 1, 3, 4), False)]


@pytest.mark.parametrize("qt", TYPES, ids=NAMES.get)
@pytest.mark.parametrize("cfg,inline", CONFIGS, ids=["split1", "split2-inline", "split3-kernel"])
def test_gemv_m1(G, qt, cfg, inline):
    n, k = 37, 1280                                                    # 3 row tiles, 5 blocks
    _, rw, w = _weight(G, qt, n, k, seed=20 + qt)
    g = torch.Generator().manual_seed(qt)
    x = torch.randn(1, k, generator=g)
    out = G.gemv(x, rw, config=cfg, inline_reduce=inline, interpret=True)
    assert out.shape == (1, n) and out.dtype == torch.float32
    assert rel_err(out, G.reference_gemv(x, w)) < 1e-5


@pytest.mark.parametrize("qt", TYPES, ids=NAMES.get)
@pytest.mark.parametrize("m,dtype,cfg", [(5, torch.float32, (16, 1, 1, 4)), (3, torch.float16, (16, 1, 2, 4)),
                                         (20, torch.float32, (32, 2, 2, 4))])
def test_gemv_small_m_dot(G, qt, m, dtype, cfg):
    n, k = 45, 768
    _, rw, w = _weight(G, qt, n, k, seed=30 + m)
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, k, generator=g).to(dtype)
    out = G.gemv(x, rw, config=cfg, interpret=True)
    assert out.shape == (m, n) and out.dtype == dtype
    assert rel_err(out, G.reference_gemv(x, w)) < (1e-5 if dtype == torch.float32 else 2e-3)


@pytest.mark.parametrize("qt", TYPES, ids=NAMES.get)
@pytest.mark.parametrize("m", [1, 4])
@pytest.mark.parametrize("fuse", ["norm+resid", "swiglu+bias", "all"])
def test_gemv_fusions(G, qt, m, fuse):
    n, k = 21, 512
    _, rw, w = _weight(G, qt, n, k, seed=40 + m)
    g = torch.Generator().manual_seed(m + qt)
    x = torch.randn(m, k, generator=g) * 3
    kw = {}
    if "norm" in fuse or fuse == "all":
        kw.update(norm_weight=torch.randn(k, generator=g), eps=1e-5)
    if "resid" in fuse or fuse == "all":
        kw["resid"] = torch.randn(m, n, generator=g)
    if "swiglu" in fuse or fuse == "all":
        kw["up"] = torch.randn(m, k, generator=g)
    if "bias" in fuse or fuse == "all":
        kw["bias"] = torch.randn(n, generator=g)
    cfg = (16, 1, 2, 4)                                               # the epilogue after a split reduce
    out = G.gemv(x, rw, config=cfg, interpret=True, **kw)
    ref = G.reference_gemv(x, w, **kw)
    assert rel_err(out, ref) < 1e-5
    # the fused input really changed the result (the fusion is not a no-op)
    assert rel_err(out, G.reference_gemv(x, w)) > 1e-2


def test_gemv_rejects_bad_inputs(G):
    _, rw, _ = _weight(G, 12, 8, 256, seed=9)
    with pytest.raises(MinferError, match="expected"):
        G.gemv(torch.zeros(1, 512), rw, interpret=True)
    with pytest.raises(MinferError, match="up"):
        G.gemv(torch.zeros(1, 256), rw, up=torch.zeros(2, 256), interpret=True)
