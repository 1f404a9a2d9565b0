"""Switches.norm_into_gemv = 4 without a GPU: the residual GEMV's tiles make the q8 row of s * weight
(rstd left out: gemv_q8g_norm._rss_q8, the RQ epilogue) and the next q8 GEMV scales its row sums by
rstd from the tiles' sums of squares (gemv_q8_gluon._tile's NORM 4). In the interpreter the Gluon
kernel never runs, so every path here is a counted fallback that must give the bits of the
launches it replaces; the two Gluon variants build for sm_90 with the loads, stores and dot
products they should have. Their numbers: tests/gpu/test_norm_into_gemv_gpu.py."""

from __future__ import annotations

import os
import sys
import types

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import random_weight, sm90_builds  # noqa: E402
from test_norm_into_gemv_cpu import M  # noqa: E402,F401 (the interpreted modules' fixture, shared)

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning",
                                        "ignore:overflow encountered:RuntimeWarning",
                                        "ignore:divide by zero encountered:RuntimeWarning")

_COMPILE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from minfer.ops.cuda import gemv_q8_gluon as GL

names = [p.name for p in GL._gemv_q8g_kernel.params if not p.is_constexpr]   # the runtime arguments
q4 = ["*i32", "*i16", "*i32", "*i32"]
q6 = ["*i32", "*i16", "*i16", "*fp16"]
out = {}
for key, qt, mixed, bn, bb, split, nw, wk, norm, rss, rq, rl, *pdl in json.loads(sys.argv[1]):
    first = q4 if qt == 12 else q6
    types = first + (q6 if mixed else first) + ["*i32", "*fp32", "*fp32", "*fp32", "*bf16", "*fp32", "*i32"] + \
        ["i32"] * 6 + ["*fp32", "*fp32", "*fp32", "*fp32", "fp32", "i32", "*bf16", "*fp32", "*i64", "*bf16", "*i32",
                       "*fp32",
        "i32", "i64", "i32", "i32", "i64", "i32", "i32", "i64", "i32", "i32", "i64", "i32", "i32"]
    cex = dict(QT=qt, QTB=14 if mixed else qt, MIXED=bool(mixed), BN=bn, BB=bb, NW=nw, IS_SPLIT=split > 1,
               HAS_BIAS=False, HAS_RESID=False, PDL=pdl[0] if pdl else 1, PF=2 if split == 1 and not rss else True,
               PRE=True,
               NORM=norm, KP2=256 if norm else 1, NCHP=1, RSS=bool(rss), WK=bool(wk), RQ=rq, RL=bool(rl))
    sig = dict(zip(names, types)) | {c: "constexpr" for c in cex}
    src = GluonASTSource(GL._gemv_q8g_kernel, sig, cex, {(i,): [["tt.divisibility", 16]] for i in range(15)})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": nw})
    out[key] = k.asm["ptx"]
    out[key + " smem"] = k.metadata.shared
    out[key + " regs"] = k.n_regs if hasattr(k, "n_regs") else -1
print(json.dumps(out))
"""

# (key, type, mixed, BN, BB, SPLIT, warps, warps along K, NORM, RSS, RQ, RL): the consumers -- the 7B's
# q/k/v configs (K-warps, all-Q4_K and mixed) and gate/up's rows-on-warps one, plain, NORM 4 and NORM 4
# with the tile sums summed after the loop ("4L") -- and the producers -- the down's split config and
# o's one-step one, RSS alone, with RQ and with RQ 2 (through shared memory)
_CASES = [(f"{name} {norm}{'L' if rl else ''}", 12, mixed, bn, bb, split, 4, wk, norm, 0, 0, rl)
          for name, mixed, bn, bb, split, wk in (("qkv", 0, 8, 16, 1, 1), ("qkvm", 1, 8, 16, 1, 1),
                                                 ("gu", 0, 32, 1, 1, 0))
          for norm, rl in ((0, 0), (4, 0), (4, 1))]
_CASES += [(f"{name} {rq}", qt, 0, 32, bb, split, nw, 0, 0, 1, rq, 0)
           for name, qt, bb, split, nw in (("down4", 12, 2, 9, 4), ("down6", 14, 2, 5, 4), ("o", 12, 16, 1, 8))
           for rq in (0, 1, 2)]
# o's one-step RQ 2 build signalling gate+up at its end (PDL 3) and after its dots (PDL 4, Switches.o_signal 2)
_CASES += [(f"o sig{pdl}", 12, 0, 32, 16, 1, 8, 0, 0, 1, 2, 0, pdl) for pdl in (3, 4)]


@pytest.fixture(scope="module")
def ptx():
    return sm90_builds(_COMPILE, _CASES, timeout=900)


@pytest.mark.parametrize("name", ["qkv", "qkvm", "gu"])
def test_norm_scale_build_reads_the_tile_sums_and_nothing_else(ptx, name):
    """NORM 4 against the plain build of the same config: the same PDL waits and dot products, the
    shared memory but for the tile sums' cross-warp reduction (no q8 row of its own there, unlike
    NORM 1 / 2: 44 bytes a chunk), no store more (it stores
    nothing but its output), a load more for the tile sums and a square root (rstd) the plain
    build has not."""
    plain, scaled = ptx[f"{name} 0"], ptx[f"{name} 4"]
    assert scaled.count("griddepcontrol.wait") == plain.count("griddepcontrol.wait") > 0
    assert scaled.count("dp4a") == plain.count("dp4a") > 0
    assert ptx[f"{name} 0 smem"] <= ptx[f"{name} 4 smem"] <= ptx[f"{name} 0 smem"] + 64
    assert scaled.count("st.global") == plain.count("st.global")
    assert scaled.count("ld.global") > plain.count("ld.global")
    assert "sqrt" in scaled and "sqrt" not in plain
    # the tile sums are another kernel's output: loaded only after the wait
    before = scaled.split("griddepcontrol.wait")[0]
    assert before.count("ld.global") == plain.split("griddepcontrol.wait")[0].count("ld.global")


@pytest.mark.parametrize("name", ["down4", "down6", "o"])
def test_residual_q8_build_adds_stores_not_tickets(ptx, name):
    """RQ against the RSS build alone: the same dot products and atomics (the split's ticket only: no
    tail ticket), more stores (the chunk's 8 words and its d, s0, s1) and more loads (its rows of s
    read back past L1, .cg, and the norm weight), one barrier more."""
    rss, rq = ptx[f"{name} 0"], ptx[f"{name} 1"]
    assert rq.count("dp4a") == rss.count("dp4a") > 0
    assert rq.count("atom.global") == rss.count("atom.global")
    assert rq.count("st.global") > rss.count("st.global")
    assert rq.count("ld.global.cg") > rss.count("ld.global.cg")
    assert rq.count("bar.sync") > rss.count("bar.sync")


def test_launch_refuses_the_q8_epilogue_on_a_partial_chunk(monkeypatch):
    """GL.launch's rss_q8 needs whole 32-value chunks per tile (BN a multiple of 32 dividing N), the
    RSS epilogue and one weight; the refusal happens before any launch."""
    from minfer.ops.cuda import gemv_q8_gluon as GL

    launched = []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *a, **k: launched.append((k["RQ"], k["NORM"], k["XP"]))

    monkeypatch.setattr(GL, "_gemv_q8g_kernel", Kernel())
    t = torch.zeros(64)
    p = torch.zeros(16, dtype=torch.int32)
    w = types.SimpleNamespace(qtype=12, planes=[p, p, p, p], n=64, k=3584, tile_rows=0)
    args = ([w], t, t, t, None, t, t, t, 64, 64, 2, 14, 7, 2, 32, 2, 4, 1, (2, 2))
    rq = (t, torch.zeros(16, dtype=torch.int32), t)
    GL.launch(*args, rss=(t, t), rss_q8=rq)
    assert launched == [(True, 0, False)]
    with pytest.raises(ValueError, match="q8 epilogue"):
        GL.launch(*args[:14], 16, *args[15:], rss=(t, t), rss_q8=rq)          # BN 16: half a chunk
    with pytest.raises(ValueError, match="q8 epilogue"):
        GL.launch(*args, rss_q8=rq)                                          # no RSS epilogue
    GL.launch(*args, rscale=(t, 2, 1e-6), x_ahead=True)                      # NORM 4 keeps x ahead
    assert launched[-1] == (False, 4, True) and len(launched) == 2


def _layer(M, qt: int, seed: int, k: int = 512, d: int = 256):
    from minfer.weights import QWeight

    G, Q = M["gemv_repack"], M["gemv_q8"]
    raw = torch.from_numpy(random_weight(qt, d, k, np.random.default_rng(seed)))
    w = QWeight(name="blk.0.attn_output.weight", qtype=qt, shape=(d, k), raw=raw)
    w.repacked = G.repack(raw, qt, d, k)
    g = torch.Generator().manual_seed(seed + 1)
    x, nw = torch.randn(1, d, generator=g) * 3, torch.rand(d, generator=g) + 0.5
    a = torch.randn(1, k, generator=g).to(torch.bfloat16)
    a.q8 = Q.quantize(a, interpret=True)
    return w, x, nw, a


@pytest.mark.parametrize("role,qt,mode", [("attn_norm", 12, 4), ("ffn_norm", 14, 4), ("ffn_norm", 12, 4),
                                          ("attn_norm", 14, 5)])
def test_mode4_falls_back_to_linear_and_the_norm_kernel_bit_for_bit(M, role, qt, mode):
    """ops.linear_add_rms_norm with norm_into_gemv = 4 on the CUDA code in the interpreter (the
    residual epilogue is Gluon-only, and the interpreter never takes the Gluon kernel: not a
    fallback, as the GEMV's own Triton route there is not), then the GEMV and the add + norm + q8
    kernel -- not a deferral -- so h arrives whole with its q8 row: the bits of linear +
    add_rms_norm with the switch at 0, for the down's role and the o projection's (mode 5: 4 for the
    down's role only)."""
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.switches import Switches

    Q, qmatmul = M["gemv_q8"], M["qmatmul"]
    w, x, nw, a = _layer(M, qt, 30 + qt)
    y = Q.gemv_q8(a.q8, w.repacked, out_dtype=torch.bfloat16, interpret=True)
    s0, h0, q80 = Q.add_rms_norm_q8(x, y, nw, 1e-6, torch.bfloat16, interpret=True)
    paths.reset()
    s, h = qmatmul.linear_add_rms_norm(a, w, x, nw, 1e-6, torch.bfloat16,
                                       Context(Switches(norm_into_gemv=mode), None), into_linear=True, role=role)
    snap = paths.snapshot()
    assert not snap["fallbacks"] and not snap["switched_off"], snap
    assert snap["counts"].get("add_rms_norm.q8") == 1 and "add_rms_norm.into_gemv" not in snap["counts"], snap
    assert getattr(h, "prenorm", None) is None
    assert torch.equal(s, s0) and torch.equal(h, h0) and torch.equal(h.q8[0], q80[0]) and torch.equal(h.q8[1], q80[1])


def test_mode4_counts_a_refusal_of_the_gluon_kernel(M, monkeypatch):
    """Where the Gluon kernel has the shape but refuses it (here: this GPU is not sm_90, stubbed),
    mode 4's residual path is a counted fallback naming the reason."""
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.ops.cuda import gemv_q8_gluon as GL
    from minfer.switches import Switches

    qmatmul = M["qmatmul"]
    w, x, nw, a = _layer(M, 12, 44)
    monkeypatch.setattr(qmatmul, "interpret", lambda: False)         # (the route's choice as on a GPU)
    monkeypatch.setattr(qmatmul, "_linear", lambda a_, w_, b_, sw, ws, out_dtype=None:
                        torch.zeros(1, 256, dtype=torch.bfloat16))      # (the GEMV after it: not under test)
    monkeypatch.setattr(GL, "config_for", lambda qtype, n, k, table="": (32, 2, 2, 4))
    monkeypatch.setattr(GL, "device_unsupported", lambda device: "the GPU is sm_80 (stub)")
    paths.reset()
    s, h = qmatmul.linear_add_rms_norm(a, w, x, nw, 1e-6, torch.bfloat16,
                                       Context(Switches(norm_into_gemv=5), None), into_linear=True)
    snap = paths.snapshot()
    assert [k_ for k_ in snap["fallbacks"] if k_.startswith("qmatmul.residual_norm") and "sm_80 (stub)" in k_], snap


@pytest.mark.parametrize("mode", [0, 1, 2, 3, 5])
def test_ffn_role_takes_no_other_mode(M, mode):
    """The o projection's role (ffn_norm) is left alone by modes 0-3 and 5 (theirs is the norm before
    q/k/v): the GEMV, then add_rms_norm without deferral -- the ops the model ran before the role
    existed -- with no residual path tried (no fallback counted)."""
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.switches import Switches

    Q, qmatmul = M["gemv_q8"], M["qmatmul"]
    w, x, nw, a = _layer(M, 12, 41)
    y = Q.gemv_q8(a.q8, w.repacked, out_dtype=torch.bfloat16, interpret=True)
    s0, h0, _ = Q.add_rms_norm_q8(x, y, nw, 1e-6, torch.bfloat16, interpret=True)
    paths.reset()
    s, h = qmatmul.linear_add_rms_norm(a, w, x, nw, 1e-6, torch.bfloat16,
                                       Context(Switches(norm_into_gemv=mode), None), into_linear=True, role="ffn_norm")
    snap = paths.snapshot()
    assert not snap["fallbacks"] and snap["counts"].get("add_rms_norm.q8") == 1, snap
    assert getattr(h, "prenorm", None) is None and torch.equal(s, s0) and torch.equal(h, h0)


def test_scaled_row_on_the_triton_kernel_materializes_the_norm(M):
    """A PreNorm carrying q8u (mode 4's row) reaching the Triton kernel (the interpreter) is a
    counted fallback of `gemv_q8.norm_scale`: the norm kernel runs on s first and the GEMV reads
    its q8 row -- the bits of the norm kernel, then the GEMV -- never the unscaled row."""
    from minfer.ops import paths
    from minfer.ops.cuda.q8_rows import PreNorm

    Q = M["gemv_q8"]
    g = torch.Generator().manual_seed(5)
    s, nw = torch.randn(1, 512, generator=g) * 2, torch.rand(512, generator=g) + 0.5
    rw = M["gemv_repack"].repack(torch.from_numpy(random_weight(12, 64, 512, np.random.default_rng(6))), 12, 64, 512)
    _, _, q80 = M["q8_rows"]._q8_launch(s, None, None, nw, 1e-6, torch.bfloat16, True)
    ref = Q.gemv_q8(q80, rw, out_dtype=torch.float32, interpret=True)
    q8u = Q.quantize(s * nw, interpret=True)
    h = torch.empty((1, 512), dtype=torch.bfloat16)
    pre = PreNorm(s, None, nw, 1e-6, s, h, True, 0, True, True, ssp=(s * s).view(2, 256).sum(1), q8u=q8u)
    paths.reset()
    out = Q.gemv_q8(None, rw, out_dtype=torch.float32, interpret=True, gluon=True, prenorm=pre)
    snap = paths.snapshot()
    assert any(k_.startswith("gemv_q8.norm_scale (fell back") for k_ in snap["fallbacks"]), snap
    assert pre.q8 is not None and torch.equal(out, ref)



_PAD = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from minfer.ops.cuda import gemv_q8_gluon as GL

names = [p.name for p in GL._gemv_q8g_kernel.params if not p.is_constexpr]
q4 = ["*i32", "*i16", "*i32", "*i32"]
types = q4 + q4 + ["*i32", "*fp32", "*fp32", "*fp32", "*bf16", "*fp32", "*i32"] + ["i32"] * 6 + \
    ["*fp32", "*fp32", "*fp32", "*fp32", "fp32", "i32", "*bf16", "*fp32", "*i64", "*bf16", "*i32", "*fp32",
        "i32", "i64", "i32", "i32", "i64", "i32", "i32", "i64", "i32", "i32", "i64", "i32", "i32"]
out = {}
for cap in json.loads(sys.argv[1]):
    p = GL._pads(cap, "37888x3584")
    cex = dict(QT=12, QTB=12, MIXED=False, BN=32, BB=1, NW=4, IS_SPLIT=False, HAS_BIAS=False, HAS_RESID=False, PDL=1,
               PF=True, PRE=True, NORM=4, KP2=128, NCHP=1, RSS=False, WK=False, XP=True, PAD0=p[0], PAD1=p[1], PAD2=p[2])
    sig = dict(zip(names, types)) | {c: "constexpr" for c in cex}
    k = triton.compile(GluonASTSource(GL._gemv_q8g_kernel, sig, cex, {(i,): [["tt.divisibility", 16]] for i in range(15)}),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    out[str(cap)] = [k.metadata.shared, k.asm["ptx"].count("dp4a"), k.asm["ptx"].count("st.global")]
print(json.dumps(out))
"""


def test_occupancy_cap_reserves_the_shared_memory_that_caps_it():
    """A config's twelfth field (gemv_q8g_pad): gate/up's build capped at 9 and 6 programs an SM
    reserves shared memory (its three pads live together, not overlaid) so that that many fit an
    SM's 228 KB with the driver's 1 KB each and one more does not; the same dot products and the
    same stores as the build without it (the pads' read-back store is masked off). No pad of three
    powers of two caps at 200: refused, naming the shape."""
    from minfer.errors import MinferError
    from minfer.ops.cuda import gemv_q8g_pad as P

    got = sm90_builds(_PAD, [0, 9, 6])
    for cap in (9, 6):
        shared, dp4a, stores = got[str(cap)]
        per = shared + P.BLOCK_RESERVED
        assert cap * per <= P.SM_SHARED < (cap + 1) * per, (cap, shared)
        assert dp4a == got["0"][1] > 0 and stores == got["0"][2] + 1
    assert got["0"][0] < 1024
    with pytest.raises(MinferError, match="37888x3584: no shared-memory pad"):
        P._pads(200, "37888x3584")


@pytest.mark.parametrize("name", ["qkv", "qkvm", "gu"])
def test_norm_scale_late_sums_after_the_loop(ptx, name):
    """RL (Switches.norm_rstd_late) against NORM 4: the same loads, stores, waits and dot products; the
    tile sums' cross-warp sum (a barrier) and the square root come after the K loop's dot products
    instead of before them, so nothing the loop needs waits behind the tile sums' load."""
    early, late = ptx[f"{name} 4"], ptx[f"{name} 4L"]
    for op in ("ld.global", "st.global", "griddepcontrol.wait", "dp4a"):
        assert late.count(op) == early.count(op) > 0, op
    assert "sqrt" in late
    first_dot = early.index("dp4a")
    assert "bar.sync" in early[:first_dot] and "sqrt" in early[:first_dot]
    head = late[:late.index("dp4a")]
    assert "bar.sync" not in head and "sqrt" not in head
    # the tile sums' load is still issued after the wait, before the loop
    assert late.split("griddepcontrol.wait")[0].count("ld.global") == early.split("griddepcontrol.wait")[0].count(
        "ld.global")


@pytest.mark.parametrize("name", ["down4", "down6", "o"])
def test_residual_q8_through_shared_memory_reads_nothing_back(ptx, name):
    """RQ 2 (Switches.rq_smem) against RQ 1: the same dot products, atomics and global stores; none of
    the tile's rows of s read back from global memory past L1 (.cg: only a split's partials, as in the
    RSS build), the values moved through shared memory instead; without a split (o) the norm
    weight's load comes before the PDL wait."""
    rss, rq1, rq2 = ptx[f"{name} 0"], ptx[f"{name} 1"], ptx[f"{name} 2"]
    for op in ("dp4a", "atom.global", "st.global"):
        assert rq2.count(op) == rq1.count(op), op
    assert rq2.count("ld.global.cg") == rss.count("ld.global.cg") < rq1.count("ld.global.cg")
    assert "st.shared" in rq2
    if name == "o":
        pre1, pre2 = rq1.split("griddepcontrol.wait")[0], rq2.split("griddepcontrol.wait")[0]
        assert pre2.count("ld.global") > pre1.count("ld.global")


def test_o_signal_after_its_dots_comes_before_the_epilogue(ptx):
    """PDL 4 (Switches.o_signal 2) against 3 on o's one-step residual build: the same wait, dot
    products and stores; the launch_dependents (one a thread's element of the chunk index, as the
    wait) before the epilogue's global stores instead of after all of them."""
    end, dots = ptx["o sig3"], ptx["o sig4"]
    sig = "griddepcontrol.launch_dependents"
    for op in ("griddepcontrol.wait", "dp4a", "st.global", sig):
        assert dots.count(op) == end.count(op) > 0, op
    assert end.index(sig) > end.rindex("st.global")
    assert dots.rindex("griddepcontrol.wait") < dots.index(sig) and dots.rindex(sig) < dots.index("st.global")
