"""The Gluon q8 GEMV with its weight words through a shared-memory ring (a config's prefetch field 3 or 4:
gemv_q8g_stages.py) on the GPU. The ring changes where the words wait, not the arithmetic: every output
must equal the register-prefetch launch (prefetch 1) bit for bit, and that one is checked against the
gguf package's dequant (kernel_data) in float64. Shapes: the 7B's downs (the splits the engine launches,
3-5 steps, and splits shorter than the ring), q/k/v with a Q6_K v (two weights, warps along K, the rope
launch's sibling), gate+up's SwiGLU epilogue, odd K tails, both plane layouts; then a whole graphed decode
with every GEMV on ring configs against one with every GEMV on the register prefetch."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ops"))
sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import random_weight, reference_dequant, rel_err  # noqa: E402

pytestmark = pytest.mark.gpu


def _weight(qt, n, k, seed):
    from minfer.ops.cuda import gemv_repack as G

    raw = random_weight(qt, n, k, np.random.default_rng(seed))
    return G.repack(torch.from_numpy(raw).cuda(), qt, n, k), torch.from_numpy(reference_dequant(raw, qt, n, k)).double()


def _with_pf(cfg, pf):
    c = list(cfg) + [1] * (5 - len(cfg))
    c[4] = pf
    return tuple(c)


# (qtype, N, K, config with the prefetch field left to the test): the 7B downs as shipped (split 9 -> 8 splits
# of 5 steps; 5 splits of 8 steps), a split of 2 steps (shorter than either ring), an odd tail (3 blocks in
# 2-block steps), 1-block steps, 8-row tiles
CASES = [(12, 3584, 18944, (32, 2, 9, 4, 1, 72)), (14, 3584, 18944, (32, 2, 5, 4)), (12, 3584, 18944, (32, 2, 19, 4)),
         (12, 517, 768, (32, 2, 1, 4)), (14, 256, 1536, (16, 1, 2, 2)), (12, 1000, 3584, (8, 4, 2, 4))]


@pytest.mark.parametrize("qt,n,k,cfg", CASES)
@pytest.mark.parametrize("tiles", [False, True])
def test_ring_equals_register_prefetch(qt, n, k, cfg, tiles):
    from minfer.ops import paths
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda import gemv_repack_layout as L

    rw, dense = _weight(qt, n, k, seed=n + k + qt)
    if tiles:
        if n % cfg[0]:
            pytest.skip("tile-major planes need N a multiple of the tile rows")   # (not a ring case: a layout rule)
        rw = L.to_tiles(rw, cfg[0])
    g = torch.Generator(device="cuda").manual_seed(4)
    x = torch.randn(1, k, device="cuda", generator=g, dtype=torch.bfloat16)
    resid = torch.randn(1, n, device="cuda", generator=g)
    q8 = Q.quantize(x)
    a = Q.gemv_q8(q8, rw, resid=resid, out_dtype=torch.float32, config=_with_pf(cfg, 1), gluon=True, pdl=1)
    ref = Q.dequantize_q8(q8, k).double().cpu() @ dense.T + resid.double().cpu()
    assert rel_err(a.double().cpu(), ref) < 1e-5
    for pf in (3, 4):
        paths.reset()
        b = Q.gemv_q8(q8, rw, resid=resid, out_dtype=torch.float32, config=_with_pf(cfg, pf), gluon=True, pdl=1)
        snap = paths.snapshot()
        assert snap["counts"].get("gemv_q8.gluon") == 1 and not snap["fallbacks"], snap
        assert torch.equal(a, b), f"prefetch {pf}: {int((a != b).sum())} of {n} values differ"


def test_ring_two_weights_warps_along_k():
    """q+k (Q4_K) and v (Q6_K) of the 7B in one launch with the bias, warps along K, the v's tiles first."""
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda.gemv_repack import GemvWorkspace

    ra, wa = _weight(12, 4096, 3584, seed=11)
    rb, wb = _weight(14, 512, 3584, seed=12)
    x = torch.randn(1, 3584, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(4608, device="cuda")
    q8 = Q.quantize(x)
    ref = Q.dequantize_q8(q8, 3584).double().cpu() @ torch.cat([wa, wb]).T + bias.double().cpu()
    for cfg in ((8, 8, 1, 4, 1, 0, 0, 1, 1), (8, 16, 1, 8, 1, 0, 0, 1), (32, 2, 4, 4, 1, 0, 0, 0, 1)):
        a = Q.gemv_q8(q8, (ra, rb), bias=bias, out_dtype=torch.float32, ws=GemvWorkspace("cuda"), gluon=True,
                      config=cfg)
        assert rel_err(a.double().cpu(), ref) < 1e-5, cfg
        for pf in (3, 4):
            b = Q.gemv_q8(q8, (ra, rb), bias=bias, out_dtype=torch.float32, ws=GemvWorkspace("cuda"), gluon=True,
                          config=_with_pf(cfg, pf))
            assert torch.equal(a, b), (cfg, pf, int((a != b).sum()))


@pytest.mark.parametrize("qt,f,k,cfg", [(12, 18944, 3584, (32, 1, 1, 4)), (14, 512, 768, (32, 1, 1, 4)),
                                        (12, 512, 768, (64, 2, 1, 4))])
def test_ring_swiglu_epilogue(qt, f, k, cfg):
    """The [gate; up] launch with the SwiGLU pair epilogue (gate+up's kernel): h and its q8 form equal."""
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda.gemv_repack import GemvWorkspace

    rw, _ = _weight(qt, 2 * f, k, seed=f + qt)
    ws = GemvWorkspace("cuda")
    q8 = Q.quantize(torch.randn(1, k, device="cuda", dtype=torch.bfloat16))
    h, (hq, hf) = Q.gemv_q8_swiglu(q8, rw, out_dtype=torch.bfloat16, config=_with_pf(cfg, 1), ws=ws, gluon=True)
    for pf in (3, 4):
        h2, (hq2, hf2) = Q.gemv_q8_swiglu(q8, rw, out_dtype=torch.bfloat16, config=_with_pf(cfg, pf), ws=ws,
                                          gluon=True)
        assert torch.equal(h, h2) and torch.equal(hq, hq2) and torch.equal(hf, hf2), pf


def test_graphed_decode_on_ring_configs(tmp_path, monkeypatch):
    """Every q8 GEMV of a tiny model's graphed decode on a 3-stage ring (engine a) against the register
    prefetch (engine b), both with the default norm mode (the residual / sums / q8 epilogues): the same
    arithmetic, so the logits are equal step by step, not only close."""
    from graphed_pair import compare_decodes

    from minfer.switches import Switches

    def config(qtype, n, k, table=""):
        return (32, 2, 1, 4, 3 if table == "ring" else 1)     # (no K split: q/k/v's rope epilogue takes it)

    errs = []
    snap = compare_decodes(tmp_path, monkeypatch, Switches(gemv_q8g_table="ring"), Switches(gemv_q8g_table="regs"),
                           seed=8, prompt_seed=5, n_prompt=9, config=config, errs=errs, same_prefill=True)
    assert max(errs) == 0.0, errs
    assert snap["counts"].get("gemv_q8.gluon", 0) > 0 and not snap["fallbacks"], snap
