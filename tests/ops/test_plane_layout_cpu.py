"""The engine's plane layout choice (ops/cuda/plane_layout.py): the shapes whose Gluon table
config asks for tile-major planes (its tenth field) get them, in the config's BN-row tiles, and
get their row-major planes back when MINFER_GEMV_TILES is off; row views of a fused group are
left alone. The device check is stubbed (an sm_90 GPU); the kernels on both layouts are tested
in test_tile_major_cpu.py and tests/gpu/test_gemv_q8_tiles_gpu.py."""

from __future__ import annotations

import os
import sys
import types

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import random_weight  # noqa: E402

from minfer.ops.cuda import gemv_q8_gluon as GL  # noqa: E402
from minfer.ops.cuda import gemv_repack_layout as L  # noqa: E402
from minfer.ops.cuda import plane_layout as PL  # noqa: E402
from minfer.switches import Switches  # noqa: E402


def _w(qt, n, k, seed):
    raw = random_weight(qt, n, k, np.random.default_rng(seed))
    return types.SimpleNamespace(repacked=L.repack(torch.from_numpy(raw), qt, n, k), name=f"w{seed}")


def test_apply_follows_the_table_and_the_switch(monkeypatch):
    monkeypatch.setattr(GL, "device_unsupported", lambda device: None)
    monkeypatch.setattr(GL, "CONFIGS", {"Q4_K 64x512": (16, 2, 2, 4, 1, 0, False, False, False, True),
                                        "Q6_K 64x512": (32, 2, 2, 4),
                                        "Q4_K 32x512": (16, 2, 2, 4, 1, 0, False, False, False, True)})
    down = _w(L.Q4_K, 64, 512, 1)                       # asks for tiles
    other = _w(L.Q6_K, 64, 512, 2)                      # a config without the field
    grouped = _w(L.Q4_K, 64, 512, 3)                    # its rows a view of a bigger fused plane set
    big = _w(L.Q4_K, 96, 512, 4).repacked
    grouped.repacked = big.rows(0, 64)
    orig = [p.clone() for p in down.repacked.planes]
    ws = [down, other, grouped]
    assert PL.apply(ws, Switches(), "cuda") == 1
    assert down.repacked.tile_rows == 16 and other.repacked.tile_rows == 0 and grouped.repacked.tile_rows == 0
    assert all(torch.equal(a, b) for a, b in zip(L.to_rows(down.repacked).planes, orig))
    assert PL.apply(ws, Switches(), "cuda") == 0        # already in place: nothing moves
    off = Switches().with_env({"MINFER_GEMV_TILES": "0"})
    assert PL.apply(ws, off, "cuda") == 1
    assert down.repacked.tile_rows == 0 and all(torch.equal(a, b) for a, b in zip(down.repacked.planes, orig))
    # another GPU (the table was measured on sm_90): row-major
    monkeypatch.setattr(GL, "device_unsupported", lambda device: "sm_80")
    assert PL.wanted(down.repacked, Switches(), "cuda") == 0


def test_a_fused_group_is_laid_out_as_one(monkeypatch):
    """A fused group (gate+up: one GEMV over the stacked planes, each weight a row view) takes its
    stacked shape's layout; each member's view is re-made on the new planes and reads its own rows
    (the same bits as before); the switch off gives the row-major planes back; a tile height that
    would cut a member's rows leaves the group alone."""
    monkeypatch.setattr(GL, "device_unsupported", lambda device: None)
    monkeypatch.setattr(GL, "CONFIGS", {"Q4_K 128x512": (32, 1, 1, 4, 1, 0, False, False, False, True, True),
                                        "Q4_K 96x512": (64, 1, 1, 4, 1, 0, False, False, False, True)})
    gate, up = _w(L.Q4_K, 64, 512, 5), _w(L.Q4_K, 64, 512, 6)
    orig = {id(m): [p.clone() for p in m.repacked.planes] for m in (gate, up)}
    assert L.fuse_group((gate, up))
    ws = [gate, up]
    assert PL.apply(ws, Switches(), "cuda") == 1
    cat = gate.repacked_group[1]
    assert gate.repacked_group[0] == (gate, up) and cat.tile_rows == 32 and cat.n == 128
    for m, r0 in ((gate, 0), (up, 64)):
        assert m.repacked.tile_rows == 32 and m.repacked.n == 64
        # a view of the group's planes (no copy), holding exactly its own rows' entries
        assert all(v.data_ptr() == p[r0:].data_ptr() for v, p in zip(m.repacked.planes, cat.planes))
        assert all(torch.equal(a, b) for a, b in zip(L.to_rows(m.repacked).planes, orig[id(m)]))
    assert PL.apply(ws, Switches(), "cuda") == 0        # already in place
    off = Switches().with_env({"MINFER_GEMV_TILES": "0"})
    assert PL.apply(ws, off, "cuda") == 1
    assert gate.repacked_group[1].tile_rows == 0
    for m in (gate, up):
        assert m.repacked.tile_rows == 0 and all(torch.equal(a, b) for a, b in zip(m.repacked.planes, orig[id(m)]))
    # 48 + 48 rows: 64-row tiles would cut the first member's rows -- the group stays row-major
    a, b = _w(L.Q4_K, 48, 512, 7), _w(L.Q4_K, 48, 512, 8)
    assert L.fuse_group((a, b))
    assert PL.apply([a, b], Switches(), "cuda") == 0
    assert a.repacked_group[1].tile_rows == 0 and a.repacked.tile_rows == 0


def test_a_mixed_pair_takes_one_layout(monkeypatch):
    """A mixed q/k + v pair (q and k of one type fused, v of another, one launch: fuse_group's
    repacked_segments) is laid out by the launch's shape (its first type, all its rows), both plane
    sets alike -- v's own shape's config does not pull it back -- and the q/k views are re-made;
    the switch off gives both row-major planes back."""
    monkeypatch.setattr(GL, "device_unsupported", lambda device: None)
    monkeypatch.setattr(GL, "CONFIGS", {"Q4_K 128x512": (16, 2, 1, 4, 1, 0, False, False, False, True),
                                        "Q6_K 32x512": (32, 2, 1, 4)})
    q, k, v = _w(L.Q4_K, 64, 512, 9), _w(L.Q4_K, 32, 512, 10), _w(L.Q6_K, 32, 512, 11)
    orig = {id(m): [p.clone() for p in m.repacked.planes] for m in (q, k, v)}
    assert L.fuse_group((q, k, v))
    ws = [q, k, v]
    assert q.repacked_segments[0] == (q, k, v)
    assert PL.apply(ws, Switches(), "cuda") == 1
    lead, last = q.repacked_segments[1]
    assert lead.tile_rows == 16 and last.tile_rows == 16 and lead.n == 96 and last is v.repacked
    assert L.common_tile_rows((lead, last)) == 16
    for m in (q, k, v):
        assert m.repacked.tile_rows == 16
        assert all(torch.equal(a, b) for a, b in zip(L.to_rows(m.repacked).planes, orig[id(m)]))
    assert PL.apply(ws, Switches(), "cuda") == 0        # v's own config (no tiles) does not undo it
    off = Switches().with_env({"MINFER_GEMV_TILES": "0"})
    assert PL.apply(ws, off, "cuda") == 1
    for m in (q, k, v):
        assert m.repacked.tile_rows == 0 and all(torch.equal(a, b) for a, b in zip(m.repacked.planes, orig[id(m)]))
    assert [r.tile_rows for r in q.repacked_segments[1]] == [0, 0]


def test_stacked_experts_stay_row_major(monkeypatch):
    """A stacked expert weight ((E*N, K), n_experts set by load_experts) keeps row-major planes even
    where the Gluon table's shape rule gives its stacked shape tiles: gemv_q8_experts reads them
    row-major (the GPU suite of 2026-12-06 failed Qwen3-30B-A3B's decode on exactly this). A plain
    weight of the same shape is tiled, so the rule does ask for tiles here."""
    monkeypatch.setattr(GL, "device_unsupported", lambda device: None)
    plain, exps = _w(L.Q4_K, 4096, 1024, 12), _w(L.Q4_K, 4096, 1024, 13)
    assert PL.wanted(plain.repacked, Switches(), "cuda") > 0          # the rule: a gate+up-like shape
    exps.n_experts = 4
    assert PL.apply([plain, exps], Switches(), "cuda") == 1
    assert plain.repacked.tile_rows > 0 and exps.repacked.tile_rows == 0
