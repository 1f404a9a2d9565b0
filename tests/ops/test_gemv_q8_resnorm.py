"""The Triton q8 GEMV with the residual add and RMSNorm in its epilogue (Switches.gemv_q8_resnorm;
gemv_q8(resnorm=...), resnorm_tail.py): a down projection whose next norm's row has no int8 form
(Qwen2.5-0.5B's hidden 896) makes that norm's s and h itself, the program storing the last row tile norming
the whole row. Here, in Triton's interpreter on CPU tensors: out is the plain launch's, s is resid + out bit
for bit and h is what the add + norm kernel makes of them, with and without a K split and with the GLU
prologue; the tickets are zero again after the launch (graph replays); s and h agree with gguf's dequantized
weight in float64; linear_add_rms_norm takes the launch under the switch (counted) and gives the switch-off
numbers; a launch the tail cannot take (bias, two weights) returns out alone."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import rel_err  # noqa: E402
from test_gemv_q8 import NAMES, _weight, x_hat  # noqa: E402
from test_gemv_q8_glu_prologue import _down, _glu_rows  # noqa: E402
from test_norm_into_gemv_cpu import M  # noqa: E402,F401  (the interpreted modules' fixture)

EPS = 1e-6


def _rows(n, k, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, k, generator=g) * 2).to(torch.bfloat16), torch.randn(1, n, generator=g) * 4, \
        torch.rand(n, generator=g) + 0.5


@pytest.mark.parametrize("qt", [12, 14], ids=NAMES.get)
@pytest.mark.parametrize("cfg", [(32, 1, 1, 4, False), (16, 2, 3, 4, True), (32, 2, 2, 4, True)])
@pytest.mark.parametrize("glu", [False, True], ids=["q8", "glu"])
def test_tail_is_the_gemv_then_the_add_norm_kernel(M, qt, cfg, glu):
    from minfer.ops import paths

    Q, N, G = M["gemv_q8"], M["norm_rope_act"], M["gemv_repack"]
    n, k = 45, 1280                         # a partial row tile; 5 blocks: BB 2 leaves a masked half iteration
    rw, wd = _weight(G, qt, n, k, seed=70 + qt)
    a, resid, wn = _rows(n, k, qt + cfg[2])
    if glu:
        gate, up = _glu_rows(k, qt)
        x = (gate, up)
        xh = x_hat(torch.nn.functional.silu(gate.double()) * up.double())
    else:
        x = Q.quantize(a, interpret=True)
        xh = x_hat(a)
    kw = dict(glu=x) if glu else {}
    q8 = None if glu else x
    ws = G.GemvWorkspace("cpu", 64)
    s = torch.empty(1, n)
    h = torch.empty(1, n, dtype=torch.bfloat16)
    paths.reset()
    y = Q.gemv_q8(q8, rw, out_dtype=torch.bfloat16, config=cfg, ws=ws, interpret=True, resnorm=(resid, wn, EPS, s, h),
                  **kw)
    assert paths.snapshot()["counts"].get("gemv_q8.resnorm") == 1 and y.rn[0] is s and y.rn[1] is h
    assert int(ws.cnt.abs().sum()) == 0                                    # every ticket back to zero
    plain = Q.gemv_q8(q8, rw, out_dtype=torch.bfloat16, config=cfg, interpret=True, **kw)
    assert torch.equal(y, plain) and not hasattr(plain, "rn")
    assert torch.equal(s, resid + y.float())
    s2 = torch.empty(1, n)
    h2 = torch.empty(1, n, dtype=torch.bfloat16)
    N._add_rms_norm_launch(resid, y, wn, EPS, s2, h2)
    assert torch.equal(s, s2) and torch.equal(h, h2)
    s64 = resid.double() + xh @ wd.T
    h64 = s64 * torch.rsqrt((s64 * s64).mean() + EPS) * wn.double()
    assert rel_err(s, s64) < 1e-2 and rel_err(h, h64) < 1e-2              # (y rounded to bf16 as ops.linear gives it)


def test_a_launch_the_tail_cannot_take_returns_out_alone(M):
    from minfer.ops import paths

    Q, G = M["gemv_q8"], M["gemv_repack"]
    rw, _ = _weight(G, 12, 40, 512, seed=5)
    a, resid, wn = _rows(40, 512, 6)
    x = Q.quantize(a, interpret=True)
    s, h = torch.zeros(1, 40), torch.zeros(1, 40, dtype=torch.bfloat16)
    paths.reset()
    y = Q.gemv_q8(x, rw, bias=torch.randn(40), interpret=True, resnorm=(resid, wn, EPS, s, h))
    y2 = Q.gemv_q8(x, (rw, rw), interpret=True, resnorm=(torch.randn(1, 80), torch.rand(80), EPS, torch.zeros(1, 80),
                                                          torch.zeros(1, 80, dtype=torch.bfloat16)))
    assert not hasattr(y, "rn") and not hasattr(y2, "rn") and "gemv_q8.resnorm" not in paths.snapshot()["counts"]
    assert int(s.abs().sum()) == 0 and int(h.float().abs().sum()) == 0


@pytest.mark.parametrize("glu", [False, True], ids=["q8", "glu"])
def test_the_switch_routes_linear_add_rms_norm(M, glu):
    """The down projection before the next layer's attention norm, hidden 96 (no multiple of 256: the norm's row
    has no int8 form): under the switch one launch (counted, no add + norm kernel) with the switch-off bits."""
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.switches import Switches

    Q, N, L = M["gemv_q8"], M["norm_rope_act"], M["qmatmul"]
    from minfer.ops.cuda import linear_norm

    n, k = 96, 768
    w, _ = _down(M, 12, n, k, seed=11)
    a, resid, wn = _rows(n, k, 12)
    out = {}
    for on in (False, True):
        ctx = Context(Switches(gemv_q8_resnorm=on, gemv_glu_prologue=1 if glu else 0), None)
        if glu:
            gate, up = _glu_rows(k, 13)
            x = N.swiglu(gate, up, ctx, into_linear=True)
            assert x.glu_row is not None
        else:
            x = a.clone()
            x.q8 = Q.quantize(a, interpret=True)
        paths.reset()
        out[on] = linear_norm.linear_add_rms_norm(x, w, resid, wn, EPS, torch.bfloat16, ctx, into_linear=True,
                                                  role="attn_norm")
        snap = paths.snapshot()
        c = snap["counts"]
        assert (c.get("gemv_q8.resnorm", 0) == 1) == on, c
        assert on == (not any(key.startswith("add_rms_norm") for key in c)), c
        assert c.get("qmatmul.Q4_K.decode." + ("q8glu" if glu else "q8")) == 1, c
        assert not [key for key in snap["fallbacks"] if "resnorm" in key], snap["fallbacks"]
    assert L is not None and torch.equal(out[True][0], out[False][0])
    assert rel_err(out[True][1], out[False][1].double()) < 1e-2
