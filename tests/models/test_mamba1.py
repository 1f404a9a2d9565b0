"""mamba (Mamba-1: state-spaces mamba-*-hf; Falcon-Mamba, the same arch with ssm.dt_b_c_rms): the chunked scan
against the plain recurrence, the batch engine's row step against the sequence's, each rule of the mixer shown
needed on its fixture, the cache's state, and bad inputs refused by name (models/mamba1.py's module doc has the
rules and their sources; transformers' logits / greedy / pieces: test_arch_vs_transformers.py)."""

from __future__ import annotations

import gguf
import pytest
import torch

from minfer.errors import MinferError
from minfer.models import mamba1 as m1
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite


def logits_err(eng, name: str) -> float:
    r = ref(name)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def _inputs(T, di=12, N=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, di, generator=g)
    dt = torch.nn.functional.softplus(torch.randn(T, di, generator=g))
    B, C = torch.randn(T, N, generator=g), torch.randn(T, N, generator=g)
    A = -torch.exp(torch.randn(di, N, generator=g))
    return x, dt, B, C, A


@pytest.mark.parametrize("p0,T,chunk", [(0, 37, 16), (5, 20, 16), (3, 1, 16), (0, 9, 4)])
def test_scan_chunked_matches_sequential(p0, T, chunk):
    """The chunked scan (across chunk boundaries, from a carried state at p0 > 0) equals the recurrence, y and
    the state it stores."""
    x, dt, B, C, A = _inputs(T)
    s0 = torch.randn(12, 5)
    pos = torch.arange(p0, p0 + T)
    rings = [torch.zeros(2, 12, 5) for _ in range(2)]
    for r in rings:
        r[(p0 - 1) % 2] = s0
    y1 = m1.scan_sequential(x, dt, B, C, A, rings[0], pos)
    y2 = m1.scan_chunked(x, dt, B, C, A, rings[1], pos, chunk=chunk)
    torch.testing.assert_close(y2, y1, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rings[1][(p0 + T - 1) % 2], rings[0][(p0 + T - 1) % 2], rtol=1e-5, atol=1e-5)
    if p0 == 0:       # position 0 reads no state (masked)
        ref_ring = torch.zeros(2, 12, 5)
        torch.testing.assert_close(m1.scan_sequential(x, dt, B, C, A, ref_ring, pos), y1)


def test_batch_rows_match_sequence():
    """conv_rows / scan_rows (the batch engine's decode rows, gathered by slot) equal conv_seq / scan_chunked of
    each sequence one token at a time."""
    K, di, N = 4, 12, 5
    g = torch.Generator().manual_seed(1)
    w = m1.Mamba1Weights(None, torch.randn(K, di, generator=g), torch.randn(di, generator=g), None, None, None,
                         None, None, None)
    steps = 6
    xs, dts, Bs, Cs, A = _inputs(2 * steps, di, N, seed=2)
    conv, ssm = torch.zeros(3, K, di), torch.zeros(3, 2, di, N)          # slot 0: padding
    single = [(torch.zeros(K, di), torch.zeros(2, di, N)) for _ in range(2)]
    slots = torch.tensor([2, 1])
    for t in range(steps):
        pos = torch.tensor([t, t])
        rows = slice(2 * t, 2 * t + 2)
        xc = m1.conv_rows(xs[rows], w, conv, slots, pos)
        y = m1.scan_rows(xc, dts[rows], Bs[rows], Cs[rows], A, ssm, slots, pos)
        for b in range(2):
            i = 2 * t + b
            xr = m1.conv_seq(xs[i:i + 1], w, single[b][0], pos[:1])
            yr = m1.scan_chunked(xr, dts[i:i + 1], Bs[i:i + 1], Cs[i:i + 1], A, single[b][1], pos[:1])
            torch.testing.assert_close(xc[b:b + 1], xr)
            torch.testing.assert_close(y[b:b + 1], yr, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,what", [
    ("mamba", "no_conv_bias"), ("mamba", "no_D"), ("mamba", "no_dt_bias"), ("mamba", "A_per_state_only"),
    ("mamba", "dt_b_c_rms"), ("mamba", "tied_head"), ("mamba", "no_gate"),
    ("falcon-mamba", "no_dt_b_c_rms"), ("falcon-mamba", "no_D")])
def test_each_rule_is_needed(monkeypatch, name, what):
    """The conv bias, the D skip, dt_proj's bias, A per channel (not one row for every channel), the dt/B/C norms
    exactly when ssm.dt_b_c_rms says so, the gate, the untied head: with any one changed the logits miss
    transformers' by far."""
    eng = engine(name)
    m = eng.model
    assert logits_err(eng, name) < TOL and m.dims.dt_b_c_rms == (name == "falcon-mamba")
    for mb in m.mamba:
        if what == "no_conv_bias":
            monkeypatch.setattr(mb, "conv_b", torch.zeros_like(mb.conv_b))
        elif what == "no_D":
            monkeypatch.setattr(mb, "D", torch.zeros_like(mb.D))
        elif what == "no_dt_bias":
            monkeypatch.setattr(mb, "dt_b", torch.zeros_like(mb.dt_b))
        elif what == "A_per_state_only":
            monkeypatch.setattr(mb, "A", mb.A.mean(0, keepdim=True).expand_as(mb.A).contiguous())
    if what in ("dt_b_c_rms", "no_dt_b_c_rms"):
        monkeypatch.setattr(m, "dims", m1.Mamba1Dims(**{**m.dims.__dict__, "dt_b_c_rms": what == "dt_b_c_rms"}))
    elif what == "tied_head":
        monkeypatch.setattr(m, "output", m.token_embd)
    elif what == "no_gate":
        real = m1.F.silu
        calls = []

        def silu(t):          # the second SiLU of each mixer call is the gate's
            calls.append(1)
            return torch.ones_like(t) if len(calls) % 2 == 0 else real(t)
        monkeypatch.setattr(m1.F, "silu", silu)
    assert logits_err(eng, name) > 10 * TOL


def test_cache_holds_state_only():
    """No K/V rows, each layer's conv ring (K, di) and SSM ring (2, di, N); head_count / feed_forward_length 0
    read as no heads; the batch engine sizes its pool (blocks of no bytes, the state in slots)."""
    from minfer.runtime.batch_engine import BatchEngine
    from minfer.runtime.kv_cache import kv_bytes_per_position, state_bytes

    eng = engine("mamba")
    c = eng.model.cfg
    assert (c.n_heads, c.n_kv_heads, c.ffn) == (0, 0, 0) and eng.model.recurrent
    assert c.kv_layers == (None,) * 3 and c.state_layers == (((4, 128), (2, 128, 16)),) * 3
    assert kv_bytes_per_position(c, 4) == 0 and state_bytes(c) == 3 * 4 * (4 * 128 + 2 * 128 * 16)
    be = BatchEngine.from_engine(eng, max_seqs=2)
    assert be.cache.states is not None and be.blocks.prefix_cache is False


U32 = gguf.GGUFValueType.UINT32


@pytest.mark.parametrize("kw,match", [
    (dict(drop_tensors=("blk.1.ssm_conv1d.bias",)), "blk.1.ssm_conv1d.bias"),
    (dict(drop_tensors=("blk.2.ssm_dt.bias",)), "blk.2.ssm_dt.bias"),
    (dict(drop_tensors=("blk.0.ssm_x.weight",)), "blk.0.ssm_x.weight"),
    (dict(drop_tensors=("blk.0.ssm_a",), add_tensors={"blk.0.ssm_a": [[0.5] * 16] * 128}), "blk.0.ssm_a"),
    (dict(drop_keys=("mamba.ssm.time_step_rank",)), "mamba.ssm.time_step_rank"),
    (dict(set_keys={"mamba.ssm.time_step_rank": (8, U32)}), "blk.0.ssm_x.weight"),
    (dict(set_keys={"mamba.ssm.inner_size": (192, U32)}), "mamba.ssm.inner_size"),
    (dict(set_keys={"mamba.ssm.dt_b_c_rms": (1, U32)}), "mamba.ssm.dt_b_c_rms"),
    (dict(set_keys={"mamba.attention.head_count": (4, U32)}), "mamba.attention.head_count"),
])
def test_bad_input_is_named(tmp_path, kw, match):
    p = rewrite(DATA / "mamba.gguf", tmp_path / "x.gguf", **kw)
    with pytest.raises(MinferError, match=match.replace(".", r"\.")):
        load(p)
