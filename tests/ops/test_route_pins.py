"""tests/gpu/route_pins.py (the GPU bf16 tests pin every MoE layer's expert choices to the float32
run's) checked on the CPU, so CI covers the mechanism the GPU comparison rests on: a pinned call
selects exactly the pinned experts, even against the router's own top-k, over softmax / sigmoid /
selection-bias / grouped routing, with the weights still the run's own probabilities at those
experts; the recorded float32 choices replayed into a bf16 forward of a MoE fixture are taken."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "gpu"))
from route_pins import RoutePins  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "arch"


@pytest.mark.parametrize("gating,select_bias,groups", [("softmax", False, 1), ("sigmoid", True, 1),
                                                        ("sigmoid", True, 4)])
def test_pinned_call_takes_the_pins_and_keeps_its_weights(gating, select_bias, groups):
    from minfer.ops import reference

    g = torch.Generator().manual_seed(0)
    T, D, E, k = 6, 16, 8, 2
    h, router = torch.randn(T, D, generator=g), torch.randn(E, D, generator=g)
    sb = torch.randn(E, generator=g) * 0.1 if select_bias else None
    kw = dict(gating=gating, select_bias=sb, n_group=groups, topk_group=2 if groups > 1 else 1)
    _, natural = reference.route(h, router, k, True, **kw)
    # pins: the two experts each row ranks lowest (never the natural choice), within one group of 2
    pins = torch.tensor([[6, 7]] * T) if groups > 1 else (-(h @ router.t())).topk(k, -1).indices
    assert not torch.equal(pins.sort(-1).values, natural.sort(-1).values)
    rp = RoutePins()
    with rp.pinning(1, T, k, "cpu"):
        rp.load([pins])
        w, idx = reference.route(h, router, k, True, **kw)
    assert torch.equal(idx.sort(-1).values, pins.sort(-1).values)
    logits = h @ router.t()
    probs = torch.softmax(logits, -1) if gating == "softmax" else torch.sigmoid(logits)
    want = probs.gather(1, idx)
    assert torch.allclose(w, want / want.sum(-1, keepdim=True).clamp(min=6.103515625e-5), atol=1e-6)
    assert reference.route.__name__ == "route" and rp.pinned_calls == 1


def test_float32_choices_replayed_into_a_bf16_forward():
    from minfer.gguf_file import GGUFFile
    from minfer.models import Step, load_model
    from minfer.runtime.kv_cache import KVCache

    gf = GGUFFile(DATA / "qwen3next.gguf")
    ids = torch.tensor(np.load(DATA / "qwen3next.npz")["ids"][:30].tolist())
    rp = RoutePins()
    m = load_model(gf, device="cpu", progress=False)
    with rp.recording():
        m.forward(ids, Step.at(0, 30, "cpu"), KVCache.for_config(m.cfg, 64))
    f32 = rp.take(len(rp.recorded))
    assert len(f32) == 4                       # one call per MoE layer
    mb = load_model(gf, device="cpu", progress=False, act_dtype=torch.bfloat16)
    seen = RoutePins()
    with rp.pinning(4, 30, 2, "cpu"), seen.recording():
        rp.load(f32)
        mb.forward(ids, Step.at(0, 30, "cpu"), KVCache.for_config(mb.cfg, 64, dtype=torch.bfloat16, context=64))
    assert rp.pinned_calls == 4
    assert all(torch.equal(a.sort(-1).values, b.sort(-1).values) for a, b in zip(seen.recorded, f32))
