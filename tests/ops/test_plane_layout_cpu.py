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
