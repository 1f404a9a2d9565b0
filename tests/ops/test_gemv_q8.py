"""The int8-activation decode GEMV (minfer.ops.cuda.gemv_q8) in Triton's interpreter.

References independent of the code under test: gguf's dequantize of the raw blocks
(kernel_data.reference_dequant) and a few torch lines here that quantize x per 32 values the
way llama.cpp's quantize_row_q8_1 does (d = max|x| / 127, round half away from zero). The
interpreter runs the portable byte dot product; the PTX dp4a runs in tests/gpu.
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
    for mods in interpreted_modules(["minfer.ops.cuda.gemv_repack", "minfer.ops.cuda.q8_rows", "minfer.ops.cuda.gemv_q8",
                                     "minfer.ops.cuda.gemv_q8_experts"]):
        yield mods["gemv_q8"], mods["gemv_repack"]


def x_hat(v: torch.Tensor) -> torch.Tensor:
    """float64 values of v (1, K) after int8 quantization per 32 values."""
    b = v.double().view(-1, 32)
    d = b.abs().amax(1, keepdim=True) / 127
    t = torch.where(d > 0, b / d, torch.zeros_like(b))
    q = torch.sign(t) * torch.floor(t.abs() + 0.5)
    return (q * d).view(1, -1)


def _weight(G, qt, n, k, seed):
    raw = random_weight(qt, n, k, np.random.default_rng(seed))
    rw = G.repack(torch.from_numpy(raw), qt, n, k)
    return rw, torch.from_numpy(reference_dequant(raw, qt, n, k)).double()


def test_quantize_matches_q8_1_rule(Q):
    q8m, _ = Q
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 512, generator=g) * 4
    x[0, 32:64] = 0.0                                                  # an all-zero chunk: d = 0
    xq, xf = q8m.quantize(x, interpret=True)
    assert torch.allclose(q8m.dequantize_q8((xq, xf), 512).double(), x_hat(x), rtol=0, atol=1e-6)
    # the stored sums are d * sum(q) over each half chunk
    xh = x_hat(x).view(-1, 2, 16).sum(-1)
    assert torch.allclose(xf.view(-1, 4)[:, 1:3].double(), xh, atol=1e-5)


@pytest.mark.parametrize("qt", [12, 14], ids=NAMES.get)
@pytest.mark.parametrize("cfg,pre", [((32, 1, 1, 4, False), 1), ((16, 2, 3, 4, True), 1), ((64, 1, 5, 2, True), 1),
                                     ((16, 2, 1, 4, True), 2), ((32, 1, 2, 4, True), 2)])
def test_gemv_q8_exact_against_quantized_x(Q, qt, cfg, pre):
    """pre=2: two weight tiles in flight (the PDL prefetch depth, Switches.pdl_prefetch)."""
    q8m, G = Q
    n, k = 45, 1280                                                    # partial row tile, 5 blocks
    rw, w = _weight(G, qt, n, k, seed=50 + qt)
    g = torch.Generator().manual_seed(qt)
    x = torch.randn(1, k, generator=g)
    q8 = q8m.quantize(x, interpret=True)
    bias = torch.randn(n, generator=g)
    resid = torch.randn(1, n, generator=g)
    out = q8m.gemv_q8(q8, rw, bias=bias, resid=resid, out_dtype=torch.float32, config=cfg, interpret=True,
                      pdl_prefetch=pre)
    ref = x_hat(x) @ w.T + bias.double() + resid.double()
    assert out.shape == (1, n)
    assert rel_err(out, ref) < 1e-5
    # and it is an approximation of the unquantized product of the size int8 rounding allows
    assert 1e-4 < rel_err(out, x.double() @ w.T + bias.double() + resid.double()) < 2e-2


@pytest.mark.parametrize("qt", [12, 14], ids=NAMES.get)
def test_add_rms_norm_q8_and_swiglu_q8(Q, qt):
    q8m, G = Q
    n, k = 19, 768
    rw, w = _weight(G, qt, n, k, seed=7)
    g = torch.Generator().manual_seed(5)
    x, y, nw = torch.randn(1, k, generator=g), torch.randn(1, k, generator=g), torch.randn(k, generator=g)
    s, h, q8 = q8m.add_rms_norm_q8(x, y, nw, 1e-6, torch.float32, interpret=True)
    sv = (x + y).double()
    hv = sv * torch.rsqrt(sv.pow(2).mean(-1, keepdim=True) + 1e-6) * nw.double()
    assert torch.equal(s, x + y) and rel_err(h, hv) < 1e-6
    assert rel_err(q8m.gemv_q8(q8, rw, out_dtype=torch.float32, interpret=True), x_hat(hv) @ w.T) < 1e-5
    hs, q8s = q8m.swiglu_q8(x, y, interpret=True)
    sw = torch.nn.functional.silu(x.double()) * y.double()
    assert rel_err(hs, sw) < 1e-6
    assert rel_err(q8m.gemv_q8(q8s, rw, out_dtype=torch.float32, interpret=True), x_hat(sw) @ w.T) < 1e-5


def test_gemv_q8_rejects_bad_inputs(Q):
    q8m, G = Q
    rw, _ = _weight(G, 12, 8, 512, seed=1)
    q8 = q8m.quantize(torch.randn(1, 256), interpret=True)
    with pytest.raises(MinferError, match="expects 512"):
        q8m.gemv_q8(q8, rw, interpret=True)
    with pytest.raises(MinferError, match="one contiguous row"):
        q8m.quantize(torch.randn(2, 256), interpret=True)


def test_gemv_q8_two_segments_one_launch(Q):
    """q/k in Q4_K and v in Q6_K as one launch: rows stacked, each program on one weight."""
    q8m, G = Q
    k = 512
    ra, wa = _weight(G, 12, 45, k, seed=61)
    rb, wb = _weight(G, 14, 21, k, seed=62)
    g = torch.Generator().manual_seed(9)
    x = torch.randn(1, k, generator=g)
    bias = torch.randn(66, generator=g)
    q8 = q8m.quantize(x, interpret=True)
    ref = x_hat(x) @ torch.cat([wa, wb]).T + bias.double()
    for cfg in [(16, 1, 1, 4, True), (32, 1, 2, 4, False)]:
        out = q8m.gemv_q8(q8, (ra, rb), bias=bias, out_dtype=torch.float32, config=cfg, interpret=True)
        assert out.shape == (1, 66) and rel_err(out, ref) < 1e-5, cfg


@pytest.mark.parametrize("T", [1, 2])
def test_moe_decode_q8_reads_selected_experts(Q, T):
    """ops.moe_ffn at T=1 with repacked stacked experts: the int8 expert-gather path, against
    float64 math on the same quantized activations (h, then silu(gate) * up per expert)."""
    import types

    import minfer.ops.cuda.moe as moe_mod
    from minfer.ops import paths

    q8m, G = Q
    E, Fe, D, k = 4, 256, 512, 2

    def stacked(qt, n, kk, seed):
        rw, w = _weight(G, qt, n, kk, seed)
        return types.SimpleNamespace(repacked=rw, shape=(n, kk), name=f"blk.0.x{seed}_exps.weight", qtype=qt), w

    (gw, wg), (uw, wu), (dw, wd) = stacked(12, E * Fe, D, 71), stacked(12, E * Fe, D, 72), stacked(14, E * D, Fe, 73)
    g = torch.Generator().manual_seed(4)
    # fp16 activations (float32 ones keep the exact grouped path), small enough that the random
    # weights' products stay in fp16's range
    h = (torch.randn(T, D, generator=g) * 1e-3).to(torch.float16)
    router = torch.randn(E, D, generator=g)
    if T == 1:
        h.q8 = q8m.quantize(h, interpret=True)       # attached by its producer in the engine
    paths.reset()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(moe_mod, "gemv_q8", q8m)
        mp.setattr(moe_mod, "gemv_q8_experts", sys.modules["minfer.ops.cuda.gemv_q8_experts"])   # (the fixture's)
        mp.setattr(moe_mod.dequant, "interpret", lambda: True)
        out = moe_mod.moe_ffn(h, router, gw, uw, dw, k, True)
    assert paths.snapshot()["counts"].get("moe.gather.q8") == 1
    ref = torch.zeros(T, D, dtype=torch.float64)
    h = h.float()
    for t in range(T):
        probs = torch.softmax(h[t:t + 1].double() @ router.double().T, -1)[0]
        wts, idx = probs.topk(k)
        wts = wts / wts.sum()
        for we, e in zip(wts.tolist(), idx.tolist()):
            gg = (x_hat(h[t:t + 1]) @ wg[e * Fe:(e + 1) * Fe].T).half().double()   # stored in h's dtype
            uu = (x_hat(h[t:t + 1]) @ wu[e * Fe:(e + 1) * Fe].T).half().double()
            a = torch.nn.functional.silu(gg) * uu
            ref[t] += we * (x_hat(a) @ wd[e * D:(e + 1) * D].T)[0]
    assert out.shape == (T, D) and rel_err(out, ref) < 2e-3


@pytest.mark.parametrize("qt", [12, 14], ids=NAMES.get)
def test_gemv_q8_swiglu_is_the_two_launches_bit_for_bit(Q, qt):
    """gate+up GEMV with SwiGLU in its epilogue (pair tickets) == gemv_q8 then swiglu_q8, every
    bit of h and of its q8 form; and h is silu(gate) * up of the exact products."""
    q8m, G = Q
    f, k = 512, 512
    rw, w = _weight(G, qt, 2 * f, k, seed=90 + qt)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(qt))
    q8 = q8m.quantize(x.bfloat16(), interpret=True)
    for cfg in [(32, 2, 1, 4, True), (64, 1, 1, 4, False)]:
        gu = q8m.gemv_q8(q8, rw, out_dtype=torch.bfloat16, config=cfg, interpret=True)
        h0, (q0, f0) = q8m.swiglu_q8(gu[:, :f].contiguous(), gu[:, f:].contiguous(), interpret=True)
        h1, (q1, f1) = q8m.gemv_q8_swiglu(q8, rw, out_dtype=torch.bfloat16, config=cfg, interpret=True)
        assert torch.equal(h0, h1) and torch.equal(q0, q1) and torch.equal(f0, f1), cfg
    ref = x_hat(x.bfloat16().float()) @ w.T
    want = torch.nn.functional.silu(ref[:, :f]) * ref[:, f:]
    assert rel_err(h1.float(), want) < 1e-2
    with pytest.raises(MinferError, match="gate; up"):
        q8m.gemv_q8_swiglu(q8, G.repack(torch.from_numpy(random_weight(qt, 2 * 288, k, np.random.default_rng(1))),
                                        qt, 2 * 288, k), config=(32, 2, 1, 4, True), interpret=True)


def test_gemv_q8_gluon_style_config_on_the_triton_kernel(Q):
    """A Gluon-style 4-tuple config (BN, BB, SPLIT, warps: the prefetch flag left out) that ends
    on the Triton kernel (here: the interpreter, where Gluon does not run) takes prefetch on, as
    the Gluon path reads it, and gives the 5-tuple's result."""
    q8m, G = Q
    rw, _ = _weight(G, 12, 256, 512, seed=7)
    q8 = q8m.quantize(torch.randn(1, 512, generator=torch.Generator().manual_seed(7)).bfloat16(), interpret=True)
    a = q8m.gemv_q8(q8, rw, out_dtype=torch.float32, config=(32, 2, 2, 4), interpret=True, gluon=True)
    b = q8m.gemv_q8(q8, rw, out_dtype=torch.float32, config=(32, 2, 2, 4, True), interpret=True)
    assert torch.equal(a, b)


def test_norm_weight_loaded_before_or_after_the_wait_is_the_same(Q):
    """Switches.pdl_preload: the RMSNorm + q8 kernel with the norm weight loaded before the PDL
    wait (PRE) and after it give the same bits (the same loads, only their place moves)."""
    q8m, _ = Q
    g = torch.Generator().manual_seed(11)
    x, y, nw = torch.randn(1, 1024, generator=g), torch.randn(1, 1024, generator=g), torch.randn(1024, generator=g)
    a = q8m.add_rms_norm_q8(x, y, nw, 1e-6, torch.float32, interpret=True, preload=True)
    b = q8m.add_rms_norm_q8(x, y, nw, 1e-6, torch.float32, interpret=True, preload=False)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert torch.equal(a[2][0], b[2][0]) and torch.equal(a[2][1], b[2][1])
    sv = (x + y).double()
    hv = sv * torch.rsqrt(sv.pow(2).mean(-1, keepdim=True) + 1e-6) * nw.double()
    assert rel_err(a[1], hv) < 1e-6
