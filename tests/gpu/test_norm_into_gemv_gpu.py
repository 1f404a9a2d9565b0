"""Switches.norm_into_gemv on the GPU: the Gluon q8 GEMV's NORM programs (gemv_q8_gluon._tile)
make the q8 row of rms_norm(x + y) * weight themselves and store x + y. Against the two launches
it replaces (add_rms_norm_q8, then the GEMV on its q8 row) at the 7B's q/k/v shapes -- all Q4_K,
and Q4_K q/k with a Q6_K v in one launch -- for several configs; against float64 math; and a
whole model's graphed greedy decode with it on and off. The row's sum of squares is summed in
another order than the norm kernel's, so a quantized value on a rounding edge may differ by one
step: the outputs agree to ~1e-5, not bit for bit; the residual x + y is the same float32 add."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ops"))
sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import random_weight, reference_dequant, rel_err  # noqa: E402

pytestmark = pytest.mark.gpu


def _weight(qt, n, k, seed):
    from minfer.ops.cuda import gemv_repack as G

    raw = random_weight(qt, n, k, np.random.default_rng(seed))
    return G.repack(torch.from_numpy(raw).cuda(), qt, n, k), torch.from_numpy(reference_dequant(raw, qt, n, k)).double().cuda()


@pytest.fixture(scope="module")
def qkv():
    ra, wa = _weight(12, 4096, 3584, seed=21)
    rb, wb = _weight(14, 512, 3584, seed=22)
    rc, wc = _weight(12, 4608, 3584, seed=23)
    return {"mixed": ((ra, rb), torch.cat([wa, wb])), "q4": (rc, wc)}


@pytest.mark.parametrize("kind", ["mixed", "q4"])
@pytest.mark.parametrize("cfg", [(32, 2, 4, 4, True), (8, 16, 1, 4, False), (16, 8, 2, 4, False), (32, 1, 1, 4)])
def test_norm_prologue_matches_the_two_launches(qkv, kind, cfg):
    from minfer.ops import paths
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda.gemv_repack import GemvWorkspace
    from minfer.ops.cuda.q8_rows import PreNorm

    segs, w = qkv[kind]
    ws = GemvWorkspace("cuda")
    g = torch.Generator(device="cuda").manual_seed(len(kind) + cfg[0])
    bias = torch.randn(4608, device="cuda", generator=g)
    nw = torch.rand(3584, device="cuda", generator=g) + 0.5
    for i in range(3):
        x = torch.randn(1, 3584, device="cuda", generator=g) * (1 + 3 * i)
        y = torch.randn(1, 3584, device="cuda", generator=g).to(torch.bfloat16)
        s0, h0, q80 = Q.add_rms_norm_q8(x, y, nw, 1e-6, torch.bfloat16)
        ref = Q.gemv_q8(q80, segs, bias=bias, out_dtype=torch.float32, ws=ws, gluon=True, config=cfg)
        s = torch.full((1, 3584), float("nan"), device="cuda")
        h = torch.empty((1, 3584), dtype=torch.bfloat16, device="cuda")
        pre = PreNorm(x, y, nw, 1e-6, s, h, False, 0, True, True)
        paths.reset()
        out = Q.gemv_q8(None, segs, bias=bias, out_dtype=torch.float32, ws=ws, gluon=True, config=cfg, prenorm=pre)
        snap = paths.snapshot()
        assert snap["counts"] == {"gemv_q8.norm_prologue": 1, "gemv_q8.gluon": 1} and not snap["fallbacks"], snap
        assert pre.q8 is None                                  # the norm kernel did not run
        assert torch.equal(s, s0), i                           # the residual: the same float32 add
        assert rel_err(out, ref) < 1e-4, (i, rel_err(out, ref))
        v = (x.double() + y.double())
        v = v / torch.sqrt((v * v).mean() + 1e-6) * nw.double()
        assert rel_err(out, v @ w.T + bias.double()) < 2e-2, i


@pytest.mark.parametrize("kind", ["mixed", "q4"])
def test_k_warps_config_runs_the_norm_kernel_first(qkv, kind):
    """A config splitting its warps along K (the eighth field; the shipped q/k/v config since
    2026-12-03) has no norm prologue: the deferred norm's own kernel runs first, counted as the
    prologue's fallback, and the GEMV on its q8 row matches the two launches."""
    from minfer.ops import paths
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda.gemv_repack import GemvWorkspace
    from minfer.ops.cuda.q8_rows import PreNorm

    segs, _ = qkv[kind]
    cfg = (8, 8, 1, 4, 2, 0, False, True)
    ws = GemvWorkspace("cuda")
    g = torch.Generator(device="cuda").manual_seed(17)
    nw = torch.rand(3584, device="cuda", generator=g) + 0.5
    x = torch.randn(1, 3584, device="cuda", generator=g)
    y = torch.randn(1, 3584, device="cuda", generator=g).to(torch.bfloat16)
    s0, _, q80 = Q.add_rms_norm_q8(x, y, nw, 1e-6, torch.bfloat16)
    ref = Q.gemv_q8(q80, segs, out_dtype=torch.float32, ws=ws, gluon=True, config=cfg)
    s = torch.full((1, 3584), float("nan"), device="cuda")
    h = torch.empty((1, 3584), dtype=torch.bfloat16, device="cuda")
    pre = PreNorm(x, y, nw, 1e-6, s, h, False, 0, True, True)
    paths.reset()
    out = Q.gemv_q8(None, segs, out_dtype=torch.float32, ws=ws, gluon=True, config=cfg, prenorm=pre)
    snap = paths.snapshot()
    assert snap["counts"] == {"gemv_q8.gluon": 1}, snap
    assert [k for k in snap["fallbacks"] if k.startswith("gemv_q8.norm_prologue") and "along K" in k], snap
    assert pre.q8 is not None                                  # the norm kernel ran
    assert torch.equal(s, s0)
    assert rel_err(out, ref) < 1e-4, rel_err(out, ref)


def test_graphed_decode_with_the_norm_in_the_gemv(tmp_path, monkeypatch):
    """A whole model's graphed greedy decode with norm_into_gemv = 1 against without it, every q8
    GEMV on the Gluon kernel (graphed_pair's rule), the same tokens; the fused launches counted,
    no fallback of them."""
    from graphed_pair import compare_decodes

    from minfer.switches import Switches

    snap = compare_decodes(tmp_path, monkeypatch, Switches(norm_into_gemv=1), Switches(norm_into_gemv=0), seed=9, prompt_seed=6,
                           n_prompt=11, same_prefill=True)
    counts = snap["counts"]
    assert counts.get("graph.decode.replay", 0) >= 40, counts
    assert counts.get("add_rms_norm.into_gemv", 0) == counts.get("gemv_q8.norm_prologue", 0) > 0, counts
    assert not [k for k in snap["fallbacks"] if "norm_prologue" in k or "into_gemv" in k], snap["fallbacks"]


# ---------------------------------------------------------------- mode 2: the residual from the down GEMV


@pytest.mark.parametrize("qt,cfg", [(12, None), (14, None), (12, (32, 2, 5, 4, True)), (14, (16, 1, 9, 2))])
def test_residual_epilogue_is_the_gemv_then_the_add(qt, cfg):
    """gemv_q8_residual at the 7B's down projection (the table's config, or one given): s is
    bit for bit x + the plain GEMV's bf16 output (same config, same sums) in float32, and each
    row tile's sum of squares matches float64 sums of s over its rows."""
    from minfer.ops import paths
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda import gemv_q8_gluon as GL
    from minfer.ops.cuda.gemv_repack import GemvWorkspace

    rw, _ = _weight(qt, 3584, 18944, seed=30 + qt)
    ws = GemvWorkspace("cuda")
    g = torch.Generator(device="cuda").manual_seed(qt)
    bn = (cfg or GL.config_for(qt, 3584, 18944))[0]
    for i in range(3):
        a = torch.randn(1, 18944, device="cuda", generator=g).to(torch.bfloat16)
        x = torch.randn(1, 3584, device="cuda", generator=g) * 5
        q8 = Q.quantize(a)
        y = Q.gemv_q8(q8, rw, out_dtype=torch.bfloat16, ws=ws, gluon=True, config=cfg)
        paths.reset()
        r = Q.gemv_q8_residual(q8, rw, x, torch.bfloat16, ws=ws, gluon=True, config=cfg)
        assert r is not None
        s, ssp = r
        assert paths.snapshot()["counts"] == {"gemv_q8.gluon": 1, "gemv_q8.residual_sumsq": 1}
        assert torch.equal(s, x + y.float()), i
        want = torch.nn.functional.pad((s.double() ** 2).view(-1), (0, ssp.numel() * bn - 3584)).view(-1, bn).sum(1)
        assert torch.allclose(ssp.double(), want, rtol=1e-5, atol=0), i


def test_norm_from_tile_sums_matches_the_two_launches(qkv):
    """The q/k/v GEMV taking its norm from the residual s and the down GEMV's tile sums (NORM 2)
    against the norm kernel on s, then the GEMV: outputs within 1e-4 (the sums' order differs)."""
    from minfer.ops import paths
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda import q8_rows
    from minfer.ops.cuda.gemv_repack import GemvWorkspace
    from minfer.ops.cuda.q8_rows import PreNorm

    rd, _ = _weight(12, 3584, 18944, seed=41)
    segs, w = qkv["mixed"]
    ws = GemvWorkspace("cuda")
    g = torch.Generator(device="cuda").manual_seed(4)
    nw = torch.rand(3584, device="cuda", generator=g) + 0.5
    for i in range(3):
        a = torch.randn(1, 18944, device="cuda", generator=g).to(torch.bfloat16)
        x = torch.randn(1, 3584, device="cuda", generator=g) * (1 + 3 * i)
        s, ssp = Q.gemv_q8_residual(Q.quantize(a), rd, x, torch.bfloat16, ws=ws, gluon=True)
        _, _, q80 = q8_rows._q8_launch(s, None, None, nw, 1e-6, torch.bfloat16, False)
        cfg = (32, 2, 4, 4, True)       # (the shipped q/k/v config splits warps along K: no norm prologue)
        ref = Q.gemv_q8(q80, segs, out_dtype=torch.float32, ws=ws, gluon=True, config=cfg)
        h = torch.empty((1, 3584), dtype=torch.bfloat16, device="cuda")
        pre = PreNorm(s, None, nw, 1e-6, s, h, False, 0, True, True, ssp=ssp)
        paths.reset()
        out = Q.gemv_q8(None, segs, out_dtype=torch.float32, ws=ws, gluon=True, prenorm=pre, config=cfg)
        snap = paths.snapshot()
        assert snap["counts"] == {"gemv_q8.norm_prologue": 1, "gemv_q8.gluon": 1} and not snap["fallbacks"], snap
        assert pre.q8 is None
        assert rel_err(out, ref) < 1e-4, (i, rel_err(out, ref))


def test_graphed_decode_with_the_residual_and_norm_in_the_gemvs(tmp_path, monkeypatch):
    """norm_into_gemv = 2 in a whole model's graphed greedy decode against 0 (graphed_pair's rule):
    the same tokens; the down GEMVs' residual epilogue and the q/k/v norm counted, no fallback of
    either."""
    from graphed_pair import compare_decodes

    from minfer.switches import Switches

    snap = compare_decodes(tmp_path, monkeypatch, Switches(norm_into_gemv=2), Switches(norm_into_gemv=0), seed=10, prompt_seed=7,
                           n_prompt=12, same_prefill=True)
    counts = snap["counts"]
    assert counts.get("qmatmul.residual_norm", 0) == counts.get("gemv_q8.residual_sumsq", 0) > 0, counts
    assert counts.get("gemv_q8.norm_prologue", 0) == counts["qmatmul.residual_norm"], counts
    assert not [k for k in snap["fallbacks"] if "norm" in k], snap["fallbacks"]


# ---------------------------------------------------------------- mode 3: the norm in the down GEMV's tail


@pytest.mark.parametrize("qt,cfg", [(12, None), (14, None), (12, (32, 2, 1, 4, True)), (14, (16, 1, 9, 2))])
def test_norm_tail_matches_the_norm_kernel_on_s(qt, cfg):
    """gemv_q8_residual with the norm tail (Switches.norm_into_gemv = 3) at the 7B's down shape, split
    and unsplit configs: s is the mode-2 epilogue's, bit for bit; h and its q8 form against the
    norm kernel run on that s (q8_rows: the sum of squares in another order, so h within bf16
    rounding and the q8 words within one step at a flip); five launches on one workspace leave
    its counters at zero."""
    from minfer.ops import paths
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda import q8_rows
    from minfer.ops.cuda.gemv_repack import GemvWorkspace

    rw, _ = _weight(qt, 3584, 18944, seed=50 + qt)
    ws = GemvWorkspace("cuda")
    g = torch.Generator(device="cuda").manual_seed(qt + 7)
    nw = torch.rand(3584, device="cuda", generator=g) + 0.5
    for i in range(5):
        a = torch.randn(1, 18944, device="cuda", generator=g).to(torch.bfloat16)
        x = torch.randn(1, 3584, device="cuda", generator=g) * (1 + 3 * i)
        q8 = Q.quantize(a)
        s2, _ = Q.gemv_q8_residual(q8, rw, x, torch.bfloat16, ws=ws, gluon=True, config=cfg)
        paths.reset()
        r = Q.gemv_q8_residual(q8, rw, x, torch.bfloat16, ws=ws, gluon=True, config=cfg, tail=(nw, 1e-6))
        assert r is not None
        s, _, h = r
        snap = paths.snapshot()
        assert snap["counts"] == {"gemv_q8.gluon": 1, "gemv_q8.residual_sumsq": 1, "gemv_q8.norm_tail": 1}, snap
        assert torch.equal(s, s2), i
        _, href, (rq, rf) = q8_rows._q8_launch(s, None, None, nw, 1e-6, torch.bfloat16, False)
        hq, hf = h.q8
        assert rel_err(h, href.double()) < 1e-2, i
        fa, fb = hf.view(-1, 4), rf.view(-1, 4)
        assert rel_err(fa[:, 0], fb[:, 0].double()) < 1e-5 and torch.equal(fa[:, 3], fb[:, 3]), i   # d; 0
        # s0, s1 = d * the half sums of q: a flipped value moves one by d
        assert bool(((fa[:, 1:3] - fb[:, 1:3]).abs() <= 1.01 * fb[:, :1] + 1e-12).all()), i
        # int8 values, one byte a value: at most a rounding flip (one step) anywhere
        qa = hq.view(torch.int8).to(torch.int32)
        qb = rq.view(torch.int8).to(torch.int32)
        assert int((qa - qb).abs().max()) <= 1 and float((qa != qb).float().mean()) < 1e-2, i
        assert int(ws.cnt.abs().sum()) == 0, i


def test_graphed_decode_with_the_norm_tail(tmp_path, monkeypatch):
    """norm_into_gemv = 3 in a whole model's graphed greedy decode against 0 (graphed_pair's rule):
    the down GEMVs make the next layer's normed row, no norm launch before q/k/v."""
    from graphed_pair import compare_decodes

    from minfer.switches import Switches

    snap = compare_decodes(tmp_path, monkeypatch, Switches(norm_into_gemv=3), Switches(norm_into_gemv=0), seed=12, prompt_seed=8,
                           n_prompt=9)
    c = snap["counts"]
    assert c.get("gemv_q8.norm_tail", 0) > 0 and c.get("qmatmul.residual_norm", 0) == c["gemv_q8.norm_tail"], c
    assert "add_rms_norm.into_gemv" not in c and "gemv_q8.norm_prologue" not in c, c
    assert not [k for k in snap["fallbacks"] if "norm" in k], snap["fallbacks"]


# ---------------------------------------------------------------- mode 4: the q8 row without rstd, rstd in the next GEMV


@pytest.mark.parametrize("qt,n,k,cfg", [(12, 3584, 18944, None), (14, 3584, 18944, (32, 2, 5, 4, True)),
                                        (12, 3584, 3584, (32, 16, 1, 8)), (12, 3584, 3584, (32, 2, 4, 4, True))])
def test_residual_q8_epilogue_is_the_q8_of_s_times_weight(qt, n, k, cfg):
    """gemv_q8_residual with rq (Switches.norm_into_gemv = 4) at the 7B's down and o shapes, split and
    one-step configs: s and the tile sums are mode 2's bit for bit, and the q8 row is the q8 kernel's
    on s * weight (the same float32 product): the same scales, the words within a rounding flip;
    counted, the workspace's tickets left at zero. Each of these with rq_smem (RQ 2: the values to
    the q8 layout through shared memory, the weight loaded early) and without (RQ 1: the read-back),
    bit for bit the same."""
    from minfer.ops import paths
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda.gemv_repack import GemvWorkspace

    rw, _ = _weight(qt, n, k, seed=60 + qt + k // 1000)
    ws = GemvWorkspace("cuda")
    g = torch.Generator(device="cuda").manual_seed(qt + 3)
    nw = torch.rand(n, device="cuda", generator=g) + 0.5
    for i in range(3):
        a = torch.randn(1, k, device="cuda", generator=g).to(torch.bfloat16)
        x = torch.randn(1, n, device="cuda", generator=g) * (1 + 3 * i)
        q8 = Q.quantize(a)
        s2, ssp2 = Q.gemv_q8_residual(q8, rw, x, torch.bfloat16, ws=ws, gluon=True, config=cfg)
        s1, ssp1, (hq1, hf1) = Q.gemv_q8_residual(q8, rw, x, torch.bfloat16, ws=ws, gluon=True, config=cfg, rq=nw,
                                                  rq_smem=False)
        paths.reset()
        s, ssp, (hq, hf) = Q.gemv_q8_residual(q8, rw, x, torch.bfloat16, ws=ws, gluon=True, config=cfg, rq=nw,
                                              rq_smem=True)
        assert paths.snapshot()["counts"] == {"gemv_q8.gluon": 1, "gemv_q8.residual_sumsq": 1,
                                              "gemv_q8.residual_q8": 1}
        assert torch.equal(s, s2) and torch.equal(ssp, ssp2), i
        assert torch.equal(s1, s) and torch.equal(ssp1, ssp) and torch.equal(hq1, hq) and torch.equal(hf1, hf), i
        rq_, rf_ = Q.quantize(s * nw)
        fa, fb = hf.view(-1, 4), rf_.view(-1, 4)
        assert torch.equal(fa[:, 0], fb[:, 0]) and torch.equal(fa[:, 3], fb[:, 3]), i       # d (amax / 127); 0
        # the words: the same operations, but either compiler may contract v * inv + 0.5 into an fma:
        # a value on a rounding edge may flip one step (and move s0 / s1 by d)
        qa, qb = hq.view(torch.int8).to(torch.int32), rq_.view(torch.int8).to(torch.int32)
        assert int((qa - qb).abs().max()) <= 1 and float((qa != qb).float().mean()) < 1e-3, i
        assert bool(((fa[:, 1:3] - fb[:, 1:3]).abs() <= 1.01 * fb[:, :1] + 1e-12).all()), i
        assert int(ws.cnt.abs().sum()) == 0, i


@pytest.mark.parametrize("kind,cfg", [("mixed", (8, 16, 1, 4, 2, 0, False, True, True)), ("q4", (8, 16, 1, 4, 2, 0, False, True)),
                                      ("q4", (32, 2, 4, 4, True)), ("q4", (32, 1, 1, 4, 1, 0, 0, 0, 0, 0, 1))])
def test_norm_scale_matches_the_norm_kernel(qkv, kind, cfg):
    """The next GEMV on mode 4's row (the q8 of s * weight) scaling its row sums by rstd from the tile
    sums (NORM 4), at the 7B's q/k/v shapes with the shipped K-warps configs, a split one and gate/up's
    x-ahead one: against the norm kernel on s then the GEMV (the same q8 words but at rounding edges;
    rstd applied to the sums instead of the values) within 1e-4, and against float64 math; counted,
    nothing materialized. With rstd_late (Switches.norm_rstd_late: the tile sums summed after the K
    loop) the same output bit for bit."""
    from minfer.ops import paths
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda import q8_rows
    from minfer.ops.cuda.gemv_repack import GemvWorkspace
    from minfer.ops.cuda.q8_rows import PreNorm

    rd, _ = _weight(12, 3584, 18944, seed=71)
    segs, w = qkv[kind]
    ws = GemvWorkspace("cuda")
    g = torch.Generator(device="cuda").manual_seed(8)
    nw = torch.rand(3584, device="cuda", generator=g) + 0.5
    bias = torch.randn(4608, device="cuda", generator=g)
    for i in range(3):
        a = torch.randn(1, 18944, device="cuda", generator=g).to(torch.bfloat16)
        x = torch.randn(1, 3584, device="cuda", generator=g) * (1 + 3 * i)
        s, ssp, q8u = Q.gemv_q8_residual(Q.quantize(a), rd, x, torch.bfloat16, ws=ws, gluon=True, rq=nw)
        _, _, q80 = q8_rows._q8_launch(s, None, None, nw, 1e-6, torch.bfloat16, False)
        ref = Q.gemv_q8(q80, segs, bias=bias, out_dtype=torch.float32, ws=ws, gluon=True, config=cfg)
        h = torch.empty((1, 3584), dtype=torch.bfloat16, device="cuda")
        pre = PreNorm(s, None, nw, 1e-6, s, h, False, 0, True, True, ssp=ssp, q8u=q8u)
        paths.reset()
        out = Q.gemv_q8(None, segs, bias=bias, out_dtype=torch.float32, ws=ws, gluon=True, prenorm=pre, config=cfg,
                        rstd_late=False)
        snap = paths.snapshot()
        assert snap["counts"] == {"gemv_q8.norm_scale": 1, "gemv_q8.gluon": 1} and not snap["fallbacks"], snap
        assert pre.q8 is None
        assert rel_err(out, ref) < 1e-4, (i, rel_err(out, ref))
        v = s.double() / torch.sqrt((s.double() ** 2).mean() + 1e-6) * nw.double()
        assert rel_err(out, v @ w.T + bias.double()) < 2e-2, i
        late = Q.gemv_q8(None, segs, bias=bias, out_dtype=torch.float32, ws=ws, gluon=True, config=cfg, rstd_late=True,
                         prenorm=PreNorm(s, None, nw, 1e-6, s, h, False, 0, True, True, ssp=ssp, q8u=q8u))
        assert torch.equal(late, out), (i, rel_err(late, out))


def test_graphed_decode_with_the_norm_scale(tmp_path, monkeypatch):
    """norm_into_gemv = 4 in a whole model's graphed greedy decode against 0 (graphed_pair's rule):
    both residual GEMVs of every layer but the last down (o before gate/up, down before the next
    q/k/v) make the q8 row, each read by the next GEMV with rstd; no norm launch between them and
    no fallback."""
    from graphed_pair import compare_decodes

    from minfer.switches import Switches

    snap = compare_decodes(tmp_path, monkeypatch, Switches(norm_into_gemv=4), Switches(norm_into_gemv=0), seed=13, prompt_seed=9,
                           n_prompt=10, same_prefill=True)
    c = snap["counts"]
    assert c.get("gemv_q8.residual_q8", 0) > 0 and c["gemv_q8.residual_q8"] == c.get("gemv_q8.norm_scale", 0), c
    assert c["gemv_q8.residual_q8"] == c.get("qmatmul.residual_norm", 0), c
    assert "add_rms_norm.into_gemv" not in c and "gemv_q8.norm_prologue" not in c, c
    assert not [k for k in snap["fallbacks"] if "norm" in k], snap["fallbacks"]


def test_graphed_decode_with_the_mode_5(tmp_path, monkeypatch):
    """norm_into_gemv = 5 (mode 4 for the norm before q/k/v only; the default until 2026-12-04) in a
    whole model's graphed greedy decode against 0: every down but the last makes the next layer's q8
    row, each read by that layer's q/k/v with rstd; the o projection keeps its norm kernel; no
    fallback."""
    from graphed_pair import compare_decodes

    from minfer.switches import Switches

    snap = compare_decodes(tmp_path, monkeypatch, Switches(norm_into_gemv=5), Switches(norm_into_gemv=0), seed=14,
                           prompt_seed=10, n_prompt=10, same_prefill=True)
    c = snap["counts"]
    assert c.get("gemv_q8.residual_q8", 0) > 0 and c["gemv_q8.residual_q8"] == c.get("gemv_q8.norm_scale", 0), c
    assert c["gemv_q8.residual_q8"] == c.get("qmatmul.residual_norm", 0), c
    assert c.get("add_rms_norm.q8", 0) > 0          # the FFN norms (both engines) and engine b's attention norms
    assert not [k for k in snap["fallbacks"] if "norm" in k], snap["fallbacks"]


def test_default_mode_4_signals_gate_up_when_o_ends(tmp_path, monkeypatch):
    """The default (norm_into_gemv = 4 with rq_smem and norm_rstd_late) in a whole model's graphed
    greedy decode against mode 4 without those two moves -- the same bits by construction, so every
    step's logits equal -- with each residual Gluon launch recorded: the o projection's (K = heads x
    head dim, before gate+up) signal the next kernel at their programs' end (late), the downs' (K =
    the FFN width) as their config says (not late); no fallback. (Against mode 0 this seed's logits
    differ by ~0.5% at most steps, call 5 of 2026-12-04b: see perf-log AL4.)"""
    from graphed_pair import compare_decodes

    from minfer.ops.cuda import gemv_q8_gluon as GL
    from minfer.switches import Switches

    assert Switches().norm_into_gemv == 4 and Switches().rq_smem and Switches().norm_rstd_late
    seen = []
    real = GL.launch

    def launch(segs, *a, **kw):
        if kw.get("rss") is not None:
            seen.append((segs[0].k, bool(kw.get("late")), kw.get("rss_q8") is not None))
        return real(segs, *a, **kw)

    monkeypatch.setattr(GL, "launch", launch)
    errs = []
    snap = compare_decodes(tmp_path, monkeypatch, None,
                           Switches(norm_into_gemv=4, rq_smem=False, norm_rstd_late=False),
                           seed=14, prompt_seed=10, n_prompt=10, same_prefill=True, errs=errs)
    assert errs and max(errs) == 0.0, errs
    c = snap["counts"]
    assert c.get("gemv_q8.residual_q8", 0) > 0 and c["gemv_q8.residual_q8"] == c.get("gemv_q8.norm_scale", 0), c
    assert not [k for k in snap["fallbacks"] if "norm" in k], snap["fallbacks"]
    ks = sorted({k for k, _, _ in seen})
    assert len(ks) == 2, seen                        # o (K = the model width here) and the down (K = the FFN's)
    o_k, down_k = ks                                 # the tiny preset's FFN (1024) is wider than its heads
    assert all(late for k, late, q8 in seen if k == o_k) and any(k == o_k for k, _, _ in seen)
    assert not any(late for k, late, _ in seen if k == down_k)
    assert all(q8 for k, _, q8 in seen if k == o_k)


# ------------------------------------------- the same modes with their loads moved (rq_smem, norm_rstd_late)


@pytest.mark.parametrize("mode", [5, 4])
def test_graphed_decode_with_the_norm_loads_moved(tmp_path, monkeypatch, mode):
    """norm_into_gemv 5 and 4 (the default) with both load moves (rq_smem, norm_rstd_late; the q/k/v
    rope kernel's NORM 4 too) in a whole model's graphed greedy decode against 0 (graphed_pair's
    rule); the same counts as without them, no fallback."""
    from graphed_pair import compare_decodes

    from minfer.switches import Switches

    snap = compare_decodes(tmp_path, monkeypatch, Switches(norm_into_gemv=mode, rq_smem=True, norm_rstd_late=True),
                           Switches(norm_into_gemv=0), seed=15 + mode, prompt_seed=11, n_prompt=10, same_prefill=True)
    c = snap["counts"]
    assert c.get("gemv_q8.residual_q8", 0) > 0 and c["gemv_q8.residual_q8"] == c.get("gemv_q8.norm_scale", 0), c
    assert not [k for k in snap["fallbacks"] if "norm" in k], snap["fallbacks"]


def test_o_signal_after_its_dots_gives_the_same_decode(tmp_path, monkeypatch):
    """Switches.o_signal 2 (o lets gate+up launch after its dot products, before its epilogue: PDL
    mode 4) only moves a launch, so a whole graphed greedy decode equals the default's at every step;
    counted the same."""
    from graphed_pair import compare_decodes

    from minfer.switches import Switches

    errs = []
    snap = compare_decodes(tmp_path, monkeypatch, Switches(o_signal=2), None, seed=16, prompt_seed=12, n_prompt=10,
                           same_prefill=True, errs=errs)
    assert errs and max(errs) == 0.0, errs
    # (compare_decodes' config splits K, so the q/k/v rope epilogue falls back by design; o's must not)
    assert snap["counts"].get("gemv_q8.residual_q8", 0) > 0, snap
    assert not [k for k in snap["fallbacks"] if "residual" in k or "norm" in k], snap["fallbacks"]
