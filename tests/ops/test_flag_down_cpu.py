"""The host side of the down's flag wait (Switches.flag_down, ops/cuda/gemv_q8g_flags.py) without a GPU: which
launches get the flag buffer, the buffers the SwiGLU result holds for the down, the down's tile tickets apart
from the pairs', the pending mark and its memset, and every refusal counted with its reason. The kernels are
recorded, not run (the Gluon kernels need an sm_90 GPU: tests/gpu/test_flag_down_gpu.py runs them); their sm_90
builds with the flags are checked here too."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))


class _Rec:
    def __init__(self):
        self.calls = []

    def __call__(self, *a, **kw):
        self.calls.append((a, kw))


@pytest.fixture()
def GL(monkeypatch):
    from minfer.ops.cuda import gemv_q8_gluon as GL

    monkeypatch.setattr(GL, "device_unsupported", lambda device: None)
    monkeypatch.setattr(GL, "CONFIGS", {"Q4_K 4096x1024": (32, 1, 1, 4, 1, 0, False, False, False, False, False),
                                        "Q4_K 1024x2048": (32, 2, 2, 4, 1, 0, False, False, False, False, True),
                                        "Q4_K 1024x1024": (32, 2, -132, 4)})
    GL.rec_swiglu, GL.rec_launch = _Rec(), _Rec()
    monkeypatch.setattr(GL, "launch_swiglu", GL.rec_swiglu)
    monkeypatch.setattr(GL, "launch", GL.rec_launch)
    return GL


def _rw(n, k):
    return types.SimpleNamespace(qtype=12, n=n, k=k, planes=(torch.zeros(4),) * 4, tile_rows=0)


def _q8(k):
    return torch.zeros(k // 4, dtype=torch.int32), torch.zeros(k // 8)


def _fallbacks():
    from minfer.ops import paths

    return [r for r in paths.snapshot()["fallbacks"] if r.startswith("gemv_q8.flag_down")]


def test_swiglu_with_flags_then_the_down_waits_on_them(GL):
    from minfer.ops import paths
    from minfer.ops.cuda import gemv_q8_residual as R
    from minfer.ops.cuda import gemv_q8_swiglu as S
    from minfer.ops.cuda.gemv_repack import GemvWorkspace

    ws = GemvWorkspace("cpu")
    q8 = _q8(1024)
    paths.reset()
    h, hq = S.gemv_q8_swiglu(q8, _rw(4096, 1024), ws=ws, gluon=True, flags=True)
    (a, kw), = GL.rec_swiglu.calls
    assert kw["flags"] is ws.flags and ws.flags.shape == (256 * S.FG.STRIDE,) and ws.flags_pending
    assert hq.flags is ws.flags and hq.keep[0] is a[4] and hq.keep[1] is q8[0] and hq.keep[2] is q8[1]
    assert tuple(hq) == (a[6], a[7])              # (gq, gf): what the down reads
    r = R.gemv_q8_residual(hq, _rw(1024, 2048), torch.zeros(1, 1024), torch.bfloat16, ws=ws, gluon=True, pdl=1)
    assert r is not None and not ws.flags_pending
    (a, kw), = GL.rec_launch.calls
    assert kw["flags"] is ws.flags
    cnt = a[7]
    # the down's 32 row tiles' tickets from CNT_OFF, apart from the pairs' (which may still run beside it)
    assert cnt.data_ptr() == ws.cnt.data_ptr() + 4 * S.FG.CNT_OFF and cnt.numel() >= 32
    counts = paths.snapshot()["counts"]
    assert counts.get("gemv_q8.flag_down") == 1 and not _fallbacks()


def test_flags_no_down_consumed_are_zeroed_before_the_next_swiglu(GL):
    from minfer.ops import paths
    from minfer.ops.cuda import gemv_q8_residual as R
    from minfer.ops.cuda import gemv_q8_swiglu as S
    from minfer.ops.cuda.gemv_repack import GemvWorkspace

    ws = GemvWorkspace("cpu")
    paths.reset()
    h, hq = S.gemv_q8_swiglu(_q8(1024), _rw(4096, 1024), ws=ws, gluon=True, flags=True)
    S.FG.counts(ws.flags)[:8] = 8                     # as the pairs left them
    # a down the flag wait cannot take (stream-K: no residual epilogue): None, the mark stays pending
    assert R.gemv_q8_residual(hq, _rw(1024, 1024), torch.zeros(1, 1024), torch.bfloat16, ws=ws, gluon=True) is None
    assert ws.flags_pending and not GL.rec_launch.calls
    S.gemv_q8_swiglu(_q8(1024), _rw(4096, 1024), ws=ws, gluon=True, flags=True)
    assert int(ws.flags.abs().sum()) == 0 and ws.flags_pending
    assert [r for r in _fallbacks() if "not consumed" in r]
    # a down with the norm tail (its tickets are the counters' first): refused, counted
    paths.reset()
    assert R.gemv_q8_residual(hq, _rw(1024, 2048), torch.zeros(1, 1024), torch.bfloat16, ws=ws, gluon=True,
                              tail=(torch.ones(1024), 1e-6)) is not None
    assert GL.rec_launch.calls[-1][1]["flags"] is None and [r for r in _fallbacks() if "norm tail" in r]


def test_flags_refused_where_the_protocol_does_not_apply(GL):
    from minfer.ops import paths
    from minfer.ops.cuda import gemv_q8_swiglu as S
    from minfer.ops.cuda.gemv_repack import GemvWorkspace

    ws = GemvWorkspace("cpu")
    paths.reset()
    h, hq = S.gemv_q8_swiglu(_q8(1024), _rw(4096, 1024), ws=ws, gluon=True, flags=True, paired=True)
    assert GL.rec_swiglu.calls[-1][1]["flags"] is None and not hasattr(hq, "flags")
    assert [r for r in _fallbacks() if "paired" in r]
    paths.reset()
    S.gemv_q8_swiglu(_q8(1024), _rw(4096, 1024), ws=None, gluon=True, flags=True)
    assert [r for r in _fallbacks() if "no workspace" in r]
    paths.reset()
    h, hq = S.gemv_q8_swiglu(_q8(1024), _rw(4096, 1024), ws=ws, gluon=True)      # flags off: no count, no buffer
    assert not _fallbacks() and getattr(ws, "flags", None) is None and not hasattr(hq, "flags")


BUILD = r"""
import json, os, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
sys.path.insert(0, sys.argv[1])
from kernel_data import GEMV_Q8G_TAIL
from minfer.ops.cuda import gemv_q8_gluon as GL
BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
out = {}
kern = GL._gemv_q8g_kernel
names = [p.name for p in kern.params if not p.is_constexpr]
types = ["*i32"] * 8 + GEMV_Q8G_TAIL
for fl in (0, 2):
    cex = dict(QT=12, QTB=12, MIXED=False, BN=32, BB=2, NW=4, IS_SPLIT=8, HAS_BIAS=False, HAS_RESID=False, PDL=1,
               PF=1, PRE=True, NORM=0, KP2=1, NCHP=1, RSS=True, WK=False, SF=False, TM=32, XP=True, RQ=2, FL=fl)
    src = GluonASTSource(kern, dict(zip(names, types)) | {c: "constexpr" for c in cex}, cex, {})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "maxnreg": 72})
    out[f"down{fl}"] = k.asm["ptx"]
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        out[f"use{fl}"] = subprocess.run([BIN + "/cuobjdump", "-res-usage", f.name], capture_output=True,
                                         text=True).stdout
kern = GL._gemv_q8g_glu_kernel
names = [p.name for p in kern.params if not p.is_constexpr]
types = ["*i32"] * 4 + ["*i32", "*fp32", "*bf16", "*fp32", "*i32", "*i32", "*fp32", "i32", "i32", "i32", "i32",
                        "*i64", "*i32"]
for fl in (0, 1):
    cex = dict(QT=12, BN=32, BB=1, NW=4, PDL=1, PF=1, TM=32, FL=fl)
    src = GluonASTSource(kern, dict(zip(names, types)) | {c: "constexpr" for c in cex}, cex, {})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    out[f"glu{fl}"] = k.asm["ptx"]
print(json.dumps(out))
"""


def test_sm90_builds_wait_on_the_flags_in_place_of_the_pdl_wait():
    """The down's build with FL 2 has no griddepcontrol.wait, acquire loads of the flags with a sleep between
    rounds, .cg loads of the q8 row and still the PDL signal; the SwiGLU build with FL 1 one release atomic more than without."""
    import json

    r = subprocess.run([sys.executable, "-c", BUILD, os.path.dirname(__file__)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    ptx = json.loads(r.stdout.strip().splitlines()[-1])
    d0, d2, g0, g1 = ptx["down0"], ptx["down2"], ptx["glu0"], ptx["glu1"]
    assert d0.count("griddepcontrol.wait") == 1 and d2.count("griddepcontrol.wait") == 0
    assert d0.count("griddepcontrol.launch_dependents") == 1 and d2.count("griddepcontrol.launch_dependents") == 1
    assert "ld.acquire.gpu" in d2 and "nanosleep" in d2 and "ld.acquire" not in d0 and "acquire.add" not in d2
    assert d2.count("ld.global.cg") == d0.count("ld.global.cg") + 22       # the q8 row's 22 loads past L1
    assert g1.count("atom.global.gpu.release.add") == 1 and "release.add" not in g0


def test_a_down_on_another_path_zeroes_the_flags_after_it(GL, monkeypatch):
    """linear_add_rms_norm whose down does not wait on the flags (here: the residual GEMV declines, the plain path
    runs): the flags are zeroed right after it (settle, counted), not left for a graph's next replay."""
    from minfer.ops import paths
    from minfer.ops.cuda import gemv_q8g_flags as FG
    from minfer.ops.cuda.gemv_repack import GemvWorkspace

    ws = GemvWorkspace("cpu")
    fl = FG.flags_of(ws)
    FG.counts(fl)[:4] = 8
    ws.flags_pending = True
    q8 = FG.FlagQ8(_q8(1024))
    q8.flags, q8.keep = fl, ()
    paths.reset()
    FG.settle(ws, q8)
    assert int(fl.abs().sum()) == 0 and not ws.flags_pending
    assert [r for r in _fallbacks() if "did not wait" in r]
    FG.counts(fl)[:4] = 8                            # consumed (not pending): left to the down's own reset
    FG.settle(ws, q8)
    assert int(fl.abs().sum()) == 32
