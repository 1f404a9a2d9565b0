"""The Gluon q8 GEMV's stream-K build (gemv_q8_gluon_sk._gemv_q8g_sk_kernel: a config's SPLIT < 0)
on the GPU: against the float64 product of the gguf package's dequantized weight and the x_hat
the q8 row stands for (kernel_data, test_gemv_q8_gpu.check_q8), with a residual and a bias, row
tails and odd K tails, from one program to one per step; the same bits run to run (the partials
are added in K order); graph replays with PDL (the tile tickets reset themselves)."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ops"))
sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import rel_err  # noqa: E402
from test_gemv_q8_gpu import _weight, check_q8  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("qt,n,k,bn,bb,programs", [
    (14, 3584, 18944, 32, 2, 528), (12, 3584, 18944, 32, 2, 660), (14, 3584, 18944, 16, 2, 1056),
    (12, 517, 768, 32, 2, 7), (14, 517, 2560, 16, 4, 1), (12, 96, 2560, 32, 1, 30), (14, 200, 1792, 8, 2, 13),
])
def test_stream_k_against_the_reference(qt, n, k, bn, bb, programs):
    from minfer.ops import paths
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda.gemv_repack import GemvWorkspace

    rw, w = _weight(qt, n, k, seed=n + qt + programs)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    q8 = Q.quantize(x)
    resid = torch.randn(1, n, device="cuda")
    bias = torch.randn(n, device="cuda")
    ref = check_q8(q8, x.float()) @ w.T
    ws = GemvWorkspace("cuda")
    cfg = (bn, bb, -programs, 4)
    paths.reset()
    out = Q.gemv_q8(q8, rw, out_dtype=torch.float32, config=cfg, ws=ws, gluon=True)
    assert rel_err(out, ref) < 1e-5
    out2 = Q.gemv_q8(q8, rw, resid=resid, bias=bias, out_dtype=torch.float32, config=cfg, ws=ws, gluon=True)
    assert rel_err(out2, ref + resid.double() + bias.double()) < 1e-5
    again = Q.gemv_q8(q8, rw, resid=resid, bias=bias, out_dtype=torch.float32, config=cfg, ws=ws, gluon=True)
    assert torch.equal(again, out2)                               # K order: the same bits every run
    snap = paths.snapshot()
    assert snap["counts"].get("gemv_q8.gluon.stream_k") == 3 and snap["counts"].get("gemv_q8.gluon") == 3, snap
    assert not snap["fallbacks"], snap


def test_stream_k_every_step_its_own_program():
    """programs = steps: each program one step of one tile, every tile summed from 37 slots."""
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda.gemv_repack import GemvWorkspace

    n, k = 64, 18944
    rw, w = _weight(14, n, k, seed=5)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    q8 = Q.quantize(x)
    out = Q.gemv_q8(q8, rw, out_dtype=torch.float32, config=(32, 2, -(2 * 37), 4), ws=GemvWorkspace("cuda"),
                    gluon=True)
    assert rel_err(out, check_q8(q8, x.float()) @ w.T) < 1e-5


def test_stream_k_refusals():
    from minfer.errors import MinferError
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda.gemv_repack import GemvWorkspace

    rw, _ = _weight(12, 64, 512, seed=1)
    q8 = Q.quantize(torch.randn(1, 512, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(MinferError, match="stream-K: 9 programs for 4 steps"):
        Q.gemv_q8(q8, rw, out_dtype=torch.float32, config=(32, 1, -9, 4), ws=GemvWorkspace("cuda"), gluon=True)
    with pytest.raises(MinferError, match="only the Gluon kernel"):
        Q.gemv_q8(q8, rw, out_dtype=torch.float32, config=(32, 1, -4, 4), ws=GemvWorkspace("cuda"), gluon=False)


def test_stream_k_graph_replays_pdl():
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda.gemv_repack import GemvWorkspace

    n, k = 3584, 18944
    rw, w = _weight(14, n, k, seed=9)
    ws = GemvWorkspace("cuda")
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    resid = torch.randn(1, n, device="cuda")
    qs = []

    def step():
        q8 = Q.quantize(x)
        qs.append(q8)
        return Q.gemv_q8(q8, rw, resid=resid, out_dtype=torch.float32, config=(32, 2, -528, 4), ws=ws, gluon=True,
                         pdl=1)

    step()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = step()
    for i in range(3):
        x.normal_()
        g.replay()
        torch.cuda.synchronize()
        assert rel_err(out, check_q8(qs[-1], x.float()) @ w.T + resid.double()) < 1e-5, i
