"""Fetching later weights into L2 (minfer.ops.cuda.l2_prefetch) changes when bytes arrive, never
what a kernel computes: a q8 GEMV launch that prefetches gives bitwise the output of one that
does not, and a whole graphed greedy decode with the prefetch on (every small GEMV, and the large
ones' big_next) gives bitwise the logits of one with it off, with the prefetching launches counted."""

from __future__ import annotations

import dataclasses
import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ops"))
from kernel_data import random_weight  # noqa: E402

from minfer.switches import Switches  # noqa: E402

pytestmark = pytest.mark.gpu


def test_gemv_with_prefetch_regions_bitwise_equal():
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda import gemv_repack as G

    rng = np.random.default_rng(3)
    d = 1024
    ws = [G.repack(torch.from_numpy(random_weight(qt, n, d, rng)).cuda(), qt, n, d)
          for qt, n in ((12, 1536), (12, 1024), (12, 8192), (14, 1024))]
    x = torch.randn(1, d, device="cuda")
    _, _, q8 = Q.add_rms_norm_q8(x, torch.zeros_like(x), torch.ones(d, device="cuda"), 1e-6, torch.bfloat16)
    plain = G.GemvWorkspace("cuda")
    pf = G.GemvWorkspace("cuda")
    l2 = (4 << 20, 2 << 20, True)
    for rep in range(3):               # rep 0 learns the order; reps 1-2 prefetch
        for i, w in enumerate(ws):
            a = Q.gemv_q8(q8, w, ws=plain, config=(32, 2, 2, 4, True))
            b = Q.gemv_q8(q8, w, ws=pf, config=(32, 2, 2, 4, True), l2=l2)
            assert torch.equal(a, b), (rep, i)
    assert pf.l2.cycle is not None and len(pf.l2.cycle) == 4
    assert plain.l2.cycle is None                     # no l2 asked: nothing learned
    assert pf.l2.regions(0, *l2)                      # the small first launch prefetches


def test_graphed_decode_bitwise_equal_with_l2_prefetch(tmp_path):
    from minfer.bench.presets import get_preset
    from minfer.bench.synth import write_synth
    from minfer.ops import paths
    from minfer.runtime.engine import Engine

    p = dataclasses.replace(get_preset("tiny"), ffn=1024)      # every K a multiple of 256: the q8 chain
    path = tmp_path / "m.gguf"
    write_synth(path, p, "q4_k_m", seed=6, progress=False)
    # the tiny model's weights are all small: a threshold between its o and gate+up planes
    on = Switches(l2_prefetch_mb=1, l2_small_mb=1, l2_big_next=True)
    a = Engine.load(str(path), device="cuda", ctx=160, progress=False, switches=on)
    b = Engine.load(str(path), device="cuda", ctx=160, progress=False)
    prompt = torch.randint(0, p.vocab, (11,), generator=torch.Generator().manual_seed(2)).tolist()
    la, lb = a.prefill(prompt), b.prefill(prompt)
    assert torch.equal(la, lb)
    t = int(la.argmax())
    paths.reset()
    for step in range(30):
        pos = len(prompt) + step
        la, lb = a.forward([t], pos)[-1], b.forward([t], pos)[-1]
        assert torch.equal(la, lb), step
        t = int(la.argmax())
    counts = paths.snapshot()["counts"]
    assert counts.get("graph.decode.replay", 0) >= 60, counts
    # counted at capture: engine a's graph holds prefetching launches (engine b asked for none)
    assert counts.get("gemv_q8.l2_prefetch", 0) > 0, counts
