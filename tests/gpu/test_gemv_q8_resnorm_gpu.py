"""The Triton q8 GEMV's residual norm tail on the GPU (Switches.gemv_q8_resnorm, perf-log AZ7): at Qwen2.5-0.5B's
down shape (896 x 4864, Q4_K and Q6_K), the int8 row and the GLU prologue, the sweep's config and a K split, PDL on
and off, launched again and again and replayed in a CUDA graph (the tickets reset themselves): out is the plain
launch's, s is resid + out bit for bit and h the add + norm kernel's of them (to its bf16 rounding); and a
synthetic 0.5B-geometry model decoding the same greedy tokens with the switch on as off, each layer's down
counted, no fallback."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ops"))
sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import rel_err  # noqa: E402
from switch_engines import captured, switch_engines, teacher_forced_greedy_same  # noqa: E402
from test_kernels_gpu import make_weight, poison  # noqa: E402


pytestmark = pytest.mark.gpu
DEV = "cuda"


@pytest.mark.parametrize("qt", [12, 14], ids=["Q4_K", "Q6_K"])
@pytest.mark.parametrize("cfg", [None, (32, 2, 4, 4, True)], ids=["table", "split4"])
@pytest.mark.parametrize("glu", [False, True], ids=["q8", "glu"])
@pytest.mark.parametrize("pdl", [0, 1])
def test_tail_launches_and_graph_replays(qt, cfg, glu, pdl):
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda.gemv_repack import GemvWorkspace, repack
    from minfer.ops.cuda.norm_rope_act import _add_rms_norm_launch

    n, k = 896, 4864
    w, _ = make_weight(qt, n, k, seed=n + qt, name="blk.0.ffn_down.weight")
    rw = repack(w.raw, qt, n, k)
    g = torch.Generator(device=DEV).manual_seed(qt)
    gate = (torch.randn(1, k, device=DEV, generator=g) * 2).to(torch.bfloat16)
    up = torch.randn(1, k, device=DEV, generator=g).to(torch.bfloat16)
    q8 = None if glu else Q.quantize(gate)
    kw = dict(glu=(gate, up)) if glu else {}
    resid = torch.randn(1, n, device=DEV, generator=g) * 4
    wn = torch.rand(n, device=DEV, generator=g) + 0.5
    ws = GemvWorkspace(DEV, 256)
    y = Q.gemv_q8(q8, rw, config=cfg, pdl=pdl, **kw)
    s2, h2 = torch.empty(1, n, device=DEV), torch.empty(1, n, device=DEV, dtype=torch.bfloat16)
    _add_rms_norm_launch(resid, y, wn, 1e-6, s2, h2)
    poison()

    def launch():
        s = torch.empty(1, n, device=DEV)
        h = torch.empty(1, n, device=DEV, dtype=torch.bfloat16)
        out = Q.gemv_q8(q8, rw, config=cfg, pdl=pdl, ws=ws, resnorm=(resid, wn, 1e-6, s, h), **kw)
        assert out.rn == (s, h)
        return out, s, h

    for _ in range(3):
        out, s, h = launch()
        torch.cuda.synchronize()
        assert int(ws.cnt.abs().sum()) == 0
        assert torch.equal(out, y) and torch.equal(s, resid + y.float())
        assert rel_err(h.cpu(), h2.double().cpu()) < 1e-2 and (h != h2).sum() <= n // 64
    graph, (_, sg, hg) = captured(launch)
    for _ in range(3):
        sg.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(sg, s) and torch.equal(hg, h) and int(ws.cnt.abs().sum()) == 0


def test_small_model_greedy_same_with_the_q8_tail(tmp_path):
    snap = teacher_forced_greedy_same(switch_engines(tmp_path, "qwen2.5-0.5b", "gemv_q8_resnorm", (False, True)))
    assert snap["counts"].get("gemv_q8.resnorm", 0) > 0, snap["counts"]
    assert not [key for key in snap["fallbacks"] if "resnorm" in key], snap["fallbacks"]
