"""The int8-activation decode GEMV (minfer.ops.cuda.gemv_q8) on the GPU: the PTX dp4a path at
the 7B shapes, split K, CUDA-graph replays, the fused producers. References: the gguf package's
dequant of the raw blocks (kernel_data) and float64 torch math. The GEMV is checked exactly
(up to fp32 summation) against the x_hat its q8 row stands for; that row is checked against x
quantized here by llama.cpp's quantize_row_q8_1 rule, where only exact ties (t = j + 1/2, common
with bf16 inputs: v = amax/2 gives 63.5) may round the other way after fp32 rounding."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

from minfer.errors import MinferError

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ops"))
sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import random_weight, reference_dequant, rel_err  # noqa: E402

pytestmark = pytest.mark.gpu
NAMES = {12: "Q4_K", 14: "Q6_K"}


def x_hat(v):
    b = v.double().view(-1, 32)
    d = b.abs().amax(1, keepdim=True) / 127
    t = torch.where(d > 0, b / d, torch.zeros_like(b))
    return (torch.sign(t) * torch.floor(t.abs() + 0.5) * d).view(1, -1)


def check_q8(q8, v):
    """The q8 row equals x_hat(v) except at near-ties, where it is one step off."""
    from minfer.ops.cuda import gemv_q8 as Q

    got = Q.dequantize_q8(q8, v.shape[1]).double()
    b = v.double().view(-1, 32)
    d = b.abs().amax(1, keepdim=True) / 127
    t = torch.where(d > 0, b / d, torch.zeros_like(b)).view(1, -1)
    tie = ((t.abs() - t.abs().floor()) - 0.5).abs() < 1e-4
    diff = (got - x_hat(v)).abs()
    step = d.expand(-1, 32).reshape(1, -1)
    assert bool(((diff <= 1e-4 * step + 1e-12) | (tie & (diff < step * 1.0001))).all())
    return got


def _weight(qt, n, k, seed):
    from minfer.ops.cuda import gemv_repack as G

    raw = random_weight(qt, n, k, np.random.default_rng(seed))
    rw = G.repack(torch.from_numpy(raw).cuda(), qt, n, k)
    return rw, torch.from_numpy(reference_dequant(raw, qt, n, k)).double().cuda()


@pytest.mark.parametrize("qt,n,k", [(12, 4608, 3584), (12, 3584, 18944), (14, 3584, 18944), (14, 1000, 3584),
                                    (12, 517, 768)])
def test_gemv_q8_shapes(qt, n, k):
    from minfer.ops import paths
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda.gemv_repack import GemvWorkspace

    rw, w = _weight(qt, n, k, seed=n + qt)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    q8 = Q.quantize(x)
    ref = check_q8(q8, x.float()) @ w.T
    ws = GemvWorkspace("cuda")
    for cfg in (None, (64, 1, 1, 4, True), (32, 2, 7, 2, False), (128, 1, 4, 8, True)):
        out = Q.gemv_q8(q8, rw, out_dtype=torch.float32, config=cfg, ws=ws)
        assert rel_err(out, ref) < 1e-5, cfg
    # the Gluon kernel (gemv_q8_gluon.py) with explicit configs (odd K tails, row masks), and with
    # none: its table's config where the shape has one, else the Triton kernel
    from minfer.ops.cuda import gemv_q8_gluon as GL

    paths.reset()
    cfgs = (None, (64, 1, 1, 4), (32, 2, 7, 2), (128, 1, 4, 8), (16, 2, 3, 2), (32, 4, 2, 4),
            (8, 16, 1, 4, False), (16, 8, 2, 4, False), (32, 4, 3, 4, False), (16, 16, 1, 8, False),
            (32, 4, 10, 4, 2), (16, 2, 37, 2, 2, 96),      # prefetch 2: splits of one or two steps at every K
            (8, 8, 1, 4, 1, 0, 0, 1), (8, 8, 3, 4, 1, 0, 0, 1), (16, 16, 1, 8, 0, 0, 0, 1))     # warps along K
    for cfg in cfgs:
        out = Q.gemv_q8(q8, rw, out_dtype=torch.float32, config=cfg, ws=ws, gluon=True)
        assert rel_err(out, ref) < 1e-5, ("gluon", cfg)
    counts = paths.snapshot()
    tabled = GL.config_for(qt, n, k) is not None
    assert counts["counts"].get("gemv_q8.gluon", 0) == len(cfgs) - 1 + tabled, counts
    assert counts["counts"].get("gemv_q8.triton", 0) == (not tabled) and not counts["fallbacks"], counts
    # the unquantized product differs only by the int8 rounding of x
    assert rel_err(out, x.double() @ w.T) < 2e-2
    # prefetch 2 with a split of more than two steps is refused, naming the shape
    with pytest.raises(MinferError, match=f"{n}x{k}: prefetch 2"):
        Q.gemv_q8(q8, rw, out_dtype=torch.float32, config=(32, 1, 1, 4, 2), ws=ws, gluon=True)
    # and warps along K with fewer than 16 chunks a warp
    with pytest.raises(MinferError, match=f"{n}x{k}: warps along K"):
        Q.gemv_q8(q8, rw, out_dtype=torch.float32, config=(8, 2, 4, 4, 1, 0, 0, 1), ws=ws, gluon=True)


@pytest.mark.parametrize("gluon", [False, True])
def test_gemv_q8_graph_replays_and_producers(gluon):
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda.gemv_repack import GemvWorkspace

    k, n = 3584, 4608
    rw, w = _weight(12, n, k, seed=3)
    ws = GemvWorkspace("cuda")
    x = torch.randn(1, k, device="cuda")
    y = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    nw = torch.randn(k, device="cuda")
    bias = torch.randn(n, device="cuda")

    qs = []

    def step():
        s, h, q8 = Q.add_rms_norm_q8(x, y, nw, 1e-6, torch.bfloat16)
        qs.append(q8)
        cfg = (64, 1, 6, 4) if gluon else (64, 1, 6, 4, True)
        return s, h, Q.gemv_q8(q8, rw, bias=bias, out_dtype=torch.float32, config=cfg, ws=ws, gluon=gluon, pdl=1)

    step()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        s, h, out = step()
    for i in range(3):
        x.normal_()
        g.replay()
        torch.cuda.synchronize()
        sv = x.double() + y.double()
        hv = sv * torch.rsqrt(sv.pow(2).mean(-1, keepdim=True) + 1e-6) * nw.double()
        assert torch.equal(s, x + y.float())
        assert rel_err(h.float(), hv) < 1e-2
        assert rel_err(out, check_q8(qs[-1], hv) @ w.T + bias.double()) < 1e-5, i
    hs, q8s = Q.swiglu_q8(y[:, :3584].contiguous(), y.flip(1).contiguous())
    sw = torch.nn.functional.silu(y.double()) * y.flip(1).double()
    assert rel_err(Q.gemv_q8(q8s, rw, out_dtype=torch.float32, ws=ws), check_q8(q8s, sw) @ w.T) < 1e-5


@pytest.mark.parametrize("style", ["normal", "neox"])
def test_rope_kv_write_gpu(style):
    """The fused rope + KV append at the 7B's head shapes (28 q, 4 kv heads of 128), bf16."""
    from minfer.config import RopeConfig
    from minfer.ops import reference
    from minfer.ops.cuda import rope_kv_write

    cfg = RopeConfig(theta=1e6, style=style, n_rot=128)
    H, Hkv, Dh, S = 28, 4, 128, 4096
    qkv = torch.randn(1, (H + 2 * Hkv) * Dh, device="cuda", dtype=torch.bfloat16)
    q, k, v = torch.split(qkv, [H * Dh, Hkv * Dh, Hkv * Dh], dim=1)
    q, k, v = q.view(1, H, Dh), k.view(1, Hkv, Dh), v.view(1, Hkv, Dh)
    pos = torch.tensor([3353], device="cuda")
    kc = torch.zeros(S, Hkv, Dh, device="cuda", dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    qr = rope_kv_write(q, k, v, pos, cfg, kc, vc)
    assert rel_err(qr.float(), reference.rope(q.float().cpu(), pos.cpu(), cfg).cuda()) < 1e-2
    assert rel_err(kc[3353].float(), reference.rope(k.float().cpu(), pos.cpu(), cfg)[0].cuda()) < 1e-2
    assert torch.equal(vc[3353], v[0]) and int((kc != 0).any(-1).any(-1).sum()) == 1


def test_gemv_q8_mixed_segments_gpu():
    """q+k (Q4_K, 4096 rows) and v (Q6_K, 512 rows) of the 7B in one launch, with the qkv bias."""
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda.gemv_repack import GemvWorkspace

    ra, wa = _weight(12, 4096, 3584, seed=11)
    rb, wb = _weight(14, 512, 3584, seed=12)
    x = torch.randn(1, 3584, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(4608, device="cuda")
    q8 = Q.quantize(x)
    ref = check_q8(q8, x.float()) @ torch.cat([wa, wb]).T + bias.double()
    for gluon, cfg in ((False, None), (True, (32, 2, 4, 4)), (True, (8, 16, 1, 4, False)),
                       (True, (16, 8, 2, 4, False)), (True, (32, 2, 4, 4, 2, 96)), (True, (16, 2, 4, 2, 2)),
                       (True, (8, 8, 1, 4, 2, 96, 0, 1)), (True, (8, 8, 1, 4, 2, 0, 0, 1)),
                       (True, (8, 8, 1, 4, 2, 0, 0, 1, 1)), (True, (32, 2, 4, 4, 1, 0, 0, 0, 1)),
                       (True, (16, 2, 3, 2, 1, 0, 0, 0, 1))):      # (the v's tiles first; split K too)
        out = Q.gemv_q8(q8, (ra, rb), bias=bias, out_dtype=torch.float32, ws=GemvWorkspace("cuda"), gluon=gluon,
                        config=cfg)
        assert rel_err(out, ref) < 1e-5, (gluon, cfg)


@pytest.mark.parametrize("qt", [12, 14])
def test_gemv_q8_swiglu_7b_shape_bitwise(qt):
    """The gate+up GEMV with SwiGLU in its epilogue at the 7B shape == the GEMV then swiglu_q8."""
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda.gemv_repack import GemvWorkspace

    f, k = 18944, 3584
    rw, w = _weight(qt, 2 * f, k, seed=11 + qt)
    ws = GemvWorkspace("cuda")
    for i in range(3):
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        q8 = Q.quantize(x)
        gu = Q.gemv_q8(q8, rw, out_dtype=torch.bfloat16, ws=ws, config=(32, 2, 1, 4, True))
        h0, (q0, f0) = Q.swiglu_q8(gu[:, :f].contiguous(), gu[:, f:].contiguous())
        h1, (q1, f1) = Q.gemv_q8_swiglu(q8, rw, out_dtype=torch.bfloat16, ws=ws, config=(32, 2, 1, 4, True))
        assert torch.equal(h0, h1) and torch.equal(q0, q1) and torch.equal(f0, f1), i


def test_graphed_decode_with_the_gluon_gemv(tmp_path, monkeypatch):
    """A whole model's graphed greedy decode with every q8 GEMV on the Gluon kernel (its table
    widened to the tiny model's shapes) against the Triton kernel: the same tokens, logits within
    fp32 summation order (graphed_pair's rule: the two kernels sum in different orders; at most a
    few of the 24 steps may flip a bf16 rounding -- 2026-12-01: step 13 at 6.4e-3, call 2 of the
    fifth session, after the norm's sum order changed), and the Gluon launches counted. Both engines
    with the norm kernel (norm_into_gemv 0): the default's mode 5 is Gluon-only, so it would be a
    second difference between them (its own test: test_norm_into_gemv_gpu.py); with it on one side
    step 13's near-tie parted the greedy tokens (2026-12-03, call 4 of the thirteenth session)."""
    from graphed_pair import compare_decodes

    from minfer.switches import Switches

    snap = compare_decodes(tmp_path, monkeypatch, Switches(norm_into_gemv=0),
                           Switches(gemv_q8_gluon=False, norm_into_gemv=0), seed=8, prompt_seed=5, n_prompt=9)
    counts = snap["counts"]
    assert counts.get("gemv_q8.gluon", 0) > 0 and counts.get("gemv_q8.triton", 0) > 0, counts


# ---------------------------------------------------------------- the Gluon GEMV's SwiGLU epilogue

def _check_q8_of(hq, h):
    """hq is a q8 form (gemv_q8's module doc) of the float32 values h (bf16) was rounded from:
    per 32 values, |q| reaches 127 (0 only for an all-zero chunk), each d * q lies within half a
    step d of its value (slack: d and 127/amax are approximate divisions, a few 1e-7 relative;
    plus h's own bf16 rounding, <= 2^-9 |h|), s0 / s1 are d times the two halves' sums of q, the
    4th float is 0. Returns x_hat (float64, chunks of 32)."""
    from minfer.ops.cuda import gemv_q8 as Q

    xq, xf = hq
    f = h.shape[1]
    q = xq.view(torch.int8).view(-1, 8, 4).permute(0, 2, 1).reshape(-1, 32).double()   # value 8b + 4h + w
    fl = xf.view(-1, 4).double()
    d = fl[:, :1]
    got = q * d                                               # exact in float64
    assert torch.equal(Q.dequantize_q8(hq, f).view(-1, 32), got.float())    # the layout the GEMV reads
    hv = h.double().view(-1, 32)
    amax = q.abs().amax(1)
    assert bool(((amax == 127) | ((amax == 0) & (d[:, 0] == 0) & (hv.abs().amax(1) == 0))).all())
    assert bool(((got - hv).abs() <= 0.501 * d + hv.abs() * 2.0 ** -8).all())
    assert torch.allclose(fl[:, 1], got[:, :16].sum(1), rtol=1e-6, atol=0)
    assert torch.allclose(fl[:, 2], got[:, 16:].sum(1), rtol=1e-6, atol=0)
    assert bool((fl[:, 3] == 0).all())
    return got


# (qtype, F, K, config): the 7B's gate+up (Q4_K from the Gluon table, [32, 1, 1, 4]; Q6_K with
# that config given), and small shapes with explicit configs: an odd K tail (3 blocks in steps of
# 2), no prefetch, 128-row tiles of 8 warps
GLU_CASES = [(12, 18944, 3584, None), (14, 18944, 3584, (32, 1, 1, 4)), (12, 512, 768, (32, 1, 1, 4)),
             (12, 512, 768, (64, 2, 1, 4, False)), (14, 1024, 1280, (128, 1, 1, 8))]


@pytest.mark.parametrize("qt,f,k,cfg", GLU_CASES)
def test_gemv_q8_swiglu_gluon(qt, f, k, cfg):
    """gemv_q8_swiglu(gluon=True): the Gluon GEMV with the SwiGLU pair epilogue, one launch
    counted as gemv_q8.gluon, against (a) float64 silu(Wg x_hat) * (Wu x_hat) from the dequantized
    planes and q8 row; (b) the Gluon GEMV then swiglu_q8, bit for bit (the same row sums, and
    the epilogue is swiglu_q8's arithmetic: bf16 g and u, exp, div.full, the rounding FMA); (c)
    the Triton GLU launch (another summation order: h close, q8 forms each consistent with
    their h); (d) a second launch on the same counters gives the same bits, the counters are
    back at 0."""
    from minfer.ops import paths
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda import gemv_q8_gluon as GL
    from minfer.ops.cuda.gemv_repack import GemvWorkspace

    if cfg is None:
        assert GL.config_for(qt, 2 * f, k)[:4] == (32, 1, 1, 4)      # the table's gate+up entry
    rw, w = _weight(qt, 2 * f, k, seed=f + k + qt)
    ws = GemvWorkspace("cuda")
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    q8 = Q.quantize(x)
    xh = check_q8(q8, x.float())
    paths.reset()
    h, hq = Q.gemv_q8_swiglu(q8, rw, out_dtype=torch.bfloat16, config=cfg, ws=ws, gluon=True)
    snap = paths.snapshot()
    assert snap["counts"].get("gemv_q8.gluon") == 1 and "gemv_q8.triton" not in snap["counts"], snap
    assert not snap["fallbacks"], snap
    assert h.shape == (1, f) and hq[0].shape == (f // 4,) and hq[1].shape == (f // 8,)
    # (a)
    gu = xh @ w.T
    ref = torch.nn.functional.silu(gu[:, :f]) * gu[:, f:]
    assert rel_err(h.float(), ref) < 1e-2
    _check_q8_of(hq, h)
    # (b)
    gcfg = cfg if cfg is not None else GL.config_for(qt, 2 * f, k)
    g2 = Q.gemv_q8(q8, rw, out_dtype=torch.bfloat16, config=gcfg, ws=ws, gluon=True)
    h2, (q2, f2) = Q.swiglu_q8(g2[:, :f].contiguous(), g2[:, f:].contiguous())
    assert torch.equal(h, h2) and torch.equal(hq[0], q2) and torch.equal(hq[1], f2)
    # (c)
    ht, hqt = Q.gemv_q8_swiglu(q8, rw, out_dtype=torch.bfloat16, ws=ws)
    assert rel_err(h.float(), ht.float()) < 1e-3
    # each q8 form is its own h's; the two differ only where a bf16 rounding of g, u (and so a
    # chunk's max) went the other way
    assert rel_err(_check_q8_of(hq, h), _check_q8_of(hqt, ht)) < 1e-2
    # (d)
    paths.reset()
    h3, hq3 = Q.gemv_q8_swiglu(q8, rw, out_dtype=torch.bfloat16, config=cfg, ws=ws, gluon=True)
    assert torch.equal(h, h3) and torch.equal(hq[0], hq3[0]) and torch.equal(hq[1], hq3[1])
    assert paths.snapshot()["counts"].get("gemv_q8.gluon") == 1
    torch.cuda.synchronize()
    assert int(ws.cnt.abs().sum()) == 0


def test_gemv_q8_swiglu_gluon_graph_replays_pdl():
    """The 7B gate+up launch (Gluon table config, PDL on) behind the q8 producer in a CUDA graph:
    each replay with a new x gives silu(Wg x_hat) * (Wu x_hat) of that x (the pair counters
    reset by the epilogue, or the second replay's pairs would never see ticket 1)."""
    from minfer.ops import paths
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda.gemv_repack import GemvWorkspace

    f, k = 18944, 3584
    rw, w = _weight(12, 2 * f, k, seed=77)
    ws = GemvWorkspace("cuda")
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    nw = torch.randn(k, device="cuda")
    qs = []

    def step():
        _, hn, q8 = Q.add_rms_norm_q8(x, y, nw, 1e-6, torch.bfloat16, pdl=1)
        qs.append(q8)
        return Q.gemv_q8_swiglu(q8, rw, out_dtype=torch.bfloat16, ws=ws, gluon=True, pdl=1)

    paths.reset()
    step()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        h, hq = step()
    assert paths.snapshot()["counts"].get("gemv_q8.gluon") == 2
    for i in range(3):
        x.normal_()
        g.replay()
        torch.cuda.synchronize()
        gu = Q.dequantize_q8(qs[-1], k).double() @ w.T
        assert rel_err(h.float(), torch.nn.functional.silu(gu[:, :f]) * gu[:, f:]) < 1e-2, i
        _check_q8_of(hq, h)
    assert int(ws.cnt.abs().sum()) == 0


@pytest.mark.parametrize("k", [2560, 3584, 8192, 18944])
@pytest.mark.parametrize("one_pass", [True, False])
def test_add_rms_norm_q8_sum_in_one_round_or_a_loop(k, one_pass):
    """The norm's sum of squares in one load round (Switches.norm_one_pass, rows up to 8192) and in
    the loop of 1024-value rounds both give the float64 norm; 18944 loops either way."""
    import triton

    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda import q8_rows

    want = triton.next_power_of_2(k) if one_pass and k <= 8192 else 1024
    assert q8_rows._norm_block(k, False, one_pass) == want
    g = torch.Generator(device="cuda").manual_seed(k)
    x = torch.randn(1, k, device="cuda", generator=g)
    y = torch.randn(1, k, device="cuda", generator=g).to(torch.bfloat16)
    nw = torch.randn(k, device="cuda", generator=g)
    s, h, q8 = Q.add_rms_norm_q8(x, y, nw, 1e-6, torch.bfloat16, one_pass=one_pass)
    sv = x.double() + y.double()
    hv = sv * torch.rsqrt(sv.pow(2).mean(-1, keepdim=True) + 1e-6) * nw.double()
    assert torch.equal(s, x + y.float())
    assert rel_err(h.float(), hv) < 1e-2
    # the q8 row is quantized from the float32 normed value: x_hat of it, up to near-ties
    got = Q.dequantize_q8(q8, k).double()
    assert rel_err(got, x_hat(hv)) < 1e-3


@pytest.mark.parametrize("qt,f,k,cfg", [(12, 18944, 3584, None), (14, 18944, 3584, (32, 1, 1, 4)),
                                        (12, 512, 768, (32, 1, 1, 4)), (12, 1024, 1280, (64, 1, 1, 4))])
def test_gemv_q8_swiglu_paired(qt, f, k, cfg):
    """gemv_q8_swiglu(paired=True) (Switches.gemv_swiglu 2): each program holds the gate and up rows of
    its h values (twice the config's rows at twice its warps) and does the SwiGLU and q8 epilogue
    itself, no ticket -- bit for bit the Gluon GEMV with the config then swiglu_q8 (the same row
    sums: a row's reduction stays inside its warp), one launch counted as gemv_q8.gluon, no
    fallback, the pair counters untouched; a second launch gives the same bits."""
    from minfer.ops import paths
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda import gemv_q8_gluon as GL
    from minfer.ops.cuda.gemv_repack import GemvWorkspace

    rw, w = _weight(qt, 2 * f, k, seed=f + k + qt + 1)
    ws = GemvWorkspace("cuda")
    q8 = Q.quantize(torch.randn(1, k, device="cuda", dtype=torch.bfloat16))
    paths.reset()
    h, hq = Q.gemv_q8_swiglu(q8, rw, out_dtype=torch.bfloat16, config=cfg, ws=ws, gluon=True, paired=True)
    snap = paths.snapshot()
    assert snap["counts"].get("gemv_q8.gluon") == 1 and not snap["fallbacks"], snap
    gcfg = cfg if cfg is not None else GL.config_for(qt, 2 * f, k)
    g2 = Q.gemv_q8(q8, rw, out_dtype=torch.bfloat16, config=gcfg, ws=ws, gluon=True)
    h2, (q2, f2) = Q.swiglu_q8(g2[:, :f].contiguous(), g2[:, f:].contiguous())
    assert torch.equal(h, h2) and torch.equal(hq[0], q2) and torch.equal(hq[1], f2)
    h3, hq3 = Q.gemv_q8_swiglu(q8, rw, out_dtype=torch.bfloat16, config=cfg, ws=ws, gluon=True, paired=True)
    assert torch.equal(h, h3) and torch.equal(hq[0], hq3[0]) and torch.equal(hq[1], hq3[1])
    torch.cuda.synchronize()
    assert int(ws.cnt.abs().sum()) == 0
