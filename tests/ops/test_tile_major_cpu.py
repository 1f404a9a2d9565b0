"""Tile-major repacked planes (gemv_repack_layout.to_tiles): the same bits in another order, read
by every kernel that reads the planes. Here on the CPU: the layout itself against the row-major
planes and gguf's dequantize (kernel_data.reference_dequant), and the Triton kernels in the
interpreter (the q8 GEMV, the bf16 GEMV, the dequant, the batched w4 planes' builder) giving the
same output bits on both layouts. The Gluon GEMV on tile-major planes runs in
tests/gpu/test_gemv_q8_tiles_gpu.py; its sm_90 build with TM is checked below."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import interpreted_modules, random_weight, reference_dequant  # noqa: E402

from minfer.errors import MinferError  # noqa: E402
from minfer.ops.cuda import gemv_repack_layout as L  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning",
                                        "ignore:overflow encountered:RuntimeWarning",
                                        "ignore:divide by zero encountered:RuntimeWarning")


def _rw(qt, n, k, seed=0):
    raw = random_weight(qt, n, k, np.random.default_rng(seed))
    return raw, L.repack(torch.from_numpy(raw), qt, n, k)


@pytest.mark.parametrize("qt", [L.Q4_K, L.Q6_K])
@pytest.mark.parametrize("t", [8, 16, 32])
def test_to_tiles_is_the_same_bits_reordered(qt, t):
    raw, rw = _rw(qt, 64, 768)
    tm = L.to_tiles(rw, t)
    assert tm.tile_rows == t and tm.nbytes() == rw.nbytes()
    assert [p.shape for p in tm.planes] == [p.shape for p in rw.planes]
    # block b of row r: entry ((r // t) * NB + b) * t + r % t of each plane's per-block entries
    nb = 3
    for r, b in [(0, 0), (5, 2), (t, 1), (63, 2)]:
        e = ((r // t) * nb + b) * t + r % t
        for p_tm, p_rm in zip(tm.planes, rw.planes):
            per = p_rm.shape[1] // nb
            assert torch.equal(p_tm.reshape(-1)[e * per:(e + 1) * per], p_rm[r, b * per:(b + 1) * per])
    back = L.to_rows(tm)
    assert back.tile_rows == 0 and all(torch.equal(a, b) for a, b in zip(back.planes, rw.planes))
    # the CPU decode reads either layout to gguf's values, bit for bit
    L.check_repacked(torch.from_numpy(raw), tm, qt)
    want = reference_dequant(raw, qt, 64, 768).astype(np.float32)
    assert np.array_equal(L.dequantize_planes(tm).view(np.uint32), want.view(np.uint32))


def test_tile_major_refusals():
    _, rw = _rw(L.Q4_K, 48, 512)
    with pytest.raises(MinferError, match="do not split into 32-row tiles"):
        L.to_tiles(rw, 32)
    tm = L.to_tiles(rw, 16)
    with pytest.raises(MinferError, match="already tile-major"):
        L.to_tiles(tm, 16)
    with pytest.raises(MinferError, match="cut a tile"):
        tm.rows(8, 32)
    assert tm.rows(16, 48).tile_rows == 16 and tm.rows(16, 48).n == 32
    with pytest.raises(MinferError, match="one plane layout"):
        L.common_tile_rows((rw, tm))


@pytest.fixture(scope="module")
def K():
    for mods in interpreted_modules(["minfer.ops.cuda.gemv_repack", "minfer.ops.cuda.q8_rows",
                                     "minfer.ops.cuda.gemv_q8"]):
        yield mods["gemv_q8"], mods["gemv_repack"]


@pytest.mark.parametrize("qt", [L.Q4_K, L.Q6_K])
def test_triton_kernels_read_tile_major_planes(K, qt):
    Q, G = K
    n, k = 64, 768
    raw, rw = _rw(qt, n, k, seed=3)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, k, generator=g)
    q8 = Q.quantize(x, interpret=True)
    for t in (16, 32):
        tm = L.to_tiles(rw, t)
        # the q8 GEMV (Triton kernel, K split, prefetch), with a residual
        cfg = (16, 1, 2, 4)
        resid = torch.randn(1, n, generator=g)
        a = Q.gemv_q8(q8, rw, resid=resid, out_dtype=torch.float32, config=cfg, interpret=True)
        b = Q.gemv_q8(q8, tm, resid=resid, out_dtype=torch.float32, config=cfg, interpret=True)
        assert torch.equal(a, b)
        # the bf16-activation GEMV, one row and a batch of rows (its tl.dot path)
        xs = torch.randn(3, k, generator=g)
        for xx in (xs[:1], xs):
            a = G.gemv(xx, rw, config=(16, 1, 2, 4), interpret=True)
            b = G.gemv(xx, tm, config=(16, 1, 2, 4), interpret=True)
            assert torch.equal(a, b)
        # the prefill's dequant
        a = G.dequantize_into(rw, torch.empty(n, k), interpret=True)
        b = G.dequantize_into(tm, torch.empty(n, k), interpret=True)
        assert torch.equal(a, b)
        want = torch.from_numpy(reference_dequant(raw, qt, n, k).astype(np.float32))
        assert torch.equal(b, want)


@pytest.mark.parametrize("qt", [L.Q4_K, L.Q6_K])
def test_w4_planes_from_tile_major(qt):
    from minfer.ops.cuda import qgemm_w4

    _, rw = _rw(qt, 64, 512, seed=5)
    a = qgemm_w4.make_w4(rw, rows_per_step=32)
    b = qgemm_w4.make_w4(L.to_tiles(rw, 16), rows_per_step=32)
    assert all(torch.equal(x, y) for x, y in zip(a.planes, b.planes))


_COMPILE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from minfer.ops.cuda import gemv_q8_gluon as GL

names = [p.name for p in GL._gemv_q8g_kernel.params if not p.is_constexpr]
planes = {12: ["*i32", "*i32", "*i32", "*i32"], 14: ["*i32", "*i16", "*i16", "*fp16"]}
out = {}
for name, (qt, bn, tm) in json.loads(sys.argv[1]).items():
    types = planes[qt] * 2 + ["*i32", "*fp32", "*bf16", "*fp32", "*fp32", "*fp32", "*i32"] + ["i32"] * 6 + \
        ["*fp32", "*bf16", "*fp32", "*fp32", "fp32", "i32", "*bf16", "*fp32", "*i64", "*bf16", "*i32", "*fp32",
        "i32", "i64", "i32", "i32", "i64", "i32", "i32", "i64", "i32", "i32", "i64", "i32", "i32"]
    cex = dict(QT=qt, QTB=qt, MIXED=False, BN=bn, BB=2, NW=4, IS_SPLIT=True, HAS_BIAS=False, HAS_RESID=True,
               PDL=1, PF=True, PRE=True, NORM=0, KP2=1, NCHP=1, RSS=False, WK=False, SF=False, TM=tm)
    sig = dict(zip(names, types)) | {c: "constexpr" for c in cex}
    src = GluonASTSource(GL._gemv_q8g_kernel, sig, cex, {(i,): [["tt.divisibility", 16]] for i in range(15)})
    out[name] = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
print(json.dumps(out))
"""


def test_gluon_build_with_tile_major_addressing():
    """The sm_90 builds of the Gluon q8 GEMV with TM (the Q4_K and Q6_K downs' configs): the same
    dp4a and 16-byte weight loads as row-major -- the layout changes only the addresses."""
    from kernel_data import sm90_builds

    ptx = sm90_builds(_COMPILE, {"q4": (12, 32, 0), "q4 tm": (12, 32, 32), "q6": (14, 16, 0), "q6 tm": (14, 16, 16)})
    import collections
    import re

    def loads(name):
        return collections.Counter(re.findall(r"ld\.global[\w:.]*", ptx[name]))
    for a, b in (("q4", "q4 tm"), ("q6", "q6 tm")):
        assert ptx[a].count("dp4a") == ptx[b].count("dp4a") > 0
        assert loads(a) == loads(b) and loads(a)["ld.global.L1::evict_first.L2::cache_hint.v4.b32"] > 0


def test_moe_kernel_refuses_tile_major_planes():
    """Stacked experts are never tiled (their shapes are in no Gluon table); the MoE gather kernel
    names the layout if it ever gets such planes."""
    from minfer.ops.cuda import gemv_q8_experts

    _, rw = _rw(L.Q4_K, 64, 256)
    q8 = (torch.zeros(64, dtype=torch.int32), torch.zeros(32))
    with pytest.raises(MinferError, match="tile-major"):
        gemv_q8_experts.gemv_q8_experts(q8, L.to_tiles(rw, 16), torch.zeros(2, dtype=torch.int64), 32)
