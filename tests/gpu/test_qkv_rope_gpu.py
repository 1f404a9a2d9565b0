"""Switches.qkv_rope on the GPU: the q/k/v Gluon GEMV's rope epilogue (gemv_q8g_rope, launched by
gemv_q8_gluon_rope) against the launches it replaces -- the same GEMV config without it, then the
rope_kv kernel -- at the 7B's q/k/v shapes (all Q4_K, and Q4_K q/k with a Q6_K v in one launch),
with Qwen2's biases, neox and normal pairs, the shipped K-warps configs and others, plain and with
mode 5's rstd scale; and a whole model's graphed greedy decode with it on and off.

The epilogue does rope_kv's arithmetic on the same rounded GEMV outputs, so v's cache row is the
same bits and q / k agree to one rounding step of the cache dtype (a fused multiply-add the two
compilers may place differently); the other cache rows are untouched."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ops"))
sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import random_weight  # noqa: E402

pytestmark = pytest.mark.gpu

HD, HQ, HKV, K = 128, 28, 4, 3584


def _weight(qt, n, seed):
    from minfer.ops.cuda import gemv_repack as G

    raw = random_weight(qt, n, K, np.random.default_rng(seed))
    return G.repack(torch.from_numpy(raw).cuda(), qt, n, K)


@pytest.fixture(scope="module")
def qkv():
    return {"mixed": (_weight(12, 4096, 31), _weight(14, 512, 32)), "q4": (_weight(12, 4608, 33),)}


def _caches(dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    kc = torch.randn(256, HKV, HD, device="cuda", generator=g).to(dtype)
    return kc, torch.randn(256, HKV, HD, device="cuda", generator=g).to(dtype)


def _ulps(a, b, dtype) -> float:
    """The largest |a - b| in units of the cache dtype's rounding step at b."""
    eps = torch.finfo(dtype).eps
    d = (a.double() - b.double()).abs() / (b.double().abs() * eps).clamp_min(torch.finfo(dtype).tiny)
    return float(d.max())


@pytest.mark.parametrize("kind,cfg", [("q4", (8, 8, 1, 4, 2, 0, False, True)),
                                      ("mixed", (8, 8, 1, 4, 2, 0, False, True, True)),
                                      ("q4", (16, 4, 1, 4)), ("mixed", (32, 2, 1, 4, True)),
                                      ("q4", (8, 16, 1, 4, 0, 0, False, True))])
@pytest.mark.parametrize("style", ["neox", "normal"])
@pytest.mark.parametrize("scaled", [False, True])
def test_rope_epilogue_is_the_gemv_then_rope_kv(qkv, kind, cfg, style, scaled):
    from minfer.ops import paths
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda.gemv_q8_gluon_rope import Rope
    from minfer.ops.cuda.gemv_repack import GemvWorkspace
    from minfer.ops.cuda.norm_rope_act import _turns, rope_kv_write
    from minfer.ops.cuda.q8_rows import PreNorm

    segs = qkv[kind]
    dt = torch.bfloat16
    rope_cfg = _rope_cfg(style)
    ws = GemvWorkspace("cuda")
    g = torch.Generator(device="cuda").manual_seed(len(cfg) + (style == "neox") + 2 * scaled)
    bias = torch.randn(4608, device="cuda", generator=g)
    nw = torch.rand(K, device="cuda", generator=g) + 0.5
    for i, p in enumerate((0, 7, 200)):
        pos = torch.tensor([p], device="cuda")
        x = torch.randn(1, K, device="cuda", generator=g) * (1 + 3 * i)
        q8 = Q.quantize(x.to(dt))
        pre = None
        if scaled:
            # mode 5's row: the q8 of s * weight without rstd, rstd from tile sums (NORM 4)
            s = x
            ssp = (s.view(112, 32) ** 2).sum(1)
            q8u = Q.quantize((s * nw).to(torch.float32))
            h = torch.empty((1, K), dtype=dt, device="cuda")
            pre = PreNorm(s, None, nw, 1e-6, s, h, False, 0, True, True, ssp=ssp, q8u=q8u)
            q8 = None
        ref = Q.gemv_q8(q8, segs, bias=bias, out_dtype=dt, ws=ws, gluon=True, config=cfg, prenorm=pre)
        kr, vr = _caches(dt, 5 + i)
        qr = rope_kv_write(ref[:, :3584].view(1, HQ, HD), ref[:, 3584:4096].view(1, HKV, HD),
                           ref[:, 4096:].view(1, HKV, HD), pos, rope_cfg, kr, vr)
        kc, vc = _caches(dt, 5 + i)
        rope = Rope(pos, _turns(rope_cfg, "cuda"), kc, vc, 3584, 512, HD, style == "neox", rope_cfg)
        paths.reset()
        out = Q.gemv_q8(q8, segs, bias=bias, out_dtype=dt, ws=ws, gluon=True, config=cfg, prenorm=pre, rope=rope)
        snap = paths.snapshot()
        assert snap["counts"].get("gemv_q8.rope") == 1 and not snap["fallbacks"], snap
        assert torch.equal(vc, vr), (i, "v row")
        rows = [r for r in range(256) if r != p]
        assert torch.equal(kc[rows], kr[rows]), (i, "other k rows written")
        assert _ulps(kc[p], kr[p], dt) <= 1.0, (i, "k row", _ulps(kc[p], kr[p], dt))
        assert _ulps(out[:, :3584].view(1, HQ, HD), qr, dt) <= 1.0, (i, "q", _ulps(out[:, :3584].view(1, HQ, HD), qr, dt))


def _rope_cfg(style):
    from minfer.config import RopeConfig

    return RopeConfig(theta=1e6, style=style, n_rot=HD)


def test_split_config_falls_back_to_the_rope_kv_kernel(qkv):
    """A config with a K split cannot carry the epilogue (a tile's rows are summed by its last split):
    the GEMV runs as configured and the rope_kv kernel after it -- the same results, counted."""
    from minfer.ops import paths
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda.gemv_q8_gluon_rope import Rope
    from minfer.ops.cuda.gemv_repack import GemvWorkspace
    from minfer.ops.cuda.norm_rope_act import _turns, rope_kv_write

    segs, dt, cfg = qkv["q4"], torch.bfloat16, (32, 2, 4, 4, True)
    rope_cfg = _rope_cfg("neox")
    ws = GemvWorkspace("cuda")
    x = torch.randn(1, K, device="cuda", generator=torch.Generator(device="cuda").manual_seed(3))
    q8, pos = Q.quantize(x.to(dt)), torch.tensor([9], device="cuda")
    ref = Q.gemv_q8(q8, segs, out_dtype=dt, ws=ws, gluon=True, config=cfg)
    kr, vr = _caches(dt, 1)
    qr = rope_kv_write(ref[:, :3584].view(1, HQ, HD), ref[:, 3584:4096].view(1, HKV, HD),
                       ref[:, 4096:].view(1, HKV, HD), pos, rope_cfg, kr, vr)
    kc, vc = _caches(dt, 1)
    paths.reset()
    out = Q.gemv_q8(q8, segs, out_dtype=dt, ws=ws, gluon=True, config=cfg,
                    rope=Rope(pos, _turns(rope_cfg, "cuda"), kc, vc, 3584, 512, HD, True, rope_cfg))
    snap = paths.snapshot()
    assert any(k.startswith("gemv_q8.rope (fell back because the Gluon config") for k in snap["fallbacks"]), snap
    assert snap["counts"].get("rope_kv.triton") == 1
    assert torch.equal(out[:, :3584].view(1, HQ, HD), qr) and torch.equal(kc, kr) and torch.equal(vc, vr)


@pytest.mark.parametrize("mode", [1, 2])
def test_graphed_decode_with_the_rope_in_the_qkv_gemv(tmp_path, monkeypatch, mode):
    """Switches.qkv_rope in a whole model's graphed greedy decode against off (graphed_pair's rule;
    the tiny qwen2's heads of 64, every GEMV at 32-row tiles without a K split): every layer's q/k/v
    launch rotates and writes the KV row, no rope_kv launch, no fallback; the same tokens."""
    from graphed_pair import compare_decodes

    from minfer.switches import Switches

    snap = compare_decodes(tmp_path, monkeypatch, Switches(qkv_rope=mode), Switches(qkv_rope=0), seed=15,
                           prompt_seed=11, n_prompt=10, config=(32, 1, 1, 4))
    c = snap["counts"]
    assert c.get("gemv_q8.rope", 0) > 0 and c["gemv_q8.rope"] == c.get("qmatmul.qkv_rope", 0), c
    assert c.get("rope_kv.triton", 0) == c["gemv_q8.rope"], c     # engine b's, one a layer and step
    assert not [k for k in snap["fallbacks"] if "rope" in k], snap["fallbacks"]
