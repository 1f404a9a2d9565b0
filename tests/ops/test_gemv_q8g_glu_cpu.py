"""The GLU prologue on the Gluon q8 GEMV (Switches.gemv_glu_prologue; gemv_q8_gluon._tile's NORM 1 with GX):
the down projection of the 7B and of every model the shape rule routes to the Gluon kernel makes
silu(gate) * up's q8 form in its programs, so the SwiGLU launch before it goes. Here, without a GPU:
the kernel's sm_90 builds (the 1.5B's Q4_K / Q6_K downs as the shape rule gives them, with the residual
epilogue, and the plain epilogue) hold the dp4a and the exp and spill nothing in ptxas (the 7B's K range
would: the prologue's 32-chunk limit); glu_route refuses exactly the Gluon configs with no prologue
path (warps along K, stream-K, a longer K range) and gemv_q8 refuses them before any launch;
linear_add_rms_norm hands a deferred row to the residual GEMV as (gate, up) and counts it, and where
that GEMV does not take the launch the row still reaches the down GEMV's prologue (the interpreter's
Triton kernel) with the bits of the two launches. The Gluon kernel's numbers: tests/gpu/
test_gemv_glu_prologue_gpu.py."""

from __future__ import annotations

import os
import sys
import types

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import GEMV_Q8G_TAIL, sm90_builds  # noqa: E402
from test_gemv_q8_glu_prologue import _down  # noqa: E402
from test_norm_into_gemv_cpu import M  # noqa: E402,F401  (the interpreted modules' fixture)

from minfer.errors import MinferError  # noqa: E402

_COMPILE = r"""
import json, os, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from minfer.ops.cuda import gemv_q8_gluon as GL

T = GPUTarget("cuda", 90, 32)
PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
q4 = ["*i32", "*i32", "*i32", "*i32"]
q6 = ["*i32", "*i16", "*i16", "*fp16"]
tail = json.loads(sys.argv[1])["tail"]
gtail = list(tail)
gtail[13] = gtail[14] = "*bf16"                 # nx / ny: the gate / up rows
def build(cex, regs):
    names = [p.name for p in GL._gemv_q8g_kernel.params if not p.is_constexpr]
    types = (q4 if cex["QT"] == 12 else q6) * 2 + (gtail if cex.get("GX") else tail)
    sig = dict(zip(names, types)) | {c: "constexpr" for c in cex}
    src = GluonASTSource(GL._gemv_q8g_kernel, sig, cex, {(i,): [["tt.divisibility", 16]] for i in range(10)})
    k = triton.compile(src, target=T, options={"num_warps": 4} | ({"maxnreg": regs} if regs else {}))
    ptx = k.asm["ptx"]
    # ptxas's own report (registers, spill stores) at the launch's register cap
    with tempfile.TemporaryDirectory() as d:
        open(os.path.join(d, "k.ptx"), "w").write(ptx)
        r = subprocess.run([PTXAS, "-v", "--gpu-name", "sm_90a", os.path.join(d, "k.ptx"), "-o", os.path.join(d, "k.cubin")]
                           + (["--maxrregcount", str(regs)] if regs else []), capture_output=True, text=True)
    info = r.stdout + r.stderr
    spill = [int(line.split("bytes spill stores")[0].split(",")[-1]) for line in info.splitlines() if "spill stores" in line]
    nreg = [int(line.split("Used ")[1].split(" registers")[0]) for line in info.splitlines() if "Used " in line]
    return [ptx.count("st.local"), ptx.count("dp4a"), ptx.count("ex2.approx"), k.metadata.shared, spill[-1], nreg[-1]]
# the downs as the shape rule gives the 1.5B's (1536 x 8960: 4 blocks a program, 32 q8 chunks), residual epilogue with
# the q8 form, tile-major; Q4_K's register cap 72
down = dict(QT=12, QTB=12, MIXED=False, BN=32, BB=2, NW=4, IS_SPLIT=True, HAS_BIAS=False, HAS_RESID=False, PDL=1,
            PF=True, PRE=True, NORM=0, KP2=1, NCHP=1, RSS=True, RQ=1, WK=False, SF=False, TM=32, XP=True)
glu = dict(NORM=1, GX=True, XP=False, NCHP=32)
q6k = dict(QT=14, QTB=14)
out = {"q4 x ahead": build(down, 72), "q4 glu": build(down | glu, 72), "q6 x ahead": build(down | q6k, 0),
       "q6 glu": build(down | q6k | glu, 0), "plain glu": build(down | glu | dict(RSS=False, RQ=0, TM=0), 0),
       "q4 glu 128": build(down | glu | dict(NCHP=128), 72)}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def builds():
    return sm90_builds(_COMPILE, {"tail": GEMV_Q8G_TAIL})


@pytest.mark.parametrize("name", ["q4 glu", "q6 glu", "plain glu"])
def test_glu_builds_hold_the_dots_and_the_exp_without_spills(builds, name):
    """At the prologue's limit (GLU_MAX_CHUNKS), ptxas spills nothing and the Q6_K build stays within the
    registers of the x-ahead build it replaces (its occupancy); past it (the 7B's 128 chunks) it spills:
    the limit is where it is for that reason."""
    from minfer.ops.cuda.gemv_q8 import GLU_MAX_CHUNKS

    assert GLU_MAX_CHUNKS == 32
    local, dp4a, ex2, smem, spill, nreg = builds[name]
    base = builds["q6 x ahead" if name.startswith("q6") else "q4 x ahead"]
    assert local == 0 and spill == 0 and dp4a == base[1] and ex2 > 0 and smem > base[3], (builds[name], base)
    assert nreg <= base[5] or name == "plain glu", (builds[name], base)
    assert builds["q4 glu 128"][4] > 0, builds


def _rw(n, k):
    return types.SimpleNamespace(qtype=12, n=n, k=k, planes=(torch.zeros(4),) * 4, tile_rows=0)


def test_glu_refused_only_where_the_gluon_config_has_no_prologue(monkeypatch):
    from minfer.ops.cuda import gemv_q8
    from minfer.ops.cuda import gemv_q8_gluon as GL

    monkeypatch.setattr(GL, "device_unsupported", lambda device: None)
    monkeypatch.setattr(GL, "CONFIGS", {"Q4_K 256x1024": (32, 2, 2, 4, 1, 0, False, False, False, True, True),
                                        "Q4_K 512x1024": (8, 8, 1, 4, 1, 0, False, True),           # warps along K
                                        "Q4_K 768x1024": (32, 2, -132, 4),                          # stream-K
                                        "Q4_K 256x8192": (32, 2, 4, 4),     # 8 blocks a program: 64 chunks
                                        "Q4_K 512x8192": (32, 2, 8, 4)})    # 4 blocks: 32 chunks
    assert gemv_q8.glu_route(_rw(256, 1024), True, "", "cuda")[1] is None
    assert "warps along K" in gemv_q8.glu_route(_rw(512, 1024), True, "", "cuda")[1]
    assert "stream-K" in gemv_q8.glu_route(_rw(768, 1024), True, "", "cuda")[1]
    assert "64 q8 chunks" in gemv_q8.glu_route(_rw(256, 8192), True, "", "cuda")[1]
    assert gemv_q8.glu_route(_rw(512, 8192), True, "", "cuda")[1] is None
    assert gemv_q8.glu_route(_rw(512, 1024), False, "", "cuda")[1] is None      # the Triton kernel: no refusal
    g = torch.zeros(1, 1024, dtype=torch.bfloat16)
    with pytest.raises(MinferError, match="GLU prologue cannot take 512x1024"):
        gemv_q8.gemv_q8(None, _rw(512, 1024), gluon=True, glu=(g, g))


def test_the_residual_gemv_gets_the_deferred_row(M, monkeypatch):
    """linear_add_rms_norm (the down, then the next layer's attention norm, mode 4) passes a deferred
    SwiGLU row to gemv_q8_residual as glu=(gate, up) with no q8 row, and counts the prologue; where that
    GEMV declines (here: the interpreter's Triton kernel, which has no residual epilogue) the down's
    Triton GEMV takes the row in its own prologue: the bits of swiglu_q8, the GEMV and the add + norm."""
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.ops.cuda import linear_norm
    from minfer.switches import Switches

    N, Q = M["norm_rope_act"], M["gemv_q8"]
    n, k = 256, 768
    w, _ = _down(M, 12, n, k, seed=21)
    g = torch.Generator().manual_seed(5)
    gate, up = (torch.randn(1, k, generator=g) * 2).to(torch.bfloat16), torch.randn(1, k, generator=g).to(torch.bfloat16)
    x, nw = torch.randn(1, n, generator=g), torch.rand(n, generator=g) + 0.5
    seen = []
    real = Q.gemv_q8_residual

    def spy(q8, rw, xx, act_dtype, **kw):
        seen.append((q8, kw.get("glu")))
        return real(q8, rw, xx, act_dtype, **kw)

    monkeypatch.setattr(Q, "gemv_q8_residual", spy)
    outs = {}
    for on in (False, True):
        ctx = Context(Switches(gemv_glu_prologue=on), None)
        paths.reset()
        h = N.swiglu(gate, up, ctx, into_linear=True)
        s, hn = linear_norm.linear_add_rms_norm(h, w, x, nw, 1e-6, torch.bfloat16, ctx, into_linear=True)
        outs[on] = (s, hn)
        counts = paths.snapshot()["counts"]
        if on:
            assert seen[-1][0] is None and seen[-1][1][0] is gate and seen[-1][1][1] is up
            assert counts.get("qmatmul.Q4_K.decode.q8glu") == 1 and "swiglu.q8" not in counts, counts
        else:
            assert seen[-1][0] is not None and seen[-1][1] is None and counts.get("swiglu.q8") == 1, counts
    assert torch.equal(outs[True][0], outs[False][0]) and torch.equal(outs[True][1], outs[False][1])


def test_a_residual_launch_with_the_norm_tail_declines_the_glu(monkeypatch):
    """gemv_q8_residual declines (None, with the reason) a GLU row where the Gluon launch would carry the
    norm tail (norm_into_gemv 3), which has no GLU prologue; the caller then makes the row or takes the
    plain GEMV's prologue."""
    from minfer.ops.cuda import gemv_q8_gluon as GL
    from minfer.ops.cuda.gemv_q8_residual import gemv_q8_residual

    monkeypatch.setattr(GL, "device_unsupported", lambda device: None)
    monkeypatch.setattr(GL, "CONFIGS", {"Q4_K 256x1024": (32, 2, 2, 4, 1, 0, False, False, False, True, True)})
    g = torch.zeros(1, 1024, dtype=torch.bfloat16)
    refused = []
    assert gemv_q8_residual(None, _rw(256, 1024), torch.zeros(1, 256), torch.bfloat16, gluon=True,
                            tail=(torch.ones(256), 1e-6), refused=refused, glu=(g, g)) is None
    assert refused and "norm tail" in refused[0], refused


@pytest.mark.parametrize("on_gluon", [False, True])
def test_the_default_leaves_a_gluon_down_its_swiglu_launch(M, monkeypatch, on_gluon):
    """Switches.gemv_glu_prologue 1 (the default, perf-log AY1): swiglu(into_linear, down=w) leaves the row to
    a down that runs on the Triton q8 GEMV, and makes it at once (`swiglu.q8`, no deferral) for a down on the
    Gluon kernel (gemv_q8.glu_route, faked here: the interpreter has no Gluon kernel); 2 defers it to either.
    A row deferred anyway (no down named) that meets a Gluon down at 1 is made first as a counted fallback
    naming the switch."""
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.ops.cuda import qmatmul
    from minfer.switches import Switches

    N, Q = M["norm_rope_act"], M["gemv_q8"]
    monkeypatch.setattr(Q, "glu_route", lambda rw, *a, **kw: (on_gluon, None))
    w, _ = _down(M, 12, 256, 768, seed=3)
    g = torch.Generator().manual_seed(9)
    gate, up = torch.randn(1, 768, generator=g).to(torch.bfloat16), torch.randn(1, 768, generator=g).to(torch.bfloat16)
    for level, deferred in ((0, False), (1, not on_gluon), (2, True)):
        ctx = Context(Switches(gemv_glu_prologue=level), None)
        paths.reset()
        h = N.swiglu(gate, up, ctx, into_linear=True, down=w)
        c = paths.snapshot()["counts"]
        assert (getattr(h, "glu_row", None) is not None) == deferred, level
        assert c.get("swiglu.into_gemv", 0) == int(deferred) and c.get("swiglu.q8", 0) == int(not deferred), c
    paths.reset()
    h = N.swiglu(gate, up, Context(Switches(), None), into_linear=True)          # no down named: deferred
    assert h.glu_row is not None
    planes = qmatmul.glu_planes(h, w, Switches())
    snap = paths.snapshot()
    if on_gluon:
        assert planes is None and h.glu_row.done and h.q8 is not None
        assert [k for k in snap["fallbacks"] if k.startswith("swiglu.into_gemv") and "MINFER_GEMV_GLU_PROLOGUE=1" in k], snap
    else:
        assert planes is not None and not h.glu_row.done and not snap["fallbacks"], snap
