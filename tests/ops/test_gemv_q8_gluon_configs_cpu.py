"""Gluon q8 GEMV config fields on sm_90 builds made here (no GPU), and their launch checks.

Prefetch 2 (the fifth field = 2): both steps of a two-step split load before griddepcontrol.wait --
twice the weight loads of prefetch 1 before it, and after it only the activation loads (prefetch 1
loads its second step there) -- for the all-Q4_K build and the mixed Q4_K + Q6_K one (the 7B's
q/k/v with a Q6_K v). The launcher refuses prefetch 2 for a split of more than two steps.

Warps along K (the eighth field): without a K split the build has no global atomic and no
partial-sum round (the row sums are reduced across the warps in shared memory); the launcher
refuses a step of fewer than 16 chunks a warp. Both refusals name the shape.
With a deferred norm gemv_q8 runs the norm kernel first for such a config (counted as the norm
prologue's fallback). The ninth field (the second weight's tiles first) only reorders the tiles.
The kernels' numbers on the GPU: tests/gpu/test_gemv_q8_gpu.py (these configs at every K)."""

from __future__ import annotations

import os
import sys
import types

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import GEMV_Q8G_TAIL, sm90_builds  # noqa: E402

from minfer.errors import MinferError

_COMPILE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from minfer.ops.cuda import gemv_q8_gluon as GL

T = GPUTarget("cuda", 90, 32)
names = [p.name for p in GL._gemv_q8g_kernel.params if not p.is_constexpr]   # the runtime arguments
q4 = ["*i32", "*i32", "*i32", "*i32"]
q6 = ["*i32", "*i16", "*i16", "*fp16"]
out = {}
arg = json.loads(sys.argv[1])
for name, (mixed, pf, wk, bn, bb, split, *sf) in arg["cases"].items():
    planes = q4 + (q6 if mixed else q4)
    types = planes + arg["tail"]
    cex = dict(QT=12, QTB=14 if mixed else 12, MIXED=bool(mixed), BN=bn, BB=bb, NW=4, IS_SPLIT=split > 1,
               HAS_BIAS=True, HAS_RESID=False, PDL=1, PF=2 if pf == 2 else bool(pf), PRE=False, NORM=0, KP2=1,
               NCHP=1, RSS=False, WK=bool(wk), SF=bool(sf and sf[0]))
    sig = dict(zip(names, types)) | {c: "constexpr" for c in cex}
    src = GluonASTSource(GL._gemv_q8g_kernel, sig, cex, {(i,): [["tt.divisibility", 16]] for i in range(15)})
    out[name] = triton.compile(src, target=T, options={"num_warps": 4}).asm["ptx"]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def ptx():
    # name: (mixed, prefetch, warps along K, BN, BB, SPLIT[, the second weight's tiles first])
    cases = {"0 1": (0, 1, 0, 32, 2, 4), "0 2": (0, 2, 0, 32, 2, 4), "1 1": (1, 1, 0, 32, 2, 4),
             "1 2": (1, 2, 0, 32, 2, 4), "wk": (0, 2, 1, 8, 8, 1), "wk 1": (1, 2, 1, 8, 8, 1),
             "rows": (0, 2, 0, 8, 8, 1), "wk 1 sf": (1, 2, 1, 8, 8, 1, 1)}
    return sm90_builds(_COMPILE, {"tail": GEMV_Q8G_TAIL, "cases": cases})


def _segments(src: str) -> list:
    """Global loads between the PDL waits: [before the first, ..., after the last]."""
    return [part.count("ld.global") for part in src.split("griddepcontrol.wait")]


def test_prefetch2_loads_both_steps_before_the_wait(ptx):
    one, two = _segments(ptx["0 1"]), _segments(ptx["0 2"])
    assert len(one) == len(two) == 2                 # one wait
    (b1, a1), (b2, a2) = one, two
    assert b1 > 0
    assert b2 == 2 * b1                  # (no bias preload here: PRE off) both steps' words, scales, d
    assert a2 == a1 - b1                 # after the wait: prefetch 1's second step is gone, x's loads stay
    assert ptx["0 2"].count("dp4a") == ptx["0 1"].count("dp4a") > 0


def test_prefetch2_mixed_build(ptx):
    """The mixed build has a wait in each branch (Q4_K rows, then the Q6_K rows): the first
    branch's loads before its wait double, the second branch's after its wait shrink, and the
    static count of loads and dp4a is prefetch 1's (the second step's loads moved, none added)."""
    one, two = _segments(ptx["1 1"]), _segments(ptx["1 2"])
    assert len(one) == len(two) == 3
    assert two[0] == 2 * one[0] > 0
    assert two[-1] < one[-1]
    assert sum(two) == sum(one)
    assert ptx["1 2"].count("dp4a") == ptx["1 1"].count("dp4a") > 0


def test_second_weight_first_only_reorders(ptx):
    """The mixed build with the second weight's tiles first (the config's ninth field): the same
    waits, loads and dp4a as without -- only which program takes which tile changes (the compiler
    may lay the two branches out in the other order, so the loads between waits are compared as a
    total)."""
    sf, base = _segments(ptx["wk 1 sf"]), _segments(ptx["wk 1"])
    assert len(sf) == len(base) == 3 and sum(sf) == sum(base) > 0
    assert ptx["wk 1 sf"].count("dp4a") == ptx["wk 1"].count("dp4a") > 0
    assert ptx["wk 1 sf"] != ptx["wk 1"]


def _stub_launch(monkeypatch, field: str, bps: int, bb: int, nwarps: int):
    """GL.launch's arguments for a 64 x 3584 Q4_K weight split in bps-block splits, with the
    kernel replaced by a stub that records its `field` constexpr (the launch checks run on the
    CPU); (args, the recorded values)."""
    from minfer.ops.cuda import gemv_q8_gluon as GL

    launched = []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *a, **k: launched.append(k[field])

    monkeypatch.setattr(GL, "_gemv_q8g_kernel", Kernel())
    t = torch.zeros(64)
    p = torch.zeros(16, dtype=torch.int32)
    w = types.SimpleNamespace(qtype=12, planes=[p, p, p, p], n=64, k=3584, tile_rows=0)
    return ([w], t, t, None, None, t, t, t, 64, 64, 2, 14, bps, -(-14 // bps), 32, bb, nwarps, 1, (2, 1)), launched


@pytest.mark.parametrize("bps,bb,ok", [(4, 2, True), (2, 2, True), (6, 2, False), (14, 1, False)])
def test_launch_refuses_prefetch2_past_two_steps(bps, bb, ok, monkeypatch):
    from minfer.ops.cuda import gemv_q8_gluon as GL

    args, launched = _stub_launch(monkeypatch, "PF", bps, bb, 4)
    if ok:
        GL.launch(*args, prefetch=2)
        assert launched == [2]
    else:
        with pytest.raises(MinferError, match=r"64x3584: prefetch 2 .* splits of at most two steps"):
            GL.launch(*args, prefetch=2)
        assert launched == []
    GL.launch(*args, prefetch=True)      # prefetch 1 takes any split, with the PF of before
    assert launched[-1] is True


@pytest.mark.parametrize("name", ["wk", "wk 1"])
def test_warps_along_k_reduce_in_the_cta(ptx, name):
    """[8, 8, 1, 4, 2, -, -, warps along K]: no split, so no ticket (atom.global) and no partial
    sums; the four warps' row sums meet in shared memory (the rows-on-warps build of the same tile
    needs none: a row's chunks are in one warp)."""
    wk, rows = ptx[name], ptx["rows"]
    assert "atom.global" not in wk and "atom.global" not in rows
    assert wk.count("st.shared") > 0 and rows.count("st.shared") == 0
    assert wk.count("griddepcontrol.wait") == (2 if name == "wk 1" else 1)
    assert wk.count("dp4a") > 0


@pytest.mark.parametrize("bb,nwarps,ok", [(8, 4, True), (16, 8, True), (4, 4, False), (8, 8, False)])
def test_launch_refuses_warps_along_k_on_short_steps(bb, nwarps, ok, monkeypatch):
    from minfer.ops.cuda import gemv_q8_gluon as GL

    args, launched = _stub_launch(monkeypatch, "WK", 14, bb, nwarps)
    if ok:
        GL.launch(*args, kwarps=True)
        assert launched == [True]
    else:
        with pytest.raises(MinferError, match=rf"64x3584: warps along K need .*{bb * 8} chunks for {nwarps} warps"):
            GL.launch(*args, kwarps=True)
        assert launched == []


@pytest.mark.parametrize("wk", [False, True])
def test_deferred_norm_before_a_k_warps_config_runs_the_norm_first(wk, monkeypatch):
    """gemv_q8 with a deferred norm (q8_rows.PreNorm) on the Gluon route (its kernel a stub; the
    launch's choices run on the CPU): a rows config takes the norm into its programs (NORM, counted
    `gemv_q8.norm_prologue`); a warps-along-K config has no norm prologue, so the norm kernel runs
    first (on the interpreter here), counted as that path's fallback naming the config, and the GEMV
    gets its q8 row. The GPU numbers: tests/gpu/test_norm_into_gemv_gpu.py."""
    from minfer.ops import paths
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda import gemv_q8_gluon as GL
    from minfer.ops.cuda.q8_rows import PreNorm

    args, launched = _stub_launch(monkeypatch, "NORM", 14, 8, 4)
    monkeypatch.setattr(GL, "device_unsupported", lambda device: None)
    w = args[0][0]
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(1, 3584, generator=g), torch.randn(1, 3584, generator=g).to(torch.bfloat16)
    s, h = torch.empty(1, 3584), torch.empty(1, 3584, dtype=torch.bfloat16)
    pre = PreNorm(x, y, torch.rand(3584, generator=g) + 0.5, 1e-6, s, h, True, 0, True, True)
    cfg = (8, 8, 1, 4, 2, 0, False, wk)
    paths.reset()
    Q.gemv_q8(None, w, out_dtype=torch.float32, config=cfg, gluon=True, prenorm=pre)
    snap = paths.snapshot()
    assert snap["counts"].get("gemv_q8.gluon") == 1, snap
    if wk:
        assert launched == [0] and pre.q8 is not None                  # the norm kernel ran, then a plain GEMV
        assert "gemv_q8.norm_prologue" not in snap["counts"]
        assert [k for k in snap["fallbacks"] if k.startswith("gemv_q8.norm_prologue") and "along K" in k
                and "(8, 8, 1, 4, 2, 0, False, True)" in k], snap
        assert torch.equal(s, x + y.float())
    else:
        assert launched == [1] and pre.q8 is None                      # the programs make the q8 row
        assert snap["counts"].get("gemv_q8.norm_prologue") == 1 and not snap["fallbacks"], snap
