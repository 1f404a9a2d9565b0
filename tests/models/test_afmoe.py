"""Arcee Trinity (minfer/models/afmoe.py) on the CPU's float32 reference: the layer pattern read from the file,
the MoE against a float64 formula of llama.cpp's build_moe_ffn rule, each rule needed (with one changed the
logits miss transformers' by more than 10x the tolerance), absent optional keys taking llama.cpp's values, what
the model needs refused by name. The logits, greedy continuation, KV cache in pieces and paged cache are
test_arch_vs_transformers' (name "afmoe"). Fixture: tests/data/arch/afmoe.gguf (tools/gen_arch_fixtures.py:
transformers' AfmoeForCausalLM converted by llama.cpp's convert_hf_to_gguf.py)."""

from __future__ import annotations

from dataclasses import replace

import gguf
import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.arch_checks import assert_refused, break_rule, logits_miss, max_rel, rewritten_engine, sigmoid_moe_case
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

NAME = "afmoe"


def miss(eng) -> float:
    return logits_miss(NAME, eng)


def test_layout_read_from_the_file():
    m = engine(NAME).model
    c = m.cfg
    assert (c.head_dim, c.n_heads, c.n_kv_heads, c.d_model, c.ffn, c.n_layers) == (16, 4, 2, 64, 96, 4)
    assert m.is_local == (True, True, True, False) and m.use_rope == (True, True, True, False) and m.window == 8
    assert [e is None for e in m.moe] == [True, False, False, False]        # leading_dense_block_count 1
    assert (c.n_experts, c.n_experts_used, c.expert_ffn, c.expert_groups) == (8, 2, 24, 1)
    assert c.expert_gating == "sigmoid" and c.expert_weights_scale == 2.5 and m.weights_norm
    assert m.moe[1].gate_shexp.shape[0] == 24 and m.moe[1].exp_probs_b.shape == (8,)
    assert c.rope.style == "neox" and c.rope.n_rot == 16 and c.rope.freq_factors is None
    assert m.rope_local == c.rope and m.embed_scale == 8.0
    b = m.blocks[0]
    assert b.attn_gate.shape == (64, 64) and b.attn_post_norm.shape == (64,) and b.ffn_post_norm.shape == (64,)
    assert b.attn_q_norm.shape == (16,) and b.attn_k_norm.shape == (16,) and b.attn_q_bias is None
    assert any(w is b.attn_gate for w in m.qweights())
    assert miss(engine(NAME)) < TOL


def test_moe_in_float64():
    """build_moe_ffn(sigmoid, exp_probs_b, norm_w, scale) plus the shared expert, in float64."""
    m = engine(NAME).model
    e, h, want = sigmoid_moe_case(m, 2, seed=5)
    err = max_rel(m.ffn(h, e, None), want)
    assert err < 1e-5, err
    m.weights_norm = False                    # without the renormalization the MoE misses the formula
    assert max_rel(m.ffn(h, e, None), want) > 0.1


@pytest.mark.parametrize("what", ["no_window", "rope_on_global", "no_rope_local", "adjacent_pairs", "no_gate",
                                  "no_embed_scale", "attn_post_norm_weight", "ffn_post_norm_weight", "softmax",
                                  "no_select_bias", "no_renorm", "no_scale", "no_shared"])
def test_each_rule_is_needed(what):
    eng = engine(NAME)
    m = eng.model
    c = m.cfg
    if what == "no_select_bias":             # zeros, not arch_checks.break_rule's None
        for e in m.moe[1:]:
            e.exp_probs_b = torch.zeros_like(e.exp_probs_b)
    elif break_rule(m, what):
        pass
    elif what == "adjacent_pairs":
        m.cfg = replace(c, rope=replace(c.rope, style="normal"))
        m.rope_local = m.cfg.rope
    elif what == "no_gate":
        m.gated = lambda o, gate: o.float()
    elif what == "no_embed_scale":
        m.embed_scale = 1.0
    elif what == "attn_post_norm_weight":
        for b in m.blocks:
            b.attn_post_norm = torch.ones_like(b.attn_post_norm)
    else:
        for b in m.blocks:
            b.ffn_post_norm = torch.ones_like(b.ffn_post_norm)
    # no_renorm: the post-FFN RMSNorm takes out most of what the weights' sum scales, only the routed / shared
    # balance is left (7.8e-3 here); test_moe_in_float64 shows the rule on the MoE's own output
    assert miss(eng) > (5 if what == "no_renorm" else 10) * TOL, what


def test_a_constant_gate_is_what_the_post_norm_removes():
    """Why no_gate's check uses the per-element gate: a constant factor on the attention's output (a gate
    of zeros: sigmoid 0.5) is undone by the post-attention RMSNorm, up to its eps."""
    eng = engine(NAME)
    eng.model.gated = lambda o, gate: 0.5 * o.float()
    assert miss(eng) > 10 * TOL          # the gate is not constant in the fixture
    eng2 = engine(NAME)
    eng2.model.gated = lambda o, gate: o.float()
    r = ref(NAME)
    a = eng.logits(r["ids"].tolist()).numpy()
    b = eng2.logits(r["ids"].tolist()).numpy()
    assert rel_err(a, b) < 1e-3


@pytest.mark.parametrize("tensor", ["blk.0.attn_gate.weight", "blk.1.post_attention_norm.weight",
                                    "blk.2.post_ffw_norm.weight", "blk.3.attn_q_norm.weight",
                                    "blk.1.attn_k_norm.weight", "blk.2.exp_probs_b.bias", "blk.3.ffn_gate_inp.weight",
                                    "blk.1.ffn_up_shexp.weight", "blk.0.ffn_gate.weight", "blk.2.ffn_down_exps.weight"])
def test_missing_tensor_is_named(tmp_path, tensor):
    assert_refused(NAME, tmp_path, dict(drop_tensors=(tensor,)), tensor)


@pytest.mark.parametrize("key", ["afmoe.expert_count", "afmoe.expert_used_count", "afmoe.expert_feed_forward_length",
                                 "afmoe.expert_shared_count"])
def test_missing_key_is_named(tmp_path, key):
    assert_refused(NAME, tmp_path, dict(drop_keys=(key,)), key)


def test_absent_optional_keys_take_llamacpps_values(tmp_path):
    """No attention.sliding_window: no window on any layer (swa_type NONE), rope still off on every fourth;
    no leading_dense_block_count: every layer MoE (layer 0's dense tensors then leave its router missing);
    rope.freq_base_swa: the local layers' base only; expert_group_count: ignored (the loader reads none)."""
    eng = rewritten_engine(NAME, tmp_path, drop_keys=("afmoe.attention.sliding_window",))
    assert eng.model.is_local == (False,) * 4 and eng.model.use_rope == (True, True, True, False)
    assert miss(eng) > 10 * TOL
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "y.gguf", drop_keys=("afmoe.leading_dense_block_count",))
    with pytest.raises(MinferError, match=r"blk\.0\.ffn_gate_inp\.weight"):
        load(p)
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "z.gguf",
                set_keys={"afmoe.rope.freq_base_swa": (500.0, gguf.GGUFValueType.FLOAT32),
                          "afmoe.expert_group_count": (2, gguf.GGUFValueType.UINT32),
                          "afmoe.expert_group_used_count": (1, gguf.GGUFValueType.UINT32)})
    m = load(p)
    assert m.rope_local.theta == 500.0 and m.cfg.rope.theta == 10000.0 and m.cfg.expert_groups == 1


def test_fused_qkv_refused(tmp_path):
    assert_refused(NAME, tmp_path, dict(add_tensors={"blk.0.attn_qkv.weight": np.zeros((128, 64), np.float32)}),
                   "blk.0.attn_qkv.weight")


def test_rope_factors_refused(tmp_path):
    assert_refused(NAME, tmp_path, dict(add_tensors={"rope_freqs.weight": np.ones(8, np.float32)}), "rope_freqs.weight")


def test_partial_rope_refused(tmp_path):
    assert_refused(NAME, tmp_path, dict(set_keys={"afmoe.rope.dimension_count": (8, gguf.GGUFValueType.UINT32)}),
                   "afmoe.rope.dimension_count")
