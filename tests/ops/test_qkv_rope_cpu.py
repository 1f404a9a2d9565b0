"""Switches.qkv_rope without a GPU: the q/k/v GEMV that rotates q and k and writes the KV row in its
epilogue (gemv_q8_gluon_rope, gemv_q8g_rope). In the interpreter the Gluon kernel never runs, so the
launch is the counted fallback -- the GEMV, then the rope_kv kernel -- and must give the bits of
linear_many + rope_kv_write; the refusals name their reason; the Gluon variant builds for sm_90 with
the plain kernel's loads and dot products and the rope's stores instead of the output's. Its
numbers: tests/gpu/test_qkv_rope_gpu.py."""

from __future__ import annotations

import os
import sys
import types

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import interpreted_modules, random_weight, sm90_builds  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning",
                                        "ignore:overflow encountered:RuntimeWarning",
                                        "ignore:divide by zero encountered:RuntimeWarning")

HD = 64


@pytest.fixture(scope="module")
def M():
    for mods in interpreted_modules(["minfer.ops.cuda.gemv_repack", "minfer.ops.cuda.q8_rows",
                                     "minfer.ops.cuda.gemv_q8", "minfer.ops.cuda.norm_rope_act",
                                     "minfer.ops.cuda.qmatmul", "minfer.ops.cuda.gemv_q8_gluon_rope"]):
        yield mods


def _group(qv_type: int):
    """q (4 heads of 64), k and v (1 head) over K = 256, repacked and fused as the engine does (a v of
    another type: the q/k + v pair)."""
    from minfer.ops.cuda.gemv_repack_layout import fuse_group, repack_weight
    from minfer.weights import QWeight

    rng = np.random.default_rng(qv_type)
    ws = []
    for name, n, qt in (("attn_q", 256, 12), ("attn_k", 64, 12), ("attn_v", 64, qv_type)):
        w = QWeight(name=f"blk.0.{name}.weight", qtype=qt, shape=(n, 256),
                    raw=torch.from_numpy(random_weight(qt, n, 256, rng)))
        repack_weight(w)
        ws.append(w)
    assert fuse_group(tuple(ws))
    return tuple(ws)


@pytest.mark.parametrize("qv_type", [12, 14], ids=["q4", "mixed"])
@pytest.mark.parametrize("style", ["neox", "normal"])
def test_rope_on_the_triton_kernel_is_the_gemv_then_rope_kv(M, qv_type, style):
    """gemv_q8 asked for the rope where the Triton kernel takes the launch (here: the interpreter) runs
    the GEMV, then the rope_kv kernel on its output -- counted as the fallback, the bits of
    linear_many + rope_kv_write; linear_qkv_rope does not take that way (the usual path: None)."""
    from minfer.config import RopeConfig
    from minfer.ops import paths
    from minfer.ops.cuda.workspace import Workspace
    from minfer.switches import Switches

    Q, N, QM, GR = M["gemv_q8"], M["norm_rope_act"], M["qmatmul"], M["gemv_q8_gluon_rope"]
    wts = _group(qv_type)
    planes = wts[0].repacked_group[1] if qv_type == 12 else wts[0].repacked_segments[1]
    g = torch.Generator().manual_seed(qv_type)
    biases = (torch.randn(256, generator=g), torch.randn(64, generator=g), torch.randn(64, generator=g))
    bias = torch.cat(biases)
    rope = RopeConfig(theta=1e4, style=style, n_rot=HD)
    for p in (0, 5, 77):
        x = (torch.randn(1, 256, generator=g) * 2).to(torch.bfloat16)
        x.q8 = Q.quantize(x, interpret=True)
        pos = torch.tensor([p])
        q, k, v = QM.linear_many(x, wts, biases)
        kr = torch.randn(96, 1, HD, generator=g).to(torch.bfloat16)
        vr = torch.randn(96, 1, HD, generator=g).to(torch.bfloat16)
        kc, vc = kr.clone(), vr.clone()
        qr = N.rope_kv_write(q.view(1, 4, HD), k.view(1, 1, HD), v.view(1, 1, HD), pos, rope, kr, vr)
        paths.reset()
        k0 = kc.clone()
        assert GR.linear_qkv_rope(x, wts, biases, pos, rope, kc, vc, Switches(qkv_rope=2), Workspace("cpu")) is None
        assert not paths.snapshot()["counts"] and torch.equal(kc, k0)
        kc, vc = kr.clone(), vr.clone()
        kc[p], vc[p] = 0, 0
        r = GR.Rope(pos, N._turns(rope, "cpu"), kc, vc, 256, 64, HD, style == "neox", rope)
        out = Q.gemv_q8(x.q8, planes, bias=bias, out_dtype=torch.bfloat16, interpret=True, gluon=True, rope=r)
        snap = paths.snapshot()
        assert snap["counts"].get("rope_kv.triton") == 1 and "gemv_q8.rope" not in snap["counts"], snap
        assert any(f.startswith("gemv_q8.rope (fell back because the Triton kernel") for f in snap["fallbacks"]), snap
        assert torch.equal(out[:, :256].view(1, 4, HD), qr) and torch.equal(kc, kr) and torch.equal(vc, vr), p


def test_switch_off_or_no_group_returns_none(M):
    from minfer.config import RopeConfig
    from minfer.ops import paths
    from minfer.ops.cuda.workspace import Workspace
    from minfer.switches import Switches

    Q, GR = M["gemv_q8"], M["gemv_q8_gluon_rope"]
    wts = _group(12)
    x = torch.randn(1, 256).to(torch.bfloat16)
    x.q8 = Q.quantize(x, interpret=True)
    kc = torch.zeros(8, 1, HD, dtype=torch.bfloat16)
    rope, pos, ws = RopeConfig(theta=1e4, style="neox", n_rot=HD), torch.tensor([1]), Workspace("cpu")
    none = (None, None, None)
    paths.reset()
    assert GR.linear_qkv_rope(x, wts, none, pos, rope, kc, kc.clone(), Switches(qkv_rope=0), ws) is None
    assert any(k.startswith("qmatmul.qkv_rope") for k in paths.snapshot()["switched_off"])
    on = Switches(qkv_rope=2)
    # not the group's weights in its order; a partial rotation; another dtype; two rows
    assert GR.linear_qkv_rope(x, wts[::-1], none, pos, rope, kc, kc.clone(), on, ws) is None
    assert GR.linear_qkv_rope(x, wts, none, pos, RopeConfig(1e4, "neox", 32), kc, kc.clone(), on, ws) is None
    assert GR.linear_qkv_rope(x, wts, none, pos, rope, kc.float(), kc.float(), on, ws) is None
    assert GR.linear_qkv_rope(torch.cat([x, x]), wts, none, pos, rope, kc, kc.clone(), on, ws) is None
    assert "qmatmul.qkv_rope" not in paths.snapshot()["counts"]


def test_refusals_name_the_reason():
    from minfer.ops.cuda import gemv_q8_gluon_rope as GR

    seg = types.SimpleNamespace(n=4608, qtype=12)
    kc = torch.zeros(8, 4, 128, dtype=torch.bfloat16)
    r = GR.Rope(None, None, kc, kc.clone(), 3584, 512, 128, True, None)
    assert GR.refused((seg,), (8, 8, 1, 4), 1, r, torch.bfloat16) is None
    assert "splits K" in GR.refused((seg,), (32, 2, 4, 4), 4, r, torch.bfloat16)
    assert "do not pair" in GR.refused((seg,), (24, 2, 1, 4), 1, r, torch.bfloat16)
    assert "do not pair" in GR.refused((seg,), (256, 2, 1, 4), 1, r, torch.bfloat16)
    assert "caches" in GR.refused((seg,), (8, 8, 1, 4), 1, r, torch.float16)
    wide = GR.Rope(None, None, torch.zeros(8, 4, 256, dtype=torch.bfloat16)[..., :128], kc, 3584, 512, 128, True, None)
    assert "strides" in GR.refused((seg,), (8, 8, 1, 4), 1, wide, torch.bfloat16)


_COMPILE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from minfer.ops.cuda import gemv_q8_gluon as GL
from minfer.ops.cuda import gemv_q8_gluon_rope as GR

q4 = ["*i32", "*i16", "*i32", "*i32"]
q6 = ["*i32", "*i16", "*i16", "*fp16"]
out = {}
for mixed, norm in json.loads(sys.argv[1]):
    second = q6 if mixed else q4
    cex = dict(QT=12, QTB=14 if mixed else 12, MIXED=bool(mixed), BN=8, BB=8, NW=4, HAS_BIAS=True, PDL=1, PF=2,
               PRE=True, NORM=norm, KP2=128 if norm else 1, WK=True, SF=bool(mixed), TM=0, XP=False)
    # the plain kernel, as the engine launches this config
    names = [p.name for p in GL._gemv_q8g_kernel.params if not p.is_constexpr]
    types = q4 + second + ["*i32", "*fp32", "*bf16", "*fp32", "*bf16", "*fp32", "*i32"] + ["i32"] * 6 + \
        ["*fp32", "*fp32", "*fp32", "*fp32", "fp32", "i32", "*bf16", "*fp32", "*i64", "*bf16", "*i32", "*fp32",
        "i32", "i64", "i32", "i32", "i64", "i32", "i32", "i64", "i32", "i32", "i64", "i32", "i32"]
    c = dict(cex, IS_SPLIT=False, HAS_RESID=False, NCHP=1, RSS=False)
    src = GluonASTSource(GL._gemv_q8g_kernel, dict(zip(names, types)) | {k: "constexpr" for k in c}, c,
                         {(i,): [["tt.divisibility", 16]] for i in range(15)})
    out[f"plain {mixed} {norm}"] = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
    names = [p.name for p in GR._gemv_q8g_rope_kernel.params if not p.is_constexpr]
    types = q4 + second + ["*i32", "*fp32", "*fp32", "*bf16"] + ["i32"] * 5 + ["*fp32", "i32", "fp32", "*i64", "*fp64",
                                                                           "*bf16", "*bf16", "i32", "i32", "i32", "*i64"]
    c = dict(cex, RP=1, HD=128)
    src = GluonASTSource(GR._gemv_q8g_rope_kernel, dict(zip(names, types)) | {k: "constexpr" for k in c}, c,
                         {(i,): [["tt.divisibility", 16]] for i in range(12)})
    out[f"rope {mixed} {norm}"] = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
print(json.dumps(out))
"""
_CASES = [(0, 0), (1, 0), (0, 4), (1, 4)]


@pytest.fixture(scope="module")
def ptx():
    return sm90_builds(_COMPILE, _CASES, timeout=900)


@pytest.mark.parametrize("mixed,norm", _CASES)
def test_rope_build_has_the_plain_loads_and_dot_products(ptx, mixed, norm):
    """The rope kernel against the plain kernel of the 7B's shipped q/k/v config (K-warps, both steps
    before the wait; all Q4_K and with a Q6_K v; plain and NORM 4): the same PDL wait and dp4a
    count, no atomics; the angle in float64 (a cvt from the position); two bf16 stores (a rotated
    pair) and the pair's swap through shared memory, for each weight's tiles."""
    plain, rope = ptx[f"plain {mixed} {norm}"], ptx[f"rope {mixed} {norm}"]
    assert rope.count("griddepcontrol.wait") == plain.count("griddepcontrol.wait") == 1 + mixed   # (a _tile a weight)
    assert rope.count("dp4a") == plain.count("dp4a") > 0
    assert "atom" not in rope
    assert "cvt.rn.f64.s64" in rope and "cvt.rn.f64.s64" not in plain
    # (the compiler may merge the two weights' stores after their branches)
    assert 2 <= rope.count("st.global.b16") <= 2 * (1 + mixed) and rope.count("st.shared") > plain.count("st.shared")
