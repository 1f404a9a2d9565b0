"""Programmatic dependent launch (minfer.ops.cuda.pdl) changes when kernels start, never what
they compute: with MINFER_PDL on, a decode chain and a whole graphed decode give bitwise the
same results as with it off (same kernels, same arithmetic), over many replays with changing
inputs -- a kernel that read its input before the previous one finished would differ."""

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


def _chain(pdl: bool, seed: int):
    """residual add + norm + q8 -> split-K GEMV (gate+up sized) -> SwiGLU + q8 -> split-K GEMV
    (down) -> add + norm, captured in one graph; returns (replay(x) -> outputs)."""
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda import gemv_repack as G
    from minfer.ops.cuda.gemv_repack import GemvWorkspace

    rng = np.random.default_rng(seed)
    d, f = 1024, 2048
    up = G.repack(torch.from_numpy(random_weight(12, 2 * f, d, rng)).cuda(), 12, 2 * f, d)
    down = G.repack(torch.from_numpy(random_weight(14, d, f, rng)).cuda(), 14, d, f)
    nw = torch.randn(d, generator=torch.Generator().manual_seed(seed)).cuda()   # the same in both chains
    x = torch.zeros(1, d, device="cuda")
    y = torch.zeros(1, d, device="cuda", dtype=torch.bfloat16)
    ws = GemvWorkspace("cuda")

    def step():
        s, h, q8 = Q.add_rms_norm_q8(x, y, nw, 1e-6, torch.bfloat16, pdl=pdl)
        gu = Q.gemv_q8(q8, up, out_dtype=torch.bfloat16, config=(32, 2, 4, 4, True), ws=ws, pdl=pdl)
        a, q8b = Q.swiglu_q8(gu[:, :f].contiguous(), gu[:, f:].contiguous(), pdl=pdl)
        o = Q.gemv_q8(q8b, down, out_dtype=torch.bfloat16, config=(32, 2, 8, 4, True), ws=ws, pdl=pdl)
        s2, h2, _ = Q.add_rms_norm_q8(s, o, nw, 1e-6, torch.bfloat16, pdl=pdl)
        return gu, o, s2, h2

    step()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = step()

    def run(xv, yv):
        x.copy_(xv)
        y.copy_(yv)
        g.replay()
        torch.cuda.synchronize()
        return [t.clone() for t in outs]
    # the graph reads the workspace's split-K counters and the weights by address: they must
    # outlive the chain (a freed counter buffer reused by the next allocation breaks the tickets)
    run.keep = (g, ws, up, down, nw, x, y)
    return run


def test_pdl_chain_bitwise_equal_to_stream_order():
    on, off = _chain(True, 5), _chain(False, 5)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for i in range(40):
        xv = torch.randn(1, 1024, device="cuda", generator=gen)
        yv = torch.randn(1, 1024, device="cuda", generator=gen).bfloat16()
        for a, b in zip(on(xv, yv), off(xv, yv)):
            assert torch.equal(a, b), i


def _bitwise_decodes(tmp_path, seed: int, switches_a, switches_b, n_prompt: int, prompt_seed: int) -> dict:
    """Two engines on one tiny synthetic model (FFN 1024: every K a multiple of 256, the q8
    chain), a prefill and 40 graphed greedy decode steps whose logits must be bitwise equal;
    paths.snapshot() of both engines' load, prefill and decode."""
    from minfer.bench.presets import get_preset
    from minfer.bench.synth import write_synth
    from minfer.ops import paths
    from minfer.runtime.engine import Engine

    p = dataclasses.replace(get_preset("tiny"), ffn=1024)
    path = tmp_path / "m.gguf"
    write_synth(path, p, "q4_k_m", seed=seed, progress=False)
    paths.reset()
    a = Engine.load(str(path), device="cuda", ctx=160, progress=False, switches=switches_a)
    b = Engine.load(str(path), device="cuda", ctx=160, progress=False, switches=switches_b)
    prompt = torch.randint(0, p.vocab, (n_prompt,), generator=torch.Generator().manual_seed(prompt_seed)).tolist()
    la, lb = a.prefill(prompt), b.prefill(prompt)
    assert torch.equal(la, lb)
    t = int(la.argmax())
    for step in range(40):
        pos = len(prompt) + step
        la, lb = a.forward([t], pos)[-1], b.forward([t], pos)[-1]
        assert torch.equal(la, lb), step
        t = int(la.argmax())
    return paths.snapshot()


@pytest.mark.parametrize("off", ["pdl", "gemv_swiglu"])
def test_graphed_decode_bitwise_equal_with_switch_off(tmp_path, off):
    """A whole model's graphed greedy decode with PDL and the gate+up GEMV's SwiGLU epilogue on,
    and with one of them off (the switch the case names): identical logits."""
    # a: the fast path on (PDL is by default; the SwiGLU epilogue is asked for), b: it off
    snap = _bitwise_decodes(tmp_path, 4, Switches(gemv_swiglu=True),
                            Switches(**{off: False}) if off == "pdl" else Switches(), 13, 3)
    counts = snap["counts"]
    assert counts.get("graph.decode.replay", 0) >= 80, counts      # both engines replayed their graphs
    for site in ("gemv_q8", "add_rms_norm", "rope_kv", "decode_attention", "rms_norm"):
        assert counts.get(f"pdl.{site}", 0) > 0, site
    env = {"pdl": "MINFER_PDL", "gemv_swiglu": "MINFER_GEMV_SWIGLU"}[off]
    assert any(env + "=0" in k for k in snap["switched_off"]), snap["switched_off"]       # engine b
    assert counts.get("qmatmul.group2.decode.q8swiglu", 0) > 0        # engine a fused it
    if off == "gemv_swiglu":     # the other made SwiGLU apart: its own launch, or (the default, Switches.
        # gemv_glu_prologue 1, where the down runs on the Triton q8 GEMV) in the down GEMV's programs
        assert counts.get("swiglu.q8", 0) + counts.get("qmatmul.Q4_K.decode.q8glu", 0) + counts.get(
            "qmatmul.Q6_K.decode.q8glu", 0) > 0, counts


@pytest.mark.parametrize("kvpre", [False, True])
def test_graphed_decode_bitwise_equal_with_rope_kv_early(tmp_path, kvpre):
    """Switches.pdl_early_sites=rope_kv lets the decode attention launch while the q/k/v GEMV
    runs (it then reads, before its wait, only the key count and -- with decode_attn_kvpre --
    its first tile of cached rows): a whole model's graphed greedy decode gives bitwise the
    logits of the same switches without the early signal, over 40 steps whose new row changes
    each step (a preloaded tile holding this step's row, or read before the rope + KV kernel
    wrote it, would differ)."""
    snap = _bitwise_decodes(tmp_path, 6, Switches(pdl_early_sites="rope_kv", decode_attn_kvpre=kvpre),
                            Switches(decode_attn_kvpre=kvpre), 70, 5)
    counts = snap["counts"]
    assert counts.get("graph.decode.replay", 0) >= 80, counts
    assert counts.get("pdl.rope_kv", 0) > 0 and counts.get("pdl.decode_attention", 0) > 0
