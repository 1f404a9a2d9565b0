"""xAI Grok-1 and Grok-2 (minfer/models/grok.py, GGUF arch `grok`) on the CPU's float32 reference, against two
references that minfer made neither of: a float64 torch forward of each HF checkpoint written from the architecture
(tools/gen_grok_fixture.py reference()) and llama.cpp's own logits (llama-cpp-python 0.3.36, an F32 copy of the file,
F32 KV cache). transformers 5.25 has no Grok class (remote code only). This file: the layout, each rule of the graph
needed (with one changed the logits miss both references by more than 10x the tolerance), the expert choices, the
keys llama.cpp does not read, the loader's refusals.

Fixtures (tools/gen_grok_fixture.py build + goldens), both hidden 32, 2 heads of 16 over 1 kv head, 2 layers, 4 GELU
experts top-2, vocab 320, converted by llama.cpp's convert_hf_to_gguf.py (GrokModel):
- grok:  Grok-1's names (transformer.decoder_layer.N...), experts of feed_forward_length 16, layer_output_norm, a
         tied lm head, no final soft-cap, a SentencePiece vocab.
- grok2: Grok-2's names (model.layers.N...), experts of expert_feed_forward_length 16 beside a dense GELU MLP of 32,
         post_ffw_norm, final soft-cap 5, YaRN (factor 4 over 64 positions), an untied head, a BPE vocab.
llama.cpp's GELU goes through a float16 table (ggml-cpu vec.h GGML_GELU_FP16): its logits sit 4.6e-4 (grok) and
2.0e-4 (grok2) from the exact reference (the reference with float16-rounded GELU inputs and outputs meets llama.cpp to
1.6e-6 / 8.3e-7), hence LC_ERR below.

The checks every llama.cpp-checked decoder shares run in tests/models/test_llamacpp_decoders.py (CASES), the CUDA
backend's code through Triton's interpreter in tests/ops/test_arch_forward_interpreted.py."""

from __future__ import annotations

import json
import math

import gguf
import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

NAMES = ("grok", "grok2")
BASE_ERR = 1e-5      # the float32 misses against the torch reference: 3.3e-6 (grok), 3.8e-7 (grok2)
LC_ERR = 1e-3        # against llama.cpp: 4.6e-4 (grok), 2.0e-4 (grok2): its float16 GELU table
U32, F32 = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32


def miss(eng, name: str, key: str = "logits") -> float:
    r = ref(name)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r[key])


def forward(m, ids) -> np.ndarray:
    from minfer.models import Step
    from minfer.runtime.kv_cache import KVCache

    return m.forward(torch.tensor(ids), Step.at(0, len(ids), "cpu"), KVCache.for_config(m.cfg, 64)).numpy()


def test_layout_read_from_the_file():
    from minfer.models.grok import GrokModel

    for name in NAMES:
        m = engine(name).model
        c = m.cfg
        assert type(m) is GrokModel and c.arch == "grok"
        assert (c.head_dim, c.n_heads, c.n_kv_heads, c.d_model, c.vocab, c.n_layers) == (16, 2, 1, 32, 320, 2)
        assert c.rope.style == "neox" and c.rope.n_rot == 16 and c.rope.theta == 1e4 and c.rope.freq_scale == 1.0
        assert (c.n_experts, c.n_experts_used) == (4, 2) and m.weights_norm is True
        e = m.moe[0]
        assert tuple(e.gate_inp.shape) == (4, 32) and tuple(e.gate_exps.shape) == (4 * 16, 32)
        assert tuple(e.down_exps.shape) == (4 * 32, 16)
        hf = json.loads((DATA / f"{name}.json").read_text())
        assert hf["experts_used_per_layer"] == [4, 4]     # routing not degenerate: every expert chosen somewhere
    g1, g2 = engine("grok").model, engine("grok2").model
    assert g1.cfg.ffn == 16 and g1.cfg.expert_ffn == 0                     # Grok-1: the experts are n_ff wide
    assert g2.cfg.ffn == 32 and g2.cfg.expert_ffn == 16
    assert g1.cfg.tied_output and g1.output is g1.token_embd and not g2.cfg.tied_output
    assert all(b.ffn_up is None for b in g1.blocks) and all(tuple(b.ffn_up.shape) == (32, 32) for b in g2.blocks)
    assert (g1.embed_scale, g1.attn_softcap, g1.final_softcap) == (0.5, 4.0, 0.0)
    assert (g2.embed_scale, g2.attn_softcap, g2.final_softcap) == (5.0, 3.0, 5.0)
    assert g1.rope.freq_factors is None and g2.rope.freq_factors is not None     # Grok-2's YaRN


def test_the_two_references_agree():
    for name in NAMES:
        r = ref(name)
        assert rel_err(r["lc_logits"], r["logits"]) < LC_ERR
        assert r["lc_greedy"].tolist() == r["greedy"].tolist()


@pytest.mark.parametrize("name", NAMES)
def test_logits_within_the_base_error(name):
    eng = engine(name)
    assert miss(eng, name) < BASE_ERR and miss(eng, name, "lc_logits") < LC_ERR


@pytest.mark.parametrize("name", NAMES)
def test_expert_choices_are_the_references(name, monkeypatch):
    from minfer.ops import reference

    r = ref(name)
    got, route = [], reference.route

    def record(*a, **kw):
        w, idx = route(*a, **kw)
        got.append(idx.sort(-1).values)
        return w, idx

    eng = engine(name)
    monkeypatch.setattr(reference, "route", record)
    eng.logits(r["ids"].tolist())
    assert len(got) == 2
    for g, want in zip(got, r["choices"]):
        assert torch.equal(g, torch.from_numpy(np.sort(want.astype(np.int64), -1)))
    assert all(len({tuple(row.tolist()) for row in g}) > 3 for g in got)     # the top-2 of 4 varies by token


def _moe_variant(monkeypatch, **change):
    from minfer import ops

    moe = ops.moe_ffn
    monkeypatch.setattr(ops, "moe_ffn", lambda *a, **kw: moe(*a, **(kw | change)))


COMMON = ["embedding_scale", "attn_output_scale", "attn_softcap", "attn_output_norm", "post_ffn_norm",
          "logit_scale", "silu_experts", "normal_rope"]
# Grok-1's MoE output goes straight into an RMSNorm (layer_output_norm), which cancels any per-token factor: the
# renormalization of the top-2 weights shows only where Grok-2's dense MLP is added first. For the same reason the
# sqrt(2)/2 on Grok-2's sum cannot show (it moves the logits by the norm's epsilon only) and is not tested here.
GROK2 = ["no_renorm", "final_softcap", "no_dense_mlp", "no_yarn", "no_yarn_mscale"]


@pytest.mark.parametrize("name, what", [(n, w) for n in NAMES for w in COMMON] + [("grok2", w) for w in GROK2])
def test_each_rule_is_needed(monkeypatch, name, what):
    """Each multiplier, soft-cap and post-norm; GELU (not SiLU) experts; NEOX rope; Grok-2's renormalized routed
    weights, final soft-cap, dense MLP, YaRN's frequencies and its cos/sin factor."""
    from dataclasses import replace

    eng = engine(name)
    m, c = eng.model, eng.model.cfg
    assert miss(eng, name) < BASE_ERR
    yarn_q = (1 + 0.1 * math.log(4.0)) ** 2 if name == "grok2" else 1.0
    if what == "embedding_scale":
        m.embed_scale = 1.0
    elif what == "attn_output_scale":          # the scores' factor: 1/sqrt(head_dim) instead of the file's
        m.q_scale = yarn_q
    elif what == "attn_softcap":
        m.attn_softcap = 0.0
    elif what == "attn_output_norm":
        m.attn_out_norm = [torch.ones_like(w) for w in m.attn_out_norm]
    elif what == "post_ffn_norm":
        m.post_ffn_norm = [torch.ones_like(w) for w in m.post_ffn_norm]
    elif what == "logit_scale":
        m.logit_scale = 1.0
    elif what == "no_renorm":
        m.weights_norm = False
    elif what == "silu_experts":
        _moe_variant(monkeypatch, act="silu")
    elif what == "normal_rope":
        m.rope = replace(m.rope, style="normal")
    elif what == "final_softcap":
        m.final_softcap = 0.0
    elif what == "no_dense_mlp":
        for b in m.blocks:
            b.ffn_up = None
    elif what == "no_yarn":
        m.rope, m.q_scale = c.rope, m.q_scale / yarn_q
    else:
        m.q_scale = m.q_scale / yarn_q
    assert miss(eng, name) > 10 * TOL and miss(eng, name, "lc_logits") > 10 * TOL, what


@pytest.mark.parametrize("key, value", [("grok.expert_weights_scale", 2.5), ("grok.attention.temperature_length", 4),
                                        ("grok.router_logit_softcapping", 0.5)])
def test_keys_llamacpp_does_not_read_change_nothing(tmp_path, key, value):
    """grok's loader reads no expert_weights_scale; router_logit_softcapping and attention.temperature_length are read
    but no graph applies them: a file's values leave the logits as both references have them."""
    r = ref("grok2")
    vtype = U32 if isinstance(value, int) else F32
    m = load(rewrite(DATA / "grok2.gguf", tmp_path / "k.gguf", set_keys={key: (value, vtype)}))
    got = forward(m, r["ids"].tolist())
    assert rel_err(got, r["logits"]) < BASE_ERR and rel_err(got, r["lc_logits"]) < LC_ERR


def test_missing_multipliers_take_llamacpp_defaults(tmp_path):
    """Old files: load_arch_hparams' defaults (embedding 78.38..., attention 1/sqrt(128), soft-cap 30, logits 1/sqrt(3),
    no final soft-cap)."""
    keys = ("grok.embedding_scale", "grok.attention.output_scale", "grok.attn_logit_softcapping", "grok.logit_scale",
            "grok.final_logit_softcapping")
    m = load(rewrite(DATA / "grok2.gguf", tmp_path / "d.gguf", drop_keys=keys))
    assert m.embed_scale == 78.38367176906169 and m.attn_softcap == 30.0 and m.final_softcap == 0.0
    assert m.logit_scale == 0.5773502691896257
    assert math.isclose(m.q_scale, 0.08838834764831845 * 4 * (1 + 0.1 * math.log(4.0)) ** 2)


@pytest.mark.parametrize("name, change, match", [
    ("grok", dict(drop_tensors=("blk.1.attn_output_norm.weight",)), r"blk\.1\.attn_output_norm\.weight"),
    ("grok", dict(drop_tensors=("blk.0.layer_output_norm.weight",)), r"blk\.0\.post_ffw_norm\.weight"),
    ("grok", dict(drop_tensors=("blk.0.ffn_gate_exps.weight",)), r"blk\.0\.ffn_gate_exps\.weight"),
    ("grok", dict(add_tensors={"blk.0.attn_q.bias": np.zeros(32)}), r"blk\.0\.attn_q\.bias"),
    ("grok", dict(add_tensors={"blk.0.attn_qkv.weight": np.zeros((64, 32))}), r"blk\.0\.attn_qkv\.weight"),
    ("grok", dict(add_tensors={"blk.0.attn_q_norm.weight": np.ones(16)}), r"blk\.0\.attn_q_norm\.weight"),
    ("grok", dict(add_tensors={"blk.0.ffn_up.weight": np.zeros((16, 32))}), r"blk\.0\.ffn_gate\.weight"),
    ("grok2", dict(drop_tensors=("blk.1.ffn_down.weight",)), r"blk\.1\.ffn_down\.weight"),
    ("grok", dict(set_keys={"grok.expert_count": (0, U32)}), r"grok\.expert_count"),
    ("grok", dict(set_keys={"grok.logit_scale": (0.0, F32)}), r"grok\.logit_scale"),
    ("grok", dict(set_keys={"grok.attn_logit_softcapping": (0.0, F32)}), r"grok\.attn_logit_softcapping"),
    ("grok", dict(set_keys={"grok.rope.dimension_count": (8, U32)}), r"grok\.rope\.dimension_count"),
    ("grok", dict(drop_keys=("grok.attention.layer_norm_rms_epsilon",)), r"grok\.attention\.layer_norm_rms_epsilon"),
    ("grok2", dict(set_keys={"grok.rope.scaling.yarn_ext_factor": (0.5, F32)}), r"grok\.rope\.scaling\.yarn_ext_fac"),
])
def test_refusals_name_the_tensor_or_key(tmp_path, name, change, match):
    p = rewrite(DATA / f"{name}.gguf", tmp_path / "bad.gguf", **change)
    with pytest.raises(MinferError, match=match):
        load(p)
