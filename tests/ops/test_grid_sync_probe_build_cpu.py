"""tools/grid_sync_probe.py (issue 12: a grid barrier against the launch hand-off) without a GPU.

- Its kernels through Triton's sm_90 compiler (kernel_data.sm90_builds, a fresh interpreter without
  TRITON_INTERPRET): the phase kernel holds griddepcontrol's wait and launch_dependents only with PDL, its
  pre-wait tile loads come before the wait and no scalar load (the dependency) does; the persistent kernel's
  barrier holds the acq_rel arrival, the release of the generation and an acquire poll (one thread's, or the
  inline ld.acquire of all), the weight loads are 16 bytes wide, and with PRE a tile is loaded before the
  arrival, without PRE none; no build spills.
- The kernels in Triton's interpreter against a numpy expectation written here: the launch chain over 4
  programs, the persistent kernel with one program (the barrier never waits), and two programs, which the
  interpreter runs one after the other -- the non-resident case: the waiter must give up and set the error
  word, not hang.
- The pure helpers: the argument parsing, the byte schedule (cycling the list, aligned, disjoint, each
  program's share a multiple of 16 covering the phase) and the rotation (>= 200 MB between re-reads)."""

from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import sm90_builds  # noqa: E402

_TOOLS = os.path.join(os.path.dirname(__file__), "..", "..", "tools")
sys.path.insert(0, _TOOLS)
import grid_sync_probe as S  # noqa: E402

_COMPILE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
sys.path.insert(0, json.loads(sys.argv[1]))
import grid_sync_probe as S

T = GPUTarget("cuda", 90, 32)
out = {}
ptrs = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}
sig = dict(w="*i32", outs="*fp32", p="i32", off="i32", n="i32", per="i32", G="i32")
for pdl in (0, 1):
    cex = dict(BLOCK=4096, PDL=pdl, PRE=pdl)
    k = triton.compile(ASTSource(S._phase_kernel, sig | {c: "constexpr" for c in cex}, cex, ptrs), target=T,
                       options={"num_warps": 8})
    out[f"phase {pdl}"] = k.asm["ptx"]
sig = dict(w="*i32", outs="*fp32", sched="*i32", bar="*i32", err="*i32", P="i32", G="i32", spin_limit="i32")
for pre, sync, poll in ((0, 1, 0), (1, 1, 0), (1, 1, 1), (0, 0, 0)):
    cex = dict(BLOCK=4096, PRE=pre, SYNC=bool(sync), POLL=poll)
    k = triton.compile(ASTSource(S._persistent_kernel, sig | {c: "constexpr" for c in cex}, cex, ptrs), target=T,
                       options={"num_warps": 8})
    out[f"persist {pre}{sync}{poll}"] = k.asm["ptx"]
print(json.dumps(out))
"""

_V4 = re.compile(r"ld\.global(\.[\w:]+)*\.v4\.b32")
_SCALAR = re.compile(r"ld\.global\.b32")


@pytest.fixture(scope="module")
def ptx():
    return sm90_builds(_COMPILE, os.path.abspath(_TOOLS))


@pytest.mark.parametrize("pdl", [0, 1])
def test_phase_kernel_pdl_markers_and_load_order(ptx, pdl):
    src = ptx[f"phase {pdl}"]
    assert "st.local" not in src and _V4.search(src)
    assert ("griddepcontrol.wait" in src) == bool(pdl)
    assert ("griddepcontrol.launch_dependents" in src) == bool(pdl)
    if pdl:
        head = src[:src.index("griddepcontrol.wait")]
        assert _V4.search(head)              # the first weight tile is in flight before the wait
        assert not _SCALAR.search(head)      # the dependency (one float of the previous phase) after it


def test_persistent_kernel_barrier(ptx):
    for key in ("persist 010", "persist 110", "persist 111"):
        src = ptx[key]
        assert "st.local" not in src and _V4.search(src), key
        assert "griddepcontrol" not in src
        assert re.search(r"atom\.global\.gpu\.acq_rel\.add", src), key           # the arrival
        assert re.search(r"atom\.global\.gpu\.release\.add", src), key           # the generation's bump
        assert re.search(r"atom\.global\.gpu\.relaxed\.max", src), key           # the timeout's error word
        assert re.search(r"ld(\.global)?(\.gpu)?\.acquire(\.gpu)?(\.global)?\.b32", src), key   # the poll
        head = src[:re.search(r"atom\.global\.gpu\.acq_rel", src).start()]
        assert bool(_V4.search(head)) == (key[-3] == "1"), key                   # PRE: a tile before the arrival
    assert "ld.acquire.gpu.global.b32" in ptx["persist 111"]                     # POLL 1: the inline poll
    assert "ld.acquire.gpu.global.b32" not in ptx["persist 110"]
    assert "atom." not in ptx["persist 000"] and "acquire" not in ptx["persist 000"]   # no barrier: no sync


def _expect(w, sched, G, o0):
    rows = [np.asarray(o0, np.float32)]
    for off, n, per in sched:
        s = np.zeros(G, np.int64)
        for g in range(G):
            lo, hi = off + g * per, off + min(n, (g + 1) * per)
            s[g] = w[lo:hi].sum() if hi > lo else 0
        rows.append((s.astype(np.float32) + np.float32(0.5) * np.roll(rows[-1], -1)).astype(np.float32))
    return np.stack(rows)


@pytest.fixture
def interpreted():
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the interpreter checks run where tests/conftest.py sets TRITON_INTERPRET (no GPU)")
    return S


def test_interpreted_chain_and_reference(interpreted):
    G, P = 4, 5
    sched, lay = S.schedule(P, [3000, 0, 700, 64], G, align=256)
    w = torch.randint(0, 4, (lay // 4,), dtype=torch.int32, generator=torch.Generator().manual_seed(1))
    o0 = torch.arange(G, dtype=torch.float32) * 0.25
    want = _expect(w.numpy(), sched, G, o0.numpy())
    for pdl_pre in (0, 1, 3):
        outs = torch.full((P + 1, G), float("nan"))
        outs[0] = o0
        for p, (off, n, per) in enumerate(sched):
            S._phase_kernel[(G,)](w, outs, p, off, n, per, G, BLOCK=64, PDL=0, PRE=pdl_pre, num_warps=1)
        assert np.array_equal(outs.numpy(), want), pdl_pre
    assert np.array_equal(S.reference(w, sched, G, o0).numpy(), want)


def _persistent(sched, lay, G, pre, spin, seed):
    w = torch.randint(0, 4, (lay // 4,), dtype=torch.int32, generator=torch.Generator().manual_seed(seed))
    outs = torch.full((len(sched) + 1, G), float("nan"))
    outs[0] = 0.5
    bar, err = torch.zeros(2 * S.GEN.value, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    S._persistent_kernel[(G,)](w, outs, torch.tensor(sched, dtype=torch.int32).flatten(), bar, err, len(sched), G,
                               spin, BLOCK=64, PRE=pre, SYNC=True, POLL=0, num_warps=1)
    return w, outs, bar, err


@pytest.mark.parametrize("pre", [0, 1])
def test_interpreted_persistent_one_program(interpreted, pre):
    sched, lay = S.schedule(5, [3000, 0, 700, 64], 1, align=256)
    w, outs, bar, err = _persistent(sched, lay, 1, pre, 100, 2)
    assert np.array_equal(outs.numpy(), _expect(w.numpy(), sched, 1, [0.5]))
    assert err.item() == 0 and bar[0].item() == 0 and bar[S.GEN.value].item() == 4   # 4 barriers, reset


def test_interpreted_non_resident_grid_gives_up(interpreted):
    sched, lay = S.schedule(5, [3000], 2, align=256)
    _, _, _, err = _persistent(sched, lay, 2, 1, 50, 3)
    assert 2 <= err.item() <= 5                       # phase + 1 of a barrier that timed out


def test_arguments():
    a = S.parse_args([])
    assert a.phases == 196 and a.programs_per_sm == 1 and a.poll_kinds == ["one", "all"]
    assert a.sizes == [9.3e6, 0.3e6, 0.0, 7.2e6, 76e6, 0.15e6, 38e6]
    a = S.parse_args(["--bytes", "1e6, 2e6", "--phases", "3", "--programs-per-sm", "2", "--polls", "all"])
    assert a.sizes == [1e6, 2e6] and a.phases == 3 and a.programs_per_sm == 2 and a.poll_kinds == ["all"]
    for bad in (["--bytes", "-1"], ["--block", "1000"], ["--polls", "atom"], ["--phases", "0"]):
        with pytest.raises(SystemExit):
            S.parse_args(bad)


def test_schedule_and_rotation():
    sizes = [9.3e6, 0.3e6, 0.0, 7.2e6, 76e6, 0.15e6, 38e6]
    sched, lay = S.schedule(196, sizes, 132)
    assert len(sched) == 196
    spans = []
    for p, (off, n, per) in enumerate(sched):
        b = sizes[p % 7]
        assert b <= n * 4 < b + 64 and n % 16 == 0 and per % 16 == 0
        assert per * 132 >= n and (per - 16) * 132 < n or n == 0
        assert off * 4 % 4096 == 0
        spans.append((off * 4, off * 4 + n * 4))
    assert all(e0 <= s1 for (_, e0), (s1, _) in zip(spans, spans[1:]))   # disjoint, in order
    assert spans[-1][1] <= lay and abs(lay - 28 * sum(sizes)) < 196 * 4096
    assert S.rotation(lay) == 1                        # 3.7 GB a repetition: every byte once
    _, small = S.schedule(7, sizes, 132)               # one layer, 131 MB: two copies alternate
    assert S.rotation(small) == 2 and 2 * small >= 200e6 and S.rotation(0) == 1
