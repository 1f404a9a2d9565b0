"""The down projection waiting on the SwiGLU GEMV's block flags instead of the PDL wait (Switches.flag_down,
ops/cuda/gemv_q8g_flags.py) on the GPU: three layers of the 7B geometry (Q4_K downs in layers 0-1, a Q6_K down in
layer 2: the 8- and 5-split downs) decode with the switch on and off to the same logits, bit for bit, at every
graphed step (only when the down's programs may start changes), the flag launches counted with no fallback, and
the flags all zero after the steps (each split's last reader reset them)."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ops"))
sys.path.insert(0, os.path.dirname(__file__))
from switch_engines import switch_engines  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("layers", [3])
def test_7b_layers_decode_the_same_bits_with_flag_down(tmp_path, layers):
    from minfer.ops import paths

    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    # the flags come from the SwiGLU epilogue's tile pairs (Switches.gemv_swiglu 1; the default 0 runs a SwiGLU
    # kernel after the GEMV, whose down waits on that launch): both engines run the epilogue
    switch_engines(tmp_path, "qwen2.5-7b", "flag_down", (False,), layers=layers)[False].close()   # (the file)
    path = str(tmp_path / "qwen2.5-7b.gguf")
    engines = {v: Engine.load(path, device="cuda", ctx=256, progress=False,
                              switches=Switches(gemv_swiglu=1, flag_down=v)) for v in (False, True)}
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    paths.reset()
    t = {v: int(e.prefill(prompt).argmax()) for v, e in engines.items()}
    assert t[False] == t[True]
    tok = t[False]
    for step in range(24):
        la, lb = (engines[v].forward([tok], len(prompt) + step)[-1] for v in (True, False))
        assert torch.equal(la, lb), (step, (la.float() - lb.float()).abs().max().item())
        tok = int(lb.argmax())
    snap = paths.snapshot()
    assert snap["counts"].get("gemv_q8.flag_down", 0) >= layers, snap["counts"]
    assert snap["counts"].get("qmatmul.group2.decode.q8swiglu", 0) >= layers, snap["counts"]
    assert not [k for k in snap["fallbacks"] if "gemv_q8" in k or "residual" in k], snap["fallbacks"]
    torch.cuda.synchronize()
    ws = engines[True].ctx.workspace.gemv_counters()
    assert ws.flags is not None and int(ws.flags.abs().sum()) == 0, ws.flags.tolist()
    assert getattr(engines[False].ctx.workspace.gemv_counters(), "flags", None) is None
    for e in engines.values():
        e.close()


def test_unconsumed_flags_are_zeroed_before_the_next_swiglu():
    """A SwiGLU launch with flags whose h no flag down reads: the next such launch zeroes them first (counted), so
    a stale count never lets a down program through early; the h values equal the flagless launch's."""
    import numpy as np

    from kernel_data import random_weight
    from minfer.ops import paths
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda import gemv_q8g_flags as FG
    from minfer.ops.cuda import gemv_repack as G

    f, k, qt = 2048, 1024, 12
    raw = random_weight(qt, 2 * f, k, np.random.default_rng(3))
    rw = G.repack(torch.from_numpy(raw).cuda(), qt, 2 * f, k)
    q8 = Q.quantize(torch.randn(1, k, device="cuda", dtype=torch.bfloat16))
    ws = G.GemvWorkspace("cuda")
    cfg = (32, 1, 1, 4)
    paths.reset()
    h0, _ = Q.gemv_q8_swiglu(q8, rw, config=cfg, ws=ws, gluon=True)
    h1, hq1 = Q.gemv_q8_swiglu(q8, rw, config=cfg, ws=ws, gluon=True, flags=True)
    torch.cuda.synchronize()
    assert torch.equal(h0, h1) and hq1.flags is ws.flags
    cn = FG.counts(ws.flags)
    assert cn[: f // 256].tolist() == [8] * (f // 256) and int(cn[f // 256:].abs().sum()) == 0
    assert not paths.snapshot()["fallbacks"]
    h2, _ = Q.gemv_q8_swiglu(q8, rw, config=cfg, ws=ws, gluon=True, flags=True)
    torch.cuda.synchronize()
    assert torch.equal(h0, h2) and FG.counts(ws.flags)[: f // 256].tolist() == [8] * (f // 256)
    fb = paths.snapshot()["fallbacks"]
    assert [r for r in fb if r.startswith("gemv_q8.flag_down") and "not consumed" in r], fb
