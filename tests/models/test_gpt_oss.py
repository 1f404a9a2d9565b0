"""gpt-oss on the CPU reference: each rule of the architecture is needed to reach transformers'
logits (fixture tests/data/arch/gpt-oss.*, tools/gen_arch_fixtures.py), decode token by token
equals the whole forward, attention sinks against a hand-written softmax, and a CUDA load is no
longer refused at the architecture (the MoE's CUDA path: tests/ops/test_gpt_oss_interpreted.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, ref, rel_err


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
        monkeypatch.setattr(go, "SWIGLU_LIMIT", 1e30)       # read by GptOssModel.ffn at each call
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


def test_cuda_load_is_no_longer_refused(monkeypatch):
    """The MoE has a CUDA path now (ops.moe_ffn's gpt-oss options; the fixture's forward through
    the CUDA backend's code: tests/ops/test_gpt_oss_interpreted.py), so a CUDA load passes the
    architecture and reaches the weights: here, with no GPU, the first weight copy to the device
    is what stops it (a CUDA machine loads it)."""
    import minfer.models.gpt_oss as go
    from minfer.config import ModelConfig
    from minfer.gguf_file import GGUFFile
    from minfer.models import model_class

    reached = []

    def stop(gf, name, *a, **kw):
        reached.append(name)
        raise RuntimeError("stop here")

    monkeypatch.setattr(go, "load_qweight", stop)
    gf = GGUFFile(DATA / "gpt-oss.gguf")
    with pytest.raises(RuntimeError, match="stop here"):
        model_class("gpt-oss").from_gguf(gf, ModelConfig.from_gguf(gf), device="cuda", progress=False)
    assert reached == ["token_embd.weight"]


@pytest.mark.parametrize("tensor", ["blk.1.attn_sinks.weight", "blk.0.ffn_gate_inp.bias", "blk.2.ffn_down_exps.bias",
                                    "blk.3.post_attention_norm.weight", "blk.0.attn_output.bias"])
def test_missing_tensor_is_named(tmp_path, tensor):
    from models.test_arch_vs_transformers import load, rewrite

    p = rewrite(DATA / "gpt-oss.gguf", tmp_path / "x.gguf", drop_tensors=(tensor,))
    with pytest.raises(MinferError, match=tensor.replace(".", r"\.")):
        load(p)


def test_missing_window_key_is_named(tmp_path):
    from models.test_arch_vs_transformers import load, rewrite

    p = rewrite(DATA / "gpt-oss.gguf", tmp_path / "x.gguf", drop_keys=("gpt-oss.attention.sliding_window",))
    with pytest.raises(MinferError, match=r"gpt-oss\.attention\.sliding_window"):
        load(p)


def test_yarn_matches_transformers():
    """The released files' YaRN (factor 32, original context 4096, beta 32/1) against transformers:
    the whole sequence, the cache in pieces, and the mscale (1 + 0.1 ln 32)^2 on the scores."""
    import math

    r = ref("gpt-oss-yarn")
    eng = engine("gpt-oss-yarn")
    assert eng.model.q_scale == pytest.approx((1 + 0.1 * math.log(32)) ** 2)
    ids = r["ids"].tolist()
    assert rel_err(eng.logits(ids).numpy(), r["logits"]) < TOL
    cuts = [0, 7, 19, len(ids)]
    pieces = np.concatenate([eng.forward(ids[a:b], a).numpy() for a, b in zip(cuts, cuts[1:])])
    assert rel_err(pieces, r["logits"]) < TOL


@pytest.mark.parametrize("what", ["no_mscale", "truncate", "no_ramp"])
def test_yarn_each_part_is_needed(monkeypatch, what):
    """Without the mscale, with llama.cpp's rounded correction dims (HF gpt-oss: truncate=False),
    or without the per-frequency ramp, the yarn fixture misses transformers' logits."""
    from dataclasses import replace

    from minfer.gguf_file import GGUFFile
    from minfer.models.gpt_oss import yarn_rope

    r = ref("gpt-oss-yarn")
    eng = engine("gpt-oss-yarn")
    m = eng.model
    if what == "no_mscale":
        monkeypatch.setattr(m, "q_scale", 1.0)
    else:
        plain = replace(m.layer_rope[0], freq_factors=None)
        rope = plain if what == "no_ramp" else yarn_rope(GGUFFile(DATA / "gpt-oss-yarn.gguf"), "gpt-oss", plain,
                                                          truncate=True)[0]
        monkeypatch.setattr(m, "layer_rope", [rope] * len(m.layer_rope))
    assert rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"]) > 10 * TOL


def test_router_softmax_over_the_top_k_only(eng, monkeypatch):
    """qwen-style weights (softmax over all experts, then the top-k's probabilities, not
    renormalised) instead of the softmax over the chosen logits miss transformers' by far."""
    import torch.nn.functional as F

    import minfer.models.gpt_oss as go
    from minfer.ops.reference import _expert

    m = eng.model

    def qwen_style(h, e, ctx=None):
        p = torch.softmax(h.float() @ e.router.t() + e.router_bias, dim=-1)
        w, idx = torch.topk(p, m.cfg.n_experts_used, dim=-1)
        out, Fe, D = torch.zeros(h.shape), e.gate_bias.shape[1], h.shape[1]
        for j in idx.unique().tolist():
            tok, slot = (idx == j).nonzero(as_tuple=True)
            g = F.linear(h[tok], _expert(e.gate_exps, j, Fe).float(), e.gate_bias[j])
            u = F.linear(h[tok], _expert(e.up_exps, j, Fe).float(), e.up_bias[j])
            y = F.linear(go.swiglu_oai(g, u), _expert(e.down_exps, j, D).float(), e.down_bias[j])
            out.index_add_(0, tok, y * w[tok, slot, None])
        return out

    monkeypatch.setattr(m, "ffn", qwen_style)
    assert err(eng) > 10 * TOL
