"""The Gluon q8 GEMV's split tiles summing their partials in one load round (Switches.split_gather,
gemv_q8g_loads._split_gather, perf-log BA3) on the GPU: three layers of the 7B geometry (Q4_K downs in layers 0-1,
a Q6_K down in layer 2: the Gluon table's 8- and 5-split downs with the residual and q8 epilogues) decode with the
switch on and off to the same logits, bit for bit, at every graphed step (the additions are the loop's, in split
order), with the Gluon kernel counted and no fallback."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from switch_engines import switch_engines  # noqa: E402

pytestmark = pytest.mark.gpu


def test_7b_layers_decode_the_same_bits_with_split_gather(tmp_path):
    from minfer.ops import paths

    engines = switch_engines(tmp_path, "qwen2.5-7b", "split_gather", (False, True), layers=3)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    t = {v: int(e.prefill(prompt).argmax()) for v, e in engines.items()}
    assert t[False] == t[True]
    tok = t[False]
    paths.reset()
    for step in range(12):
        la, lb = (engines[v].forward([tok], len(prompt) + step)[-1] for v in (True, False))
        assert torch.equal(la, lb), (step, (la.float() - lb.float()).abs().max().item())
        tok = int(lb.argmax())
    snap = paths.snapshot()
    assert snap["counts"].get("gemv_q8.gluon", 0) > 0 and snap["counts"].get("gemv_q8.residual_q8", 0) > 0, snap
    assert not [k for k in snap["fallbacks"] if "gemv_q8" in k or "residual" in k], snap["fallbacks"]
    for e in engines.values():
        e.close()
