"""jamba (AI21 Jamba: Mamba-1 and rope-less attention layers, MoE or dense SwiGLU after each): the layer plan
read from the file, each rule shown needed on the fixture, the cache's per-layer geometry, the prefix rule, and
bad inputs refused by name (models/jamba.py's module doc has the rules and their sources; transformers' logits /
greedy / pieces / batch engine: test_arch_vs_transformers.py; batched = single: test_paged_recurrent.py)."""

from __future__ import annotations

import gguf
import pytest
import torch

from minfer.errors import MinferError
from minfer.models import mamba1 as m1
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

NAME = "jamba"


def logits_err(eng) -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def test_layer_plan_and_cache_geometry():
    """Mamba where head_count_kv is 0 (layers 0, 2, 3), attention elsewhere; MoE where ffn_gate_inp is (1, 3);
    K/V rows on the attention layers only, the Mamba layers' conv ring (K, di) and SSM ring (2, di, N)."""
    eng = engine(NAME)
    m, c = eng.model, eng.model.cfg
    assert m.is_ssm == (True, False, True, True, False)
    assert [e is not None for e in m.moe] == [False, True, False, True, False]
    assert m.recurrent and m.paged_kv and m.weights_norm is False
    assert c.kv_layers == (None, (2, 16, 16), None, None, (2, 16, 16))
    st = ((4, 128), (2, 128, 16))
    assert c.state_layers == (st, None, st, st, None)
    assert all(mb.dt_norm is not None for mb in m.mamba if mb is not None)


@pytest.mark.parametrize("what", ["no_dt_norm_weight", "no_bc_norm_weight", "no_dt_b_c_norm", "renormalized_topk",
                                  "rope", "no_D", "no_conv_bias", "moe_as_dense_zero", "tied_head"])
def test_each_rule_is_needed(monkeypatch, what):
    """The dt and B/C norms' weights (weightless norms, Falcon-Mamba's, are wrong here), the norms at all, the
    top-2 weights left unnormalized, no rope on the attention layers, D, the conv bias, the MoE layers' experts,
    the untied head: with any one changed the logits miss transformers' by far."""
    eng = engine(NAME)
    m = eng.model
    assert logits_err(eng) < TOL
    for mb in m.mamba:
        if mb is None:
            continue
        if what == "no_dt_norm_weight":
            monkeypatch.setattr(mb, "dt_norm", torch.ones_like(mb.dt_norm))
        elif what == "no_bc_norm_weight":
            monkeypatch.setattr(mb, "b_norm", torch.ones_like(mb.b_norm))
            monkeypatch.setattr(mb, "c_norm", torch.ones_like(mb.c_norm))
        elif what == "no_dt_b_c_norm":
            monkeypatch.setattr(mb, "dt_norm", None)
        elif what == "no_D":
            monkeypatch.setattr(mb, "D", torch.zeros_like(mb.D))
        elif what == "no_conv_bias":
            monkeypatch.setattr(mb, "conv_b", torch.zeros_like(mb.conv_b))
    if what == "renormalized_topk":
        monkeypatch.setattr(m, "weights_norm", True)
    elif what == "rope":
        from minfer.models import granite

        real = type(m)._attention

        def with_rope(self, h, blk, i, cache, step, ctx):
            if self.is_ssm[i]:
                return real(self, h, blk, i, cache, step, ctx)
            return granite.GraniteScales._attention(self, h, blk, i, cache, step, ctx)
        monkeypatch.setattr(type(m), "_attention", with_rope)
    elif what == "moe_as_dense_zero":
        e = m.moe[1]
        monkeypatch.setattr(e, "gate_inp", torch.zeros_like(e.gate_inp))    # uniform routing over the experts
    elif what == "tied_head":
        monkeypatch.setattr(m, "output", m.token_embd)
    assert logits_err(eng) > 10 * TOL


def test_prefix_rule_recomputes_from_zero():
    """A shorter cached prefix cannot be rewound into: the engine recomputes and still matches transformers."""
    r = ref(NAME)
    eng = engine(NAME)
    ids = r["ids"].tolist()
    eng.logits(ids[:20])
    got = eng.logits(ids).numpy()
    assert rel_err(got, r["logits"]) < TOL


def test_dt_b_c_norm_weights_match_manual_rms():
    """The mixer's weighted norms are rms(t) * w (mamba1.py's branch for jamba), not the weightless form."""
    t = torch.randn(3, 16)
    w = torch.rand(16) + 0.5
    torch.testing.assert_close(m1._rms(t, 1e-6) * w, t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * w)


U32 = gguf.GGUFValueType.UINT32
F32 = gguf.GGUFValueType.FLOAT32
ARR = gguf.GGUFValueType.ARRAY


@pytest.mark.parametrize("kw,match", [
    (dict(drop_tensors=("blk.0.ssm_dt_norm.weight",)), "blk.0.ssm_dt_norm.weight"),
    (dict(drop_tensors=("blk.2.ssm_b_norm.weight",)), "blk.2.ssm_b_norm.weight"),
    (dict(drop_tensors=("blk.3.ssm_conv1d.bias",)), "blk.3.ssm_conv1d.bias"),
    (dict(drop_tensors=("blk.0.ffn_gate.weight",)), "blk.0.ffn_gate.weight"),
    (dict(drop_tensors=("blk.1.ffn_up_exps.weight",)), "blk.1.ffn_up_exps.weight"),
    (dict(drop_tensors=("blk.0.ssm_a",), add_tensors={"blk.0.ssm_a": [[0.5] * 16] * 128}), "blk.0.ssm_a"),
    (dict(add_tensors={"blk.1.attn_q.bias": [0.0] * 64}), "blk.1.attn_q.bias"),
    (dict(drop_keys=("jamba.expert_used_count",)), "jamba.expert_used_count"),
    (dict(set_keys={"jamba.expert_weights_scale": (2.5, F32)}), "jamba.expert_weights_scale"),
    (dict(drop_keys=("jamba.ssm.state_size",)), "jamba.ssm.state_size"),
    (dict(set_keys={"jamba.ssm.inner_size": (192, U32)}), "jamba.ssm.inner_size"),
    (dict(set_keys={"jamba.attention.head_count_kv": ([0, 2, 0, 0, 4], ARR)}), "jamba.attention.head_count_kv"),
    (dict(set_keys={"jamba.attention.head_count_kv": ([0] * 5, ARR)}), "jamba.attention.head_count_kv"),
])
def test_bad_input_is_named(tmp_path, kw, match):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", **kw)
    with pytest.raises(MinferError, match=match.replace(".", r"\.")):
        load(p)
