"""gpt-oss on the CPU reference: each rule of the architecture is needed to reach transformers'
logits (fixture tests/data/arch/gpt-oss.*, tools/gen_arch_fixtures.py), decode token by token
equals the whole forward, attention sinks against a hand-written softmax, and a CUDA load
refuses at once (the CUDA attention kernels have no sinks)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from tests.models.test_arch_vs_transformers import DATA, TOL, engine, ref, rel_err


@pytest.fixture(scope="module")
def eng():
    return engine("gpt-oss")


def err(eng) -> float:
    r = ref("gpt-oss")
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def test_layout_read_from_the_file(eng):
    """Layers 0 and 2 sliding (window 8 from gpt-oss.attention.sliding_window), 1 and 3 full
    (llama.cpp load_swa_pattern(ml, 2); HF layer_types in the fixture's config); one rope base."""
    import json

    m = eng.model
    hf = json.loads((DATA / "gpt-oss.json").read_text())["config"]
    assert m.is_local == tuple(t == "sliding_attention" for t in hf["layer_types"]) == (True, False, True, False)
    assert m.window == hf["sliding_window"] == 8
    assert [r.theta for r in m.layer_rope] == [150000.0] * 4 and m.cfg.rope.style == "neox"
    assert m.cfg.n_experts == 4 and m.cfg.n_experts_used == 2


@pytest.mark.parametrize("what", ["sinks", "window", "clamp", "router_bias", "gate_bias", "up_bias",
                                  "down_bias", "o_bias"])
def test_each_rule_is_needed(eng, monkeypatch, what):
    """With any one rule dropped the fixture misses transformers' logits by far."""
    import minfer.models.gpt_oss as go

    m = eng.model
    assert err(eng) < TOL
    if what == "sinks":        # a sink of -inf takes nothing from the denominator: plain softmax
        monkeypatch.setattr(m, "sinks", [torch.full_like(s, -float("inf")) for s in m.sinks])
    elif what == "window":
        monkeypatch.setattr(m, "window", 0)
    elif what == "clamp":
        real = go.swiglu_oai
        monkeypatch.setattr(go, "swiglu_oai", lambda g, u: real(g, u, limit=1e30))
    elif what == "o_bias":
        monkeypatch.setattr(m, "attn_output_bias", [torch.zeros_like(b) for b in m.attn_output_bias])
    else:
        for e in m.moe:
            monkeypatch.setattr(e, what, torch.zeros_like(getattr(e, what)))
    assert err(eng) > 10 * TOL


def test_decode_token_by_token_equals_whole(eng):
    """Every position decoded alone through the KV cache (the one-row attention, across the
    window of 8) gives the whole forward's logits, and transformers'."""
    r = ref("gpt-oss")
    ids = r["ids"].tolist()
    whole = eng.forward(ids, 0).numpy()
    steps = np.concatenate([eng.forward([t], p).numpy() for p, t in enumerate(ids)])
    assert np.abs(steps - whole).max() <= 1e-4 * np.abs(whole).max()
    assert rel_err(steps, r["logits"]) < TOL


def _attention_by_hand(q, k, v, start, window, sinks):
    """softmax over [scores, sink] per query head, the sink's column dropped, loops written out."""
    T, H, Dh = q.shape
    G = H // k.shape[1]
    out = torch.zeros(T, H, Dh, dtype=torch.float64)
    for t in range(T):
        p = start + t
        keys = [j for j in range(p + 1) if window <= 0 or p - j < window]
        for h in range(H):
            s = torch.stack([(q[t, h].double() @ k[j, h // G].double()) / Dh ** 0.5 for j in keys])
            z = torch.exp(s).sum() + torch.exp(sinks[h].double())
            out[t, h] = sum(torch.exp(s[n]) / z * v[j, h // G].double() for n, j in enumerate(keys))
    return out.float()


@pytest.mark.parametrize("T,start,window", [(6, 0, 0), (5, 7, 4), (1, 11, 0), (1, 11, 5)])
def test_reference_attention_sinks_by_hand(T, start, window):
    from minfer.ops import reference

    g = torch.Generator().manual_seed(T + start + window)
    H, Hkv, Dh, S = 4, 2, 8, 16
    q = torch.randn(T, H, Dh, generator=g)
    k, v = torch.randn(S, Hkv, Dh, generator=g), torch.randn(S, Hkv, Dh, generator=g)
    sinks = 2 * torch.randn(H, generator=g)
    got = reference.attention(q, k, v, start, window, sinks=sinks)
    want = _attention_by_hand(q, k, v, start, window, sinks)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    plain = reference.attention(q, k, v, start, window)
    assert (got - plain).abs().max() > 1e-2            # the sinks change the result


def test_cuda_load_refuses_at_once():
    """No CUDA attention kernel has sinks: a CUDA load stops before reading any weight, naming
    the architecture and what is missing (no GPU needed: nothing reaches the device)."""
    from minfer.config import ModelConfig
    from minfer.gguf_file import GGUFFile
    from minfer.models import model_class

    gf = GGUFFile(DATA / "gpt-oss.gguf")
    with pytest.raises(MinferError, match=r"gpt-oss.*CUDA.*sinks"):
        model_class("gpt-oss").from_gguf(gf, ModelConfig.from_gguf(gf), device="cuda", progress=False)


@pytest.mark.parametrize("tensor", ["blk.1.attn_sinks.weight", "blk.0.ffn_gate_inp.bias", "blk.2.ffn_down_exps.bias",
                                    "blk.3.post_attention_norm.weight", "blk.0.attn_output.bias"])
def test_missing_tensor_is_named(tmp_path, tensor):
    from tests.models.test_arch_vs_transformers import load, rewrite

    p = rewrite(DATA / "gpt-oss.gguf", tmp_path / "x.gguf", drop_tensors=(tensor,))
    with pytest.raises(MinferError, match=tensor.replace(".", r"\.")):
        load(p)


def test_missing_window_key_is_named(tmp_path):
    from tests.models.test_arch_vs_transformers import load, rewrite

    p = rewrite(DATA / "gpt-oss.gguf", tmp_path / "x.gguf", drop_keys=("gpt-oss.attention.sliding_window",))
    with pytest.raises(MinferError, match=r"gpt-oss\.attention\.sliding_window"):
        load(p)


def test_a_cache_without_sinks_is_refused(eng):
    """A cache whose attend() takes no sinks (as the batch engine's paged cache) stops with a
    MinferError naming the architecture, never attends without them."""
    from minfer.models.base import Step

    class NoSinks:
        def write(self, layer, k, v, step):
            pass

        def attend(self, layer, q, step, ctx=None, window=0, softcap=0.0):
            return q

    with pytest.raises(MinferError, match=r"gpt-oss.*sinks.*NoSinks"):
        eng.model.forward(torch.tensor([5, 6]), Step.at(0, 2, "cpu"), NoSinks())
