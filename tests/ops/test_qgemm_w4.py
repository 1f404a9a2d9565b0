"""The batched-decode GEMM over w4 planes (minfer.ops.cuda.qgemm_w4), planes on the CPU and the
kernel in Triton's interpreter at small shapes.

References independent of the code under test: the gguf package's float32 values of the raw
blocks (kernel_data.reference_dequant) and float64 torch matmuls.

Tolerances. The planes hold bf16 s = d*sc and m = dmin*m (Q4_K) or s = d*sc (Q6_K), and the
kernel's bf16 fma rounds q*s - m once. Against the exact value v = q*S - M (S, M exact), the
error is at most 2^-9 (|q S| + |M|) from rounding s and m, plus 2^-9 |v| from the last rounding.
Random blocks need not reach q = 0 or 15 in a group, so the test bounds the error by 2^-6 of the
largest |v| in the value's scale group (observed up to 2^-7): a wrong nibble, scale or min is off
by at least one step, about |S| ~ max|v| / 15 = 2^-4 max|v|.
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
    for mods in interpreted_modules(["minfer.ops.cuda.qgemm_w4"]):
        yield mods["qgemm_w4"]


def _weight(qt, n, k, seed):
    from minfer.ops.cuda.gemv_repack_layout import repack
    from minfer.ops.cuda.qgemm_w4 import make_w4

    raw = random_weight(qt, n, k, np.random.default_rng(seed))
    p = make_w4(repack(torch.from_numpy(raw), qt, n, k))
    return p, torch.from_numpy(reference_dequant(raw, qt, n, k)).double()


@pytest.mark.parametrize("qt", TYPES, ids=NAMES.get)
def test_planes_against_gguf(qt):
    from minfer.ops.cuda.qgemm_w4 import dequantize_w4

    n, k = 48, 1024
    p, ref = _weight(qt, n, k, seed=3 + qt)
    got = dequantize_w4(p).double()
    g = 32 if qt == 12 else 16
    gmax = ref.abs().view(n, -1, g).amax(-1, keepdim=True).expand(-1, -1, g).reshape(n, k)
    err = (got - ref).abs()
    assert bool((err <= 2.0 ** -6 * gmax).all()), float((err / gmax.clamp_min(1e-30)).max())
    # the bound is not vacuous: most values are not exact, and the error is near bf16 rounding
    assert float((err > 0).double().mean()) > 0.5
    assert rel_err(got, ref) < 4e-3
    # bytes: 5 bits per Q4_K value (4 + a 32-bit scale pair per 32), 7 per Q6_K (4 + 2 + bf16 per 16)
    assert p.nbytes() * 8 == n * k * (5 if qt == 12 else 7)


# (N, K, M, config [BN, BM, BK, SPLIT, warps, stages])
CASES = [
    (64, 512, 9, (32, 16, 256, 1, 4, 1)),      # one M tile, two row tiles
    (100, 768, 17, (32, 32, 256, 1, 4, 1)),    # rows past N, batch rows past M
    (96, 1024, 40, (32, 16, 256, 3, 4, 1)),    # three M tiles; split 3 over 4 K steps (sizes 2, 2)
    (64, 768, 12, (64, 16, 128, 6, 4, 1)),     # split 6, BK = 128
]


@pytest.mark.parametrize("qt", TYPES, ids=NAMES.get)
@pytest.mark.parametrize("n,k,m,cfg", CASES, ids=[f"n{c[0]}k{c[1]}m{c[2]}s{c[3][3]}" for c in CASES])
def test_qgemm_w4(Q, qt, n, k, m, cfg):
    p, w = _weight(qt, n, k, seed=n + m + qt)
    wq = Q.dequantize_w4(p).double()
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, k, generator=g)
    out = Q.qgemm_w4(x, p, out_dtype=torch.float32, config=cfg, interpret=True)
    assert out.shape == (m, n) and out.dtype == torch.float32
    # the decoded bf16 weights exactly, fp32 accumulation only
    assert rel_err(out, x.double() @ wq.T) < 1e-5
    assert rel_err(out, x.double() @ w.T) < 4e-3


@pytest.mark.parametrize("qt", TYPES, ids=NAMES.get)
def test_decoded_weights_one_hot(Q, qt):
    """One-hot rows read single weights out exactly: every position of a word (both nibbles of
    each pair), both Q6_K scale halves of a 32-value chunk, a second K step and a split."""
    n, k = 40, 768
    p, _ = _weight(qt, n, k, seed=21 + qt)
    want_all = Q.dequantize_w4(p)
    cols = list(range(32)) + [300, 301, 511, 512, 767]
    x = torch.zeros(len(cols), k)
    x[torch.arange(len(cols)), torch.tensor(cols)] = 1.0
    out = Q.qgemm_w4(x, p, out_dtype=torch.float32, config=(16, 64, 256, 2, 4, 1), interpret=True)
    assert torch.equal(out, want_all[:, cols].T)


@pytest.mark.parametrize("split", [1, 2])
def test_bias_resid(Q, split):
    n, k, m = 50, 512, 11
    p, _ = _weight(12, n, k, seed=7 + split)
    wq = Q.dequantize_w4(p).double()
    g = torch.Generator().manual_seed(split)
    x = torch.randn(m, k, generator=g)
    scale = float((x.double() @ wq.T).std())
    bias = torch.randn(n, generator=g) * scale
    resid = torch.randn(m, n, generator=g) * scale
    out = Q.qgemm_w4(x, p, bias=bias, resid=resid, config=(32, 16, 256, split, 4, 1), interpret=True)
    ref = x.double() @ wq.T + bias.double() + resid.double()
    assert rel_err(out, ref) < 1e-5
    assert rel_err(out, x.double() @ wq.T) > 1e-2


def test_counters_reset(Q):
    """Split-K tickets reset themselves (CUDA graph replays reuse them)."""
    cnt = torch.zeros(16, dtype=torch.int32)

    class WS:
        def counters(self, need):
            return cnt

    p, _ = _weight(12, 64, 768, seed=11)
    x = torch.randn(24, 768, generator=torch.Generator().manual_seed(2))
    a = Q.qgemm_w4(x, p, config=(32, 32, 256, 3, 4, 1), ws=WS(), interpret=True)
    assert int(cnt.abs().sum()) == 0
    b = Q.qgemm_w4(x, p, config=(32, 32, 256, 3, 4, 1), ws=WS(), interpret=True)
    assert torch.equal(a, b)


def test_errors(Q):
    p, _ = _weight(12, 32, 512, seed=1)
    with pytest.raises(MinferError, match="expected \\(M, 512\\)"):
        Q.qgemm_w4(torch.zeros(4, 256), p, interpret=True)
    with pytest.raises(MinferError, match="K step"):
        Q.qgemm_w4(torch.zeros(4, 512), p, config=(32, 16, 384, 1, 4, 1), interpret=True)


@pytest.mark.parametrize("qt", TYPES, ids=NAMES.get)
def test_fragment_order_keeps_every_value(qt):
    """The Gluon kernel's planes (qgemm_w4_mma.to_fragment_order) read in the kernel's order give
    exactly the values of the planes they came from (the kernel itself runs only on the GPU:
    tests/gpu/test_qgemm_w4_gpu.py)."""
    pytest.importorskip("triton.experimental.gluon")
    from minfer.ops.cuda.qgemm_w4 import dequantize_w4
    from minfer.ops.cuda.qgemm_w4_mma import dequantize_fragment, to_fragment_order

    p, ref = _weight(qt, 24, 512, seed=9 + qt)
    f = to_fragment_order(p)
    assert [t.shape for t in f.planes][0] == p.planes[0].shape
    assert torch.equal(dequantize_fragment(f), dequantize_w4(p))
