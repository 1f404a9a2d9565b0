"""The int8 tensor-core batched-decode GEMM on the GPU (minfer.ops.cuda.qgemm_q8): the PTX paths
(4 bytes per op nibble split, Q6_K's prmt crumb spread, the int8 wgmma, the bf16x3 min term)
that Triton's interpreter cannot run (tests/ops/test_qgemm_q8.py runs the byte-by-byte forms).

References: gguf's dequant of random raw blocks (independent of every minfer decode) times the
q8 rows' x_hat, in float64 (small shapes); at the 7B's shapes the planes' exact decode
(gemv_repack.dequantize_into, bit-exact against gguf in test_gemv_repack_gpu) times x_hat.
Also: every sweep candidate config agrees, the split-K tickets reset (CUDA-graph replays).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "..", "ops"))
from kernel_data import random_weight, reference_dequant, rel_err  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = "cuda"
NAMES = {12: "Q4_K", 14: "Q6_K"}


def _mods():
    from minfer.ops.cuda import gemv_q8, gemv_repack, qgemm_q8
    return qgemm_q8, gemv_q8, gemv_repack


def _rows(m, k, seed):
    _, Q8, _ = _mods()
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = (torch.randn(m, k, device=DEV, generator=g) * 2).to(torch.bfloat16)
    q8 = Q8.quantize_rows(x)
    return q8, Q8.dequantize_q8(q8, m * k).view(m, k).double()


@pytest.mark.parametrize("qt", [12, 14], ids=NAMES.get)
def test_against_gguf_sweep_candidates(qt):
    """Per M bucket the sweep's first two candidates (the first also split, biased, and with the
    bytes built one by one: asm 0); ~12 kernel builds per type."""
    from minfer.bench.qgemm_q8_sweep import CANDIDATES

    Q, _, G = _mods()
    n, k = 200, 1024
    raw = random_weight(qt, n, k, np.random.default_rng(qt))
    rw = G.repack(torch.from_numpy(raw).to(DEV), qt, n, k)
    w = torch.from_numpy(reference_dequant(raw, qt, n, k)).double().to(DEV)
    bias = torch.randn(n, device=DEV)
    for m in (9, 33, 128, 200):
        q8, xh = _rows(m, k, seed=m)
        ref = xh @ w.T
        (bn, bm, cb, warps, stages), second = CANDIDATES[Q.m_bucket(m)][:2]
        runs = [((bn, bm, cb, 1, warps, stages), None), ((bn, bm, cb, 3, warps, stages), bias),
                ((bn, bm, cb, 1, warps, stages, 0), None), ((second[0], second[1], second[2], 1) + second[3:], None)]
        for cfg, b in runs:
            out = Q.qgemm_q8(q8, rw, bias=b, out_dtype=torch.float32, config=cfg)
            assert rel_err(out, ref + (0 if b is None else b.double())) < 1e-5, (m, cfg)


@pytest.mark.parametrize("qt,n,k", [(12, 4608, 3584), (12, 3584, 18944), (14, 3584, 18944), (14, 512, 3584)],
                         ids=lambda v: str(v))
def test_7b_shapes_default_config(qt, n, k):
    from minfer.bench.gemv_sweep import random_raw

    Q, _, G = _mods()
    gen = torch.Generator(device=DEV).manual_seed(n + qt)
    rw = G.repack(random_raw(qt, n, k, gen, DEV), qt, n, k)
    dense = torch.empty((n, k), dtype=torch.float32, device=DEV)
    G.dequantize_into(rw, dense)
    for m in (16, 32, 64, 128, 256):
        q8, xh = _rows(m, k, seed=m)
        out = Q.qgemm_q8(q8, rw, out_dtype=torch.float32)
        assert rel_err(out, xh @ dense.double().T) < 1e-5, m


def test_split_tickets_survive_graph_replays():
    Q, _, G = _mods()
    n, k = 256, 3584
    raw = random_weight(12, n, k, np.random.default_rng(3))
    rw = G.repack(torch.from_numpy(raw).to(DEV), 12, n, k)
    ws = G.GemvWorkspace(DEV)
    q8, _ = _rows(32, k, seed=2)
    cfg = (64, 32, 4, 7, 4, 3)
    first = Q.qgemm_q8(q8, rw, out_dtype=torch.float32, config=cfg, ws=ws)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = Q.qgemm_q8(q8, rw, out_dtype=torch.float32, config=cfg, ws=ws)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, first)                                   # split order: deterministic
    assert int(ws.cnt.abs().sum()) == 0
