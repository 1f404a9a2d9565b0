"""The w4 planes of the batched-decode GEMM (minfer.ops.cuda.qgemm_w4, read by qgemm_w4_mma's
Gluon kernel, which runs only on the GPU: tests/gpu/test_qgemm_w4_gpu.py).

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
from kernel_data import random_weight, reference_dequant, rel_err  # noqa: E402


pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")

TYPES = [12, 14]
NAMES = {12: "Q4_K", 14: "Q6_K"}


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
