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
from kernel_data import random_weight, reference_dequant, rel_err  # noqa: E402
from test_gemv_q8 import NAMES, Q, _weight, pytestmark, x_hat  # noqa: E402,F401  (the interpreted modules' fixture)
from test_norm_into_gemv_cpu import M  # noqa: E402,F401

from minfer.errors import MinferError  # noqa: E402


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


def _down(M, qt, n, k, seed):
    from minfer.weights import QWeight

    raw = random_weight(qt, n, k, np.random.default_rng(seed))
    w = QWeight(name="blk.0.ffn_down.weight", qtype=qt, shape=(n, k), raw=torch.from_numpy(raw))
    w.repacked = M["gemv_repack"].repack(torch.from_numpy(raw), qt, n, k)
    return w, torch.from_numpy(reference_dequant(raw, qt, n, k)).double()


def _glu_rows(k, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, k, generator=g) * 2).to(torch.bfloat16), torch.randn(1, k, generator=g).to(torch.bfloat16)


@pytest.mark.parametrize("qt", [12, 14], ids=NAMES.get)
def test_deferred_swiglu_then_down_linear_is_the_two_launches(M, qt):
    """swiglu(into_linear) under the switch returns h unwritten with h.glu_row; ops.linear's down GEMV
    takes it in its GLU prologue (counted, no swiglu launch, no fallback) and gives the bits of
    swiglu_q8 + the q8 GEMV; the switch off or a caller without into_linear keep the swiglu launch."""
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.switches import Switches

    N, QM = M["norm_rope_act"], M["qmatmul"]
    n, k = 40, 768
    w, wd = _down(M, qt, n, k, seed=8)
    gate, up = _glu_rows(k, 9)
    outs, snaps = {}, {}
    for on, into in ((False, True), (True, False), (True, True)):
        ctx = Context(Switches(gemv_glu_prologue=on), None)
        paths.reset()
        h = N.swiglu(gate, up, ctx, into_linear=into)
        assert (getattr(h, "glu_row", None) is not None) is (on and into)
        outs[on, into] = QM.linear(h, w, None, ctx, out_dtype=torch.float32)
        snaps[on, into] = paths.snapshot()
    assert torch.equal(outs[True, True], outs[False, True]) and torch.equal(outs[True, False], outs[False, True])
    name = NAMES[qt]
    c = snaps[True, True]["counts"]
    assert c.get("swiglu.into_gemv") == 1 and c.get(f"qmatmul.{name}.decode.q8glu") == 1, c
    assert "swiglu.q8" not in c and f"qmatmul.{name}.decode.q8" not in c, c
    assert not snaps[True, True]["fallbacks"], snaps[True, True]["fallbacks"]
    for key in ((False, True), (True, False)):
        c = snaps[key]["counts"]
        assert c.get("swiglu.q8") == 1 and c.get(f"qmatmul.{name}.decode.q8") == 1 and "swiglu.into_gemv" not in c, c
    sv = torch.nn.functional.silu(gate.double()) * up.double()
    assert rel_err(outs[True, True], x_hat(sv) @ wd.T) < 1e-2     # (bf16 gate / up: the row's own rounding aside)


def test_a_consumer_without_the_prologue_makes_the_row_first(M):
    """A deferred row read by a consumer that is not a q8 GEMV of repacked planes (a raw weight's
    GEMV, another op through _realized) is made by swiglu_q8 first -- a fallback counted with the
    reason -- and then holds the values and q8 form of the undeferred launch."""
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.switches import Switches

    N, QM, Q = M["norm_rope_act"], M["qmatmul"], M["gemv_q8"]
    k = 512
    gate, up = _glu_rows(k, 4)
    h0, q80 = Q.swiglu_q8(gate, up, interpret=True)
    ctx = Context(Switches(gemv_glu_prologue=True), None)
    paths.reset()
    h = N.swiglu(gate, up, ctx, into_linear=True)
    QM._realized(h, "a test's consumer")
    assert torch.equal(h, h0) and torch.equal(h.q8[0], q80[0]) and torch.equal(h.q8[1], q80[1])
    fb = paths.snapshot()["fallbacks"]
    assert any(key.startswith("swiglu.into_gemv") and "a test's consumer" in key for key in fb), fb
    # a raw (unrepacked) Q4_K down: no planes, so the row is made before its GEMV
    from minfer.weights import QWeight

    raw = random_weight(12, 24, k, np.random.default_rng(2))
    w = QWeight(name="blk.0.ffn_down.weight", qtype=12, shape=(24, k), raw=torch.from_numpy(raw))
    paths.reset()
    h2 = N.swiglu(gate, up, ctx, into_linear=True)
    assert QM.glu_planes(h2, w, ctx.switches) is None and torch.equal(h2, h0)
    fb = paths.snapshot()["fallbacks"]
    assert any(key.startswith("swiglu.into_gemv") and "no repacked planes" in key for key in fb), fb
