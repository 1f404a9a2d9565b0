"""Tile-major planes (gemv_repack_layout.to_tiles) on the GPU: every kernel that reads the planes
gives the same output bits on them as on the row-major planes, at the 7B's down shapes (where the
engine stores them tile-major: gemv_q8_gluon.tile_rows_for) and a small odd one; the row-major
result is itself checked against gguf's dequant (kernel_data) in float64."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ops"))
from kernel_data import random_weight, reference_dequant, rel_err  # noqa: E402

pytestmark = pytest.mark.gpu


def _weight(qt, n, k, seed):
    from minfer.ops.cuda import gemv_repack as G

    raw = random_weight(qt, n, k, np.random.default_rng(seed))
    return G.repack(torch.from_numpy(raw).cuda(), qt, n, k), torch.from_numpy(reference_dequant(raw, qt, n, k)).double()


@pytest.mark.parametrize("qt,n,k,cfg", [
    (12, 3584, 18944, (32, 2, 9, 4)), (12, 3584, 18944, (32, 1, 12, 4)), (12, 3584, 18944, (16, 2, 9, 2, 1, 0, 1)),
    (14, 3584, 18944, (16, 2, 4, 4)), (14, 3584, 18944, (32, 2, 5, 4)), (12, 3584, 18944, (8, 8, 2, 4, 1, 0, 0, 1)),
    (12, 256, 1536, (32, 2, 3, 4, 2)), (14, 256, 1536, (16, 4, 2, 4))])
def test_gluon_gemv_on_tile_major_planes(qt, n, k, cfg):
    from minfer.ops import paths
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda import gemv_repack_layout as L

    rw, dense = _weight(qt, n, k, 7)
    g = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(1, k, device="cuda", generator=g, dtype=torch.bfloat16)
    resid = torch.randn(1, n, device="cuda", generator=g)
    q8 = Q.quantize(x)
    a = Q.gemv_q8(q8, rw, resid=resid, out_dtype=torch.float32, config=cfg, gluon=True, pdl=1)
    ref = Q.dequantize_q8(q8, k).double().cpu() @ dense.T + resid.double().cpu()
    assert rel_err(a.double().cpu(), ref) < 1e-5
    for t in sorted({cfg[0], 32 if n % 32 == 0 else 16}):
        tm = L.to_tiles(rw, t)
        paths.reset()
        b = Q.gemv_q8(q8, tm, resid=resid, out_dtype=torch.float32, config=cfg, gluon=True, pdl=1)
        assert paths.snapshot()["counts"].get("gemv_q8.gluon") == 1
        assert torch.equal(a, b), f"tile rows {t}: {int((a != b).sum())} values differ"


@pytest.mark.parametrize("qt", [12, 14])
def test_triton_readers_on_tile_major_planes(qt):
    """The Triton q8 GEMV, the bf16 GEMV (one row and a batch), the prefill's dequant and the
    batched w4 planes' builder, on the down shape."""
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda import gemv_repack as G
    from minfer.ops.cuda import gemv_repack_layout as L
    from minfer.ops.cuda import qgemm_w4

    n, k = 3584, 18944
    rw, dense = _weight(qt, n, k, 11)
    tm = L.to_tiles(rw, 32)
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(1, k, device="cuda", generator=g, dtype=torch.bfloat16)
    q8 = Q.quantize(x)
    assert torch.equal(Q.gemv_q8(q8, rw, out_dtype=torch.float32), Q.gemv_q8(q8, tm, out_dtype=torch.float32))
    xs = torch.randn(4, k, device="cuda", generator=g, dtype=torch.bfloat16)
    for xx in (xs[:1], xs):
        assert torch.equal(G.gemv(xx, rw), G.gemv(xx, tm))
    d = G.dequantize_into(tm, torch.empty(n, k, device="cuda"))
    assert torch.equal(d.cpu(), dense.float())
    a, b = qgemm_w4.make_w4(rw), qgemm_w4.make_w4(tm)
    assert all(torch.equal(p, q) for p, q in zip(a.planes, b.planes))


@pytest.mark.parametrize("qt,n,k,cfg", [
    (12, 3584, 18944, (32, 2, 9, 4)), (14, 3584, 18944, (16, 2, 4, 4)), (12, 3584, 18944, (8, 8, 2, 4, 1, 0, 0, 1)),
    (12, 4608, 3584, (8, 8, 1, 4, 2, 0, 0, 1)), (12, 256, 1536, (32, 2, 3, 4, 2)), (14, 256, 1536, (16, 4, 2, 4, 0))])
def test_x_one_step_ahead_is_the_same_bits(qt, n, k, cfg):
    """A config's eleventh field (the q8 row's next step loaded with the weights, _tile's XP) changes
    when the activations load, not what is computed: the same output bits, on both layouts."""
    from minfer.ops import paths
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda import gemv_repack_layout as L

    rw, _ = _weight(qt, n, k, 13)
    g = torch.Generator(device="cuda").manual_seed(4)
    q8 = Q.quantize(torch.randn(1, k, device="cuda", generator=g, dtype=torch.bfloat16))
    resid = torch.randn(1, n, device="cuda", generator=g)
    full = tuple(cfg) + (1, 0, 0, 0, 0)[len(cfg) - 4:] if len(cfg) < 9 else tuple(cfg)
    xp = full[:9] + (0, 1)
    for planes in (rw, L.to_tiles(rw, 16)):
        paths.reset()
        a = Q.gemv_q8(q8, planes, resid=resid, out_dtype=torch.float32, config=cfg, gluon=True, pdl=1)
        b = Q.gemv_q8(q8, planes, resid=resid, out_dtype=torch.float32, config=xp, gluon=True, pdl=1)
        assert paths.snapshot()["counts"].get("gemv_q8.gluon") == 2
        assert torch.equal(a, b)


def _tiled_pair(tmp_path, monkeypatch, n: int, k: int, tiled: tuple, sw_a=None, sw_b=None):
    """compare_decodes (graphed_pair.py) on the tiny model: engine a with the default switches (or sw_a),
    b with MINFER_GEMV_TILES=0 (or sw_b); the launch of shape n x k takes config `tiled` (which asks for
    tiles), every other shape (32, 2, 2, 4). (snapshot of the paths, each step's logits error, the
    engines, whether the shape was asked for)."""
    import sys as _sys

    _sys.path.insert(0, os.path.dirname(__file__))
    from graphed_pair import compare_decodes

    from minfer.switches import Switches

    seen = []

    def config_for(qtype, n_, k_, table=""):
        if (n_, k_) == (n, k):
            seen.append((qtype, n_, k_))
            return tiled
        return (32, 2, 2, 4)

    errs, engines = [], []
    snap = compare_decodes(tmp_path, monkeypatch, sw_a or Switches(), sw_b or Switches(gemv_tiles=False), seed=21,
                           prompt_seed=4,
                           n_prompt=10, same_prefill=True, config=config_for, errs=errs, engines=engines)
    return snap, errs, engines, bool(seen)


def test_gate_up_group_tile_major_gives_the_same_decode(tmp_path, monkeypatch):
    """A fused gate+up group whose stacked shape's config asks for tiles (plane_layout._group)
    decodes exactly as the row-major engine (MINFER_GEMV_TILES=0) at every graphed step: its one
    GEMV reads the tile-major group planes (and each member's view the same rows' bits)."""
    # the tiny model's gate+up: 2 x ffn 1024 rows, hidden 256
    snap, errs, engines, seen = _tiled_pair(tmp_path, monkeypatch, 2048, 256,
                                            (32, 1, 1, 4, 1, 0, False, False, False, True, True))
    assert seen, "the gate+up group's shape was never asked for"
    groups = [[getattr(w, "repacked_group", None) for w in e.model.qweights()] for e in engines]
    la, lb = ([g[1].tile_rows for g in gs if g is not None and g[1].n == 2048] for gs in groups)
    assert la and set(la) == {32} and set(lb) == {0}, (la, lb)
    assert errs and max(errs) == 0.0, errs
    assert snap["counts"].get("gemv_q8.gluon", 0) > 0, snap
    assert not [k for k in snap["fallbacks"] if "tile-major" in k], snap["fallbacks"]


def test_qkv_group_and_mixed_pair_tile_major_give_the_same_decode(tmp_path, monkeypatch):
    """The q/k/v launch's planes tile-major where its shape's config asks (plane_layout._group for
    the all-Q4_K layers, plane_layout._pair for the layers whose v is Q6_K: both plane sets in one
    layout): a graphed decode equal at every step to the row-major engine's, the rope epilogue
    (one K split) reading them."""
    # the tiny model's q/k/v: 256 + 64 + 64 rows, hidden 256
    snap, errs, engines, seen = _tiled_pair(tmp_path, monkeypatch, 384, 256, (32, 2, 1, 4, 1, 0, False, False, False, True))
    assert seen
    lay = []
    for e in engines:
        ws = e.model.qweights()
        groups = [w.repacked_group[1].tile_rows for w in ws if getattr(w, "repacked_group", None) is not None
                  and w.repacked_group[1].n == 384]
        pairs = [[r.tile_rows for r in w.repacked_segments[1]] for w in ws
                 if getattr(w, "repacked_segments", None) is not None]
        lay.append((groups, pairs))
    (ga, pa), (gb, pb) = lay
    assert ga and pa, lay                       # the tiny q4_k_m model has both kinds of layer
    assert set(ga) == {32} and all(p == [32, 32] for p in pa), lay
    assert set(gb) == {0} and all(p == [0, 0] for p in pb), lay
    assert errs and max(errs) == 0.0, errs
    assert snap["counts"].get("gemv_q8.rope", 0) > 0, snap
    assert not [k for k in snap["fallbacks"] if "tile-major" in k or "layout" in k], snap["fallbacks"]


def test_o_fetching_gate_ups_tile_heads_into_l2_gives_the_same_decode(tmp_path, monkeypatch):
    """Switches.l2_heads: the o projection's programs bulk-prefetch the head blocks of every tile of the
    tile-major gate+up group into L2 before their wait (l2_prefetch.L2Plan.heads). The prefetch writes
    nothing: a graphed decode equal at every step to the same engine without it, the path counted
    once per layer and step where the plan knows the cycle, no fallback of it."""
    from minfer.switches import Switches

    snap, errs, engines, seen = _tiled_pair(tmp_path, monkeypatch, 2048, 256,
                                            (32, 1, 1, 4, 1, 0, False, False, False, True, True),
                                            sw_a=Switches(l2_heads=4), sw_b=Switches())
    assert seen
    assert errs and max(errs) == 0.0, errs
    n = snap["counts"].get("gemv_q8.l2_heads", 0)
    layers = engines[0].model.cfg.n_layers
    assert n > 0 and n % layers == 0, (n, layers, snap["counts"])
    assert not [k for k in snap["fallbacks"] if "l2_heads" in k], snap["fallbacks"]
