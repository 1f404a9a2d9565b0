"""The raw q/k/v GEMV's rope epilogue on the GPU (Switches.gemv_raw_rope, perf-log AZ9): at Qwen2.5-0.5B's q/k/v
(896 + 128 + 128 rows over 896, heads of 64, Q5_0; Q8_0 too) and a head of 128, neox and normal pairs, PDL on and
off, bytes and halfword reads: q, the caches' k and v rows are the bits of the GEMV then the rope_kv kernel, other
cache rows untouched; captured in a CUDA graph and replayed at new positions (the position read on the device);
and a synthetic 0.5B-geometry model decoding the same greedy tokens with the switch on as off, each layer's q/k/v
counted, no rope_kv launch."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from gguf import GGMLQuantizationType as T

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ops"))
sys.path.insert(0, os.path.dirname(__file__))
from switch_engines import captured, switch_engines, teacher_forced_greedy_same  # noqa: E402
from test_kernels_gpu import make_weight, poison  # noqa: E402

from minfer.config import RopeConfig  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = "cuda"


@pytest.mark.parametrize("qt", [T.Q5_0, T.Q8_0])
@pytest.mark.parametrize("style,hd", [("neox", 64), ("normal", 64), ("neox", 128)])
@pytest.mark.parametrize("hw", [False, True])
@pytest.mark.parametrize("pdl", [0, 1])
def test_rope_epilogue_launches_and_graph_replays(qt, style, hd, hw, pdl):
    from minfer.ops.cuda import gemv
    from minfer.ops.cuda.norm_rope_act import _turns, rope_kv_write

    nq, nk, k = 14 * hd, 2 * hd, 896
    n = nq + 2 * nk
    w, _ = make_weight(int(qt), n, k, seed=n + int(qt))
    cfg = RopeConfig(theta=1e6, style=style, n_rot=hd)
    x = torch.randn(1, k, device=DEV, dtype=torch.bfloat16)
    bias = torch.randn(n, device=DEV)
    pos = torch.tensor([5], device=DEV)
    kc, vc = (torch.zeros(300, 2, hd, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    rope = (pos, _turns(cfg, DEV), kc, vc, nq, nk, hd, style == "neox")

    def fused():
        return gemv.gemv(x, w.raw, int(qt), n, k, bias=bias, one_pass=True, pdl=pdl, halfwords=hw, rope=rope)[:, :nq]

    def reference():
        y = gemv.gemv(x, w.raw, int(qt), n, k, bias=bias, one_pass=True, halfwords=hw)
        kc2, vc2 = torch.zeros_like(kc), torch.zeros_like(vc)
        q = rope_kv_write(y[:, :nq].view(1, nq // hd, hd), y[:, nq:nq + nk].view(1, 2, hd),
                          y[:, nq + nk:].view(1, 2, hd), pos, cfg, kc2, vc2).reshape(1, nq)
        return q, kc2, vc2

    poison()
    # seeded activations, eight of them: a rounding that differs between the two paths shows in some values only
    # (norm_rope_act.rope_rotate; perf-log CC2)
    for seed, p in enumerate((5, 6, 299, 0, 131, 77, 250, 18)):
        x.copy_(torch.randn(1, k, device=DEV, generator=torch.Generator(DEV).manual_seed(seed)).to(x.dtype))
        pos.fill_(p)
        kc.zero_()
        vc.zero_()
        q = fused()
        q2, kc2, vc2 = reference()
        torch.cuda.synchronize()
        assert torch.equal(q, q2) and torch.equal(kc, kc2) and torch.equal(vc, vc2), p
    g, qg = captured(fused)
    for p in (17, 200):
        pos.fill_(p)
        kc.zero_()
        vc.zero_()
        g.replay()
        q2, kc2, vc2 = reference()
        torch.cuda.synchronize()
        assert torch.equal(qg, q2) and torch.equal(kc, kc2) and torch.equal(vc, vc2), p


def test_small_model_greedy_same_with_the_rope_epilogue(tmp_path):
    snap = teacher_forced_greedy_same(switch_engines(tmp_path, "qwen2.5-0.5b", "gemv_raw_rope", (False, True)))
    counts = snap["counts"]
    assert counts.get("gemv.raw_rope", 0) > 0, counts
    assert not [key for key in snap["fallbacks"] if "rope" in key], snap["fallbacks"]
