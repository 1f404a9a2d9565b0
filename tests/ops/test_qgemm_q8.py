"""The int8 tensor-core batched-decode GEMM (minfer.ops.cuda.qgemm_q8) in Triton's interpreter.

Independent reference: gguf's dequantize of random raw blocks (kernel_data.reference_dequant)
times the activations' x_hat in float64, x_hat from gemv_q8.dequantize_q8 (the q8 form's
meaning, checked against llama.cpp's q8_1 rule in test_gemv_q8.py). The interpreter runs the
same int8 x int8 -> int32 tl.dot as the GPU (numpy's integer matmul there, the tensor cores
on the device): one code path, no interpreter-only branch.
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

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning",
                                        "ignore:overflow encountered:RuntimeWarning",
                                        "ignore:divide by zero encountered:RuntimeWarning")
NAMES = {12: "Q4_K", 14: "Q6_K"}


@pytest.fixture(scope="module")
def Q():
    for mods in interpreted_modules(["minfer.ops.cuda.gemv_repack", "minfer.ops.cuda.gemv_q8",
                                     "minfer.ops.cuda.qgemm_q8"]):
        yield mods["qgemm_q8"], mods["gemv_q8"], mods["gemv_repack"]


_W = {}


def _weight(G, qt, n, k):
    if (qt, n, k) not in _W:
        raw = random_weight(qt, n, k, np.random.default_rng(70 + qt))
        _W[qt, n, k] = (G.repack(torch.from_numpy(raw), qt, n, k),
                        torch.from_numpy(reference_dequant(raw, qt, n, k)).double())
    return _W[qt, n, k]


def _rows(q8m, m, k, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * 3
    x[0, 64:96] = 0.0                                                  # an all-zero chunk: d = 0
    q8 = q8m.quantize_rows(x, interpret=True)
    xh = q8m.dequantize_q8(q8, m * k).view(m, k).double()
    return x, q8, xh


# (M, N, K, config): N not a multiple of BN; split 1 and split K (the ticket reduce); M past BM
CASES = [(3, 45, 512, (32, 16, 4, 1, 4, 1)),
         (17, 45, 768, (32, 16, 2, 3, 4, 1)),
         (33, 70, 512, (64, 32, 8, 2, 4, 1))]


@pytest.mark.parametrize("qt", [12, 14], ids=NAMES.get)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"m{c[0]}_n{c[1]}_k{c[2]}_split{c[3][3]}")
def test_qgemm_q8_exact_against_gguf(Q, qt, case):
    Q8G, q8m, G = Q
    m, n, k, cfg = case
    rw, w = _weight(G, qt, n, k)
    x, q8, xh = _rows(q8m, m, k, seed=m + qt)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(5)) if m != 3 else None
    out = Q8G.qgemm_q8(q8, rw, bias=bias, out_dtype=torch.float32, config=cfg, interpret=True)
    ref = xh @ w.T + (bias.double() if bias is not None else 0.0)
    assert out.shape == (m, n)
    assert rel_err(out, ref) < 1e-5
    # each row on its own too (a wrong M stride or row clamp shows here, not in the norm)
    for r in (0, m - 1):
        assert rel_err(out[r], ref[r]) < 1e-5
    # and it approximates the unquantized product as far as int8 rounding allows
    assert 1e-4 < rel_err(out, x.double() @ w.T + (bias.double() if bias is not None else 0.0)) < 2e-2


def test_qgemm_q8_default_config_and_bf16_out(Q):
    Q8G, q8m, G = Q
    rw, w = _weight(G, 12, 45, 512)
    _, q8, xh = _rows(q8m, 17, 512, seed=9)
    out = Q8G.qgemm_q8(q8, rw, interpret=True)                         # config_for(interpret), bf16 out
    assert out.dtype == torch.bfloat16 and out.shape == (17, 45)
    assert rel_err(out, xh @ w.T) < 1e-2


def test_qgemm_q8_split_counters_reset(Q):
    """The split reduce's tickets come back to zero (CUDA-graph replays reuse them)."""
    Q8G, q8m, G = Q
    from minfer.ops.cuda.gemv_repack import GemvWorkspace

    rw, w = _weight(G, 14, 45, 768)
    _, q8, xh = _rows(q8m, 17, 768, seed=4)
    ws = GemvWorkspace("cpu", 64)
    for _ in range(2):
        out = Q8G.qgemm_q8(q8, rw, out_dtype=torch.float32, config=(32, 16, 2, 3, 4, 1), ws=ws, interpret=True)
        assert rel_err(out, xh @ w.T) < 1e-5
    assert int(ws.cnt.abs().sum()) == 0


def test_qgemm_q8_refuses_bad_inputs(Q):
    Q8G, q8m, G = Q
    rw, _ = _weight(G, 12, 45, 512)
    _, q8, _ = _rows(q8m, 3, 512, seed=1)
    with pytest.raises(MinferError, match="q8 rows"):
        Q8G.qgemm_q8((q8[0][:, :64], q8[1]), rw, interpret=True)
    with pytest.raises(MinferError, match="bias"):
        Q8G.qgemm_q8(q8, rw, bias=torch.zeros(44), interpret=True)
    with pytest.raises(MinferError, match="chunks per step"):
        Q8G.qgemm_q8(q8, rw, config=(32, 16, 3, 1, 4, 1), interpret=True)
