"""The q8 GEMV's GLU prologue (gemv_q8(glu=(gate, up)), Switches.gemv_glu_prologue) in Triton's
interpreter: the down projection's programs make x_hat = q8(silu(gate) * up) themselves instead
of reading the row swiglu_q8 wrote. Checked against an independent reference (gguf's dequantize
of the weight; silu and llama.cpp's quantize_row_q8_1 rule in float64 torch lines) and for
bit-identity with the two launches it replaces (swiglu_q8, then gemv_q8)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import interpreted_modules, random_weight, reference_dequant, rel_err  # noqa: E402
from test_gemv_q8 import x_hat  # noqa: E402

from minfer.errors import MinferError  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning",
                                        "ignore:overflow encountered:RuntimeWarning",
                                        "ignore:divide by zero encountered:RuntimeWarning")
NAMES = {12: "Q4_K", 14: "Q6_K"}


@pytest.fixture(scope="module")
def Q():
    for mods in interpreted_modules(["minfer.ops.cuda.gemv_repack", "minfer.ops.cuda.q8_rows", "minfer.ops.cuda.gemv_q8",
                                     "minfer.ops.cuda.gemv_q8_experts"]):
        yield mods["gemv_q8"], mods["gemv_repack"]


def _weight(G, qt, n, k, seed):
    raw = random_weight(qt, n, k, np.random.default_rng(seed))
    rw = G.repack(torch.from_numpy(raw), qt, n, k)
    return rw, torch.from_numpy(reference_dequant(raw, qt, n, k)).double()


@pytest.mark.parametrize("qt", [12, 14], ids=NAMES.get)
@pytest.mark.parametrize("cfg", [(32, 1, 1, 4, False), (16, 2, 3, 4, True), (32, 2, 2, 4, True)])
def test_glu_prologue_equals_the_two_launches_and_the_reference(Q, qt, cfg):
    q8m, G = Q
    n, k = 45, 1280                     # a partial row tile; 5 blocks: BB 2 leaves a masked half iteration
    rw, w = _weight(G, qt, n, k, seed=60 + qt)
    g = torch.Generator().manual_seed(qt)
    gate, up = torch.randn(1, k, generator=g) * 3, torch.randn(1, k, generator=g)
    gate[0, 64:96] = 0.0                # a chunk whose values are all zero: d = 0
    bias = torch.randn(n, generator=g)
    out = q8m.gemv_q8(None, rw, bias=bias, out_dtype=torch.float32, config=cfg, interpret=True, glu=(gate, up))
    _, q8 = q8m.swiglu_q8(gate, up, interpret=True)
    two = q8m.gemv_q8(q8, rw, bias=bias, out_dtype=torch.float32, config=cfg, interpret=True)
    assert torch.equal(out, two)
    ref = x_hat(torch.nn.functional.silu(gate.double()) * up.double()) @ w.T + bias.double()
    assert rel_err(out, ref) < 1e-5


def test_glu_prologue_refuses_what_it_cannot_take(Q):
    q8m, G = Q
    rw, _ = _weight(G, 12, 32, 512, seed=3)
    gate, up = torch.randn(1, 512), torch.randn(1, 512)
    with pytest.raises(MinferError, match="GLU prologue"):
        q8m.gemv_q8(None, rw, interpret=True, glu=(gate, up[:, :256]))
    with pytest.raises(MinferError, match="GLU prologue"):
        q8m.gemv_q8(None, (rw, rw), interpret=True, glu=(gate, up))
    with pytest.raises(MinferError, match="GLU prologue"):
        q8m.gemv_q8(None, rw, interpret=True, glu=(torch.randn(1, 1024)[:, ::2], up))
