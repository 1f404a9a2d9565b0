"""Prefetch 3 of the Gluon q8 GEMV (gemv_q8g_loads._stage_all: every step of a split staged in shared
memory before the PDL wait, the words by cp.async) on the GPU. The arithmetic is prefetch 1's, step
for step, so each staged config gives the same bits as its prefetch-1 twin; both are checked against
float64 math on the dequantized planes (kernel_data's gguf reference) and the q8 row. Shapes: the 7B's
q/k/v (all Q4_K and with a Q6_K v, warps along K), o, both downs (split K, tile-major planes), the
[gate; up] SwiGLU pair, and odd tails."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ops"))
from kernel_data import random_weight, reference_dequant, rel_err  # noqa: E402

pytestmark = pytest.mark.gpu


def _weight(qt, n, k, seed, tiles=0):
    from minfer.ops.cuda import gemv_repack as G
    from minfer.ops.cuda.gemv_repack_layout import to_tiles

    raw = random_weight(qt, n, k, np.random.default_rng(seed))
    rw = G.repack(torch.from_numpy(raw).cuda(), qt, n, k)
    if tiles:
        rw = to_tiles(rw, tiles)
    return rw, torch.from_numpy(reference_dequant(raw, qt, n, k)).double().cuda()


def _with(cfg, pf):
    return tuple(cfg[:4]) + (pf,) + tuple(cfg[5:])


@pytest.mark.parametrize("segs,k,cfg", [
    ([(12, 4608)], 3584, (8, 8, 1, 4, 3, 0, False, True)),           # q/k/v, warps along K
    ([(12, 4096), (14, 512)], 3584, (8, 8, 1, 4, 3, 0, False, True, True)),   # with a Q6_K v
    ([(12, 3584)], 3584, (16, 2, 1, 4, 3)),                            # o: seven steps staged
    ([(12, 3584)], 3584, (32, 2, 1, 4, 3)),
    ([(12, 3584)], 18944, (32, 2, 9, 4, 3, 72, False, False, False, True, True)),   # down, tiles, x ahead
    ([(14, 3584)], 18944, (32, 2, 5, 4, 3, 0, False, False, False, True)),
    ([(14, 1000)], 3584, (16, 4, 3, 4, 3)),                            # row mask, uneven splits
    ([(12, 517)], 768, (8, 2, 1, 2, 3)),
])
def test_staged_is_prefetch1_bit_for_bit(segs, k, cfg):
    from minfer.ops import paths
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda.gemv_repack import GemvWorkspace

    tiles = cfg[0] if len(cfg) > 9 and cfg[9] else 0
    ws_ = [_weight(qt, n, k, seed=n + qt, tiles=tiles) for qt, n in segs]
    rws = [a for a, _ in ws_]
    w = torch.cat([b for _, b in ws_])
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    q8 = Q.quantize(x)
    ref = Q.dequantize_q8(q8, k).double() @ w.T
    ws = GemvWorkspace("cuda")
    bias = torch.randn(w.shape[0], device="cuda")
    paths.reset()
    arg = rws if len(rws) > 1 else rws[0]
    got = Q.gemv_q8(q8, arg, bias=bias, out_dtype=torch.float32, config=cfg, ws=ws, gluon=True, pdl=1)
    twin = Q.gemv_q8(q8, arg, bias=bias, out_dtype=torch.float32, config=_with(cfg, 1), ws=ws, gluon=True, pdl=1)
    torch.cuda.synchronize()
    snap = paths.snapshot()
    assert snap["counts"].get("gemv_q8.gluon", 0) == 2 and not snap["fallbacks"], snap
    assert torch.equal(got, twin)
    assert rel_err(got, ref + bias.double()) < 1e-5


def test_staged_swiglu_pair_is_prefetch1_bit_for_bit():
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda.gemv_repack import GemvWorkspace

    f, k = 1024, 3584
    rw, w = _weight(12, 2 * f, k, seed=5)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    q8 = Q.quantize(x)
    ws = GemvWorkspace("cuda")
    outs = []
    for pf in (3, 1):
        h, hq8 = Q.gemv_q8_swiglu(q8, rw, f, out_dtype=torch.bfloat16, config=(32, 2, 1, 4, pf), ws=ws, gluon=True)
        outs.append((h.clone(), [t.clone() for t in hq8]))
    torch.cuda.synchronize()
    assert torch.equal(outs[0][0], outs[1][0])
    assert all(torch.equal(a, b) for a, b in zip(outs[0][1], outs[1][1]))
    y = Q.dequantize_q8(q8, k).double() @ w.T
    g, u = y[:, :f], y[:, f:]
    assert rel_err(outs[0][0], g / (1 + torch.exp(-g)) * u) < 2e-2
