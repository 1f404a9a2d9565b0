"""The raw one-pass GEMV's residual norm epilogue on the GPU (Switches.gemv_raw_resnorm, perf-log AY4): at
Qwen2.5-0.5B's o shape (896 x 896, Q5_0; Q8_0 too) and SmolLM2's (576), bytes and halfword reads, PDL on and
off, launched again and again and replayed in a CUDA graph (the ticket resets itself): s is resid + the
GEMV's own output bit for bit and h the add + norm kernel's of them (to its bf16 rounding); and a synthetic
0.5B-geometry model decoding the same greedy tokens with the switch on as off, each layer's o counted."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from gguf import GGMLQuantizationType as T

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ops"))
sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import rel_err  # noqa: E402
from switch_engines import switch_engines, teacher_forced_greedy_same  # noqa: E402
from test_kernels_gpu import make_weight, poison  # noqa: E402


pytestmark = pytest.mark.gpu
DEV = "cuda"


@pytest.mark.parametrize("qt", [T.Q5_0, T.Q8_0])
@pytest.mark.parametrize("n,k", [(896, 896), (576, 576), (333, 1024)])
@pytest.mark.parametrize("hw", [False, True])
@pytest.mark.parametrize("pdl", [0, 1])
def test_resnorm_launches_and_graph_replays(qt, n, k, hw, pdl):
    from minfer.ops.cuda import gemv
    from minfer.ops.cuda.norm_rope_act import _add_rms_norm_launch

    w, _ = make_weight(int(qt), n, k, seed=n + k)
    a = torch.randn(1, k, device=DEV, dtype=torch.bfloat16)
    resid = torch.randn(1, n, device=DEV) * 4
    wn = torch.rand(n, device=DEV) + 0.5
    cnt = torch.zeros(4, dtype=torch.int32, device=DEV)
    y = gemv.gemv(a, w.raw, int(qt), n, k, one_pass=True, pdl=pdl, halfwords=hw)
    s2, h2 = torch.empty(1, n, device=DEV), torch.empty(1, n, device=DEV, dtype=torch.bfloat16)
    _add_rms_norm_launch(resid, y, wn, 1e-6, s2, h2)
    poison()
    for _ in range(3):
        s, h = gemv.gemv_resnorm(a, w.raw, int(qt), n, k, resid, wn, 1e-6, torch.bfloat16, cnt, pdl=pdl, halfwords=hw)
        torch.cuda.synchronize()
        assert int(cnt.abs().sum()) == 0
        assert torch.equal(s, resid + y.float())
        assert rel_err(h.cpu(), h2.double().cpu()) < 1e-2 and (h != h2).sum() <= n // 64
    g = torch.cuda.CUDAGraph()
    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        gemv.gemv_resnorm(a, w.raw, int(qt), n, k, resid, wn, 1e-6, torch.bfloat16, cnt, pdl=pdl, halfwords=hw)
    torch.cuda.current_stream().wait_stream(st)
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        sg, hg = gemv.gemv_resnorm(a, w.raw, int(qt), n, k, resid, wn, 1e-6, torch.bfloat16, cnt, pdl=pdl,
                                   halfwords=hw)
    for _ in range(3):
        sg.zero_()
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(sg, s) and torch.equal(hg, h) and int(cnt.abs().sum()) == 0


def test_small_model_greedy_same_with_resnorm(tmp_path):
    snap = teacher_forced_greedy_same(switch_engines(tmp_path, "qwen2.5-0.5b", "gemv_raw_resnorm", (False, True)))
    assert snap["counts"].get("gemv.raw_resnorm", 0) > 0 and snap["counts"]["gemv.raw_resnorm"] % 2 == 0, snap["counts"]
    assert not [key for key in snap["fallbacks"] if "raw" in key], snap["fallbacks"]
