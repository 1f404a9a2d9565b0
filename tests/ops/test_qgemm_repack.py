"""The batched-decode GEMM over repacked Q4_K / Q6_K planes (minfer.ops.cuda.qgemm_repack),
run by Triton's interpreter on the CPU at small shapes.

References are independent of the code under test: the gguf package's dequantize of the raw
blocks (kernel_data.reference_dequant) and float64 torch matmul.

Tolerances. The kernel rounds each exact weight once to x's dtype and accumulates in fp32, so
against x @ round(W)^T in float64 (W rounded to bf16/fp16 by torch) the only error left is
fp32 accumulation over K <= 768 terms: < 1e-5 (norm-relative), with fp32 outputs. Against the
exact W the bf16 rounding of the weights adds at most 2^-9 relative per weight; over random
signs the norm-relative error is ~2^-9/sqrt(3) ~ 1.1e-3, so 4e-3 bounds it (fp16: 2^-11, 1e-3).
The interpreter's bf16 tl.dot is wrong (tests/ops/test_gemv_repack.py), so with bf16 x the
interpreted kernel upcasts the already bf16-rounded tile and x to fp32 for the dot (DOT_F32);
the bf16 MMA itself is checked by tests/gpu/test_qgemm_repack.py.
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
def Q():
    for mods in interpreted_modules(["minfer.ops.cuda.qgemm_repack"]):
        yield mods["qgemm_repack"]


def _weight(qt, n, k, seed):
    from minfer.ops.cuda.gemv_repack_layout import repack

    raw = random_weight(qt, n, k, np.random.default_rng(seed))
    rw = repack(torch.from_numpy(raw), qt, n, k)
    return rw, torch.from_numpy(reference_dequant(raw, qt, n, k)).double()


# (N, K, M, config [BN, BM, BK, SPLIT, warps, stages], inline reduce)
CASES = [
    (64, 512, 9, (32, 16, 256, 1, 4, 1), True),          # one M tile, two row tiles, no split
    (192, 512, 40, (64, 16, 512, 1, 4, 1), True),        # three M tiles (rows past M), BK = 512
    (100, 768, 17, (32, 32, 512, 2, 4, 1), True),        # rows past N; K = 768 with BK = 512: a half K step
    (96, 768, 33, (32, 64, 128, 3, 4, 1), True),         # split 3, reduced by the last program; BK = 128
    (80, 512, 12, (16, 16, 256, 2, 4, 1), False),        # split 2, reduced by the second kernel
]


@pytest.mark.parametrize("qt", TYPES, ids=NAMES.get)
@pytest.mark.parametrize("n,k,m,cfg,inline", CASES, ids=[f"n{c[0]}k{c[1]}m{c[2]}s{c[3][3]}" for c in CASES])
def test_qgemm_bf16(Q, qt, n, k, m, cfg, inline):
    rw, w = _weight(qt, n, k, seed=n + m + qt)
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    out = Q.qgemm(x, rw, out_dtype=torch.float32, config=cfg, inline_reduce=inline, interpret=True)
    assert out.shape == (m, n) and out.dtype == torch.float32
    xd = x.double()
    # the weights rounded once to bf16 (torch's round-to-nearest-even), fp32 accumulation only
    assert rel_err(out, xd @ w.to(torch.bfloat16).double().T) < 1e-5
    assert rel_err(out, xd @ w.T) < 4e-3
    # bf16 output: one more rounding of 2^-9 relative
    out16 = Q.qgemm(x, rw, config=cfg, inline_reduce=inline, interpret=True)
    assert out16.dtype == torch.bfloat16 and rel_err(out16, xd @ w.T) < 5e-3


@pytest.mark.parametrize("qt", TYPES, ids=NAMES.get)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_qgemm_fp16_fp32(Q, qt, dtype):
    n, k, m = 72, 768, 20
    rw, w = _weight(qt, n, k, seed=5 + qt)
    g = torch.Generator().manual_seed(qt)
    x = torch.randn(m, k, generator=g).to(dtype)
    out = Q.qgemm(x, rw, out_dtype=torch.float32, config=(32, 32, 256, 2, 4, 1), interpret=True)
    ref = x.double() @ (w.to(dtype).double() if dtype == torch.float16 else w).T
    assert rel_err(out, ref) < 1e-5
    assert rel_err(out, x.double() @ w.T) < (1e-3 if dtype == torch.float16 else 1e-5)


@pytest.mark.parametrize("qt", TYPES, ids=NAMES.get)
@pytest.mark.parametrize("split", [1, 2])
def test_qgemm_bias_resid(Q, qt, split):
    n, k, m = 50, 512, 11
    rw, w = _weight(qt, n, k, seed=7 + split)
    g = torch.Generator().manual_seed(split)
    x = torch.randn(m, k, generator=g)
    scale = float((x.double() @ w.T).std())                             # bias/resid as large as x @ W^T
    bias = torch.randn(n, generator=g) * scale
    resid = torch.randn(m, n, generator=g) * scale
    out = Q.qgemm(x, rw, bias=bias, resid=resid, config=(32, 16, 256, split, 4, 1), interpret=True)
    ref = x.double() @ w.T + bias.double() + resid.double()
    assert rel_err(out, ref) < 1e-5
    assert rel_err(out, x.double() @ w.T) > 1e-2                         # the epilogue really added them


def test_qgemm_counters_reset_between_launches(Q):
    """The split-K tickets reset themselves: a second launch on the same counters (as a CUDA
    graph replays) gives the same bits, and the counters are zero afterwards."""

    class WS:
        def __init__(self):
            self.cnt = torch.zeros(64, dtype=torch.int32)

        def counters(self, need):
            assert need <= self.cnt.numel()
            return self.cnt

    rw, w = _weight(12, 64, 768, seed=11)
    x = torch.randn(24, 768, generator=torch.Generator().manual_seed(2))
    ws = WS()
    a = Q.qgemm(x, rw, config=(32, 16, 128, 3, 4, 1), ws=ws, interpret=True)
    assert int(ws.cnt.abs().sum()) == 0
    b = Q.qgemm(x, rw, config=(32, 16, 128, 3, 4, 1), ws=ws, interpret=True)
    assert torch.equal(a, b) and rel_err(a, x.double() @ w.T) < 1e-5


def test_qgemm_rejects_bad_inputs(Q):
    rw, _ = _weight(12, 16, 256, seed=9)
    with pytest.raises(MinferError, match="expected"):
        Q.qgemm(torch.zeros(9, 512), rw, interpret=True)
    with pytest.raises(MinferError, match="resid"):
        Q.qgemm(torch.zeros(9, 256), rw, resid=torch.zeros(9, 8), interpret=True)
    with pytest.raises(MinferError, match="bias"):
        Q.qgemm(torch.zeros(9, 256), rw, bias=torch.zeros(8), interpret=True)


def test_default_configs_cover_the_7b_shapes(Q):
    """The default rule gives a valid tile for every shape the batch engine multiplies (no
    kernel run: launch sizes only) and splits K only when the row tiles are too few."""
    for n, k in [(4608, 3584), (3584, 3584), (37888, 3584), (18944, 3584), (3584, 18944), (152064, 3584)]:
        for m in (9, 16, 32, 64, 128, 200, 256):
            bn, bm, bk, split, warps, stages = Q.default_config(12, m, n, k)
            assert bm >= min(m, 128) and bm in (16, 32, 64, 128) and bk in (128, 256, 512)
            tiles = -(-n // bn) * -(-m // bm)
            assert (split == 1) == (tiles >= 264) and 1 <= split <= 16
