"""LG K-EXAONE (minfer/models/exaone_moe.py) on the CPU's float32 reference: the layer pattern read from the
file, the MoE against a float64 formula of llama.cpp's build_moe_ffn rule, each rule needed (with one changed
the logits miss by more than 10x the tolerance), absent optional keys taking llama.cpp's / HF's values, what
the model needs refused by name. The logits, greedy continuation, KV cache in pieces and paged cache are
test_arch_vs_transformers' (name "exaone-moe"). Fixture: tests/data/arch/exaone-moe.gguf (tools/
gen_arch_fixtures.py: transformers' ExaoneMoeForCausalLM converted by llama.cpp's convert_hf_to_gguf.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from models.arch_checks import assert_refused, break_rule, logits_miss, max_rel, rewritten_engine, swiglu_moe_f64
from models.test_arch_vs_transformers import DATA, TOL, engine, load, rewrite

NAME = "exaone-moe"


def miss(eng) -> float:
    return logits_miss(NAME, eng)


def test_layout_read_from_the_file():
    m = engine(NAME).model
    c = m.cfg
    assert (c.head_dim, c.n_heads, c.n_kv_heads, c.d_model, c.ffn, c.n_layers) == (16, 4, 2, 64, 96, 4)
    assert m.is_local == (True, False, True, False) and m.use_rope == m.is_local and m.window == 8
    assert [e is None for e in m.moe] == [True, False, False, False]        # leading_dense_block_count 1
    assert (c.n_experts, c.n_experts_used, c.expert_ffn, c.expert_groups, c.expert_groups_used) == (8, 2, 32, 2, 1)
    assert c.expert_gating == "sigmoid" and c.expert_weights_scale == 2.5 and m.weights_norm
    assert m.moe[1].gate_shexp.shape[0] == 32 and m.moe[1].exp_probs_b.shape == (8,)
    assert c.rope.style == "neox" and c.rope.n_rot == 16 and c.rope.freq_factors is not None
    b = m.blocks[0]
    assert b.attn_q_norm.shape == (16,) and b.attn_k_norm.shape == (16,) and b.attn_q_bias is None
    assert miss(engine(NAME)) < TOL


def test_moe_in_float64():
    """build_moe_ffn(sigmoid, exp_probs_b, groups, norm_w, scale) plus the shared expert, in float64."""
    m = engine(NAME).model
    e, c = m.moe[2], m.cfg
    E, G = c.n_experts, c.expert_groups
    torch.manual_seed(5)
    h = torch.randn(6, c.d_model)
    p = torch.sigmoid(h.double() @ e.gate_inp.double().T)                     # (T, E)
    s = p + e.exp_probs_b.double()
    group_score = s.view(6, G, E // G).topk(2, dim=-1)[0].sum(-1)              # (T, G)
    keep = torch.zeros(6, G, dtype=torch.bool)
    keep.scatter_(1, group_score.topk(c.expert_groups_used, dim=-1)[1], True)
    s = s.masked_fill(~keep.repeat_interleave(E // G, dim=1), float("-inf"))
    idx = s.topk(c.n_experts_used, dim=-1)[1]
    w = p.gather(1, idx)
    want = swiglu_moe_f64(e, c, h, idx, w / w.sum(-1, keepdim=True) * c.expert_weights_scale)
    err = max_rel(m.ffn(h, e, None), want)
    assert err < 1e-5, err


@pytest.mark.parametrize("what", ["no_window", "rope_on_global", "no_rope_local", "adjacent_pairs",
                                  "no_rope_factors", "softmax", "no_select_bias", "no_groups", "no_renorm",
                                  "no_scale", "no_shared", "dense_layer_as_moe_norm"])
def test_each_rule_is_needed(what):
    eng = engine(NAME)
    m = eng.model
    c = m.cfg
    if break_rule(m, what):
        pass
    elif what == "adjacent_pairs":
        m.cfg = replace(c, rope=replace(c.rope, style="normal"))
    elif what == "no_rope_factors":
        m.cfg = replace(c, rope=replace(c.rope, freq_factors=None))
    elif what == "no_groups":
        m.cfg = replace(c, expert_groups=1, expert_groups_used=1)
    else:       # the FFN norm taken from the next layer's attention norm (pre-norm order mixed up)
        for b, nxt in zip(m.blocks, m.blocks[1:]):
            b.ffn_norm = nxt.attn_norm
    assert miss(eng) > 10 * TOL, what


@pytest.mark.parametrize("tensor", ["blk.1.attn_q_norm.weight", "blk.2.attn_k_norm.weight", "blk.3.ffn_norm.weight",
                                    "blk.0.attn_norm.weight", "blk.0.ffn_gate.weight", "blk.1.ffn_gate_inp.weight",
                                    "blk.2.ffn_down_exps.weight", "blk.3.ffn_up_shexp.weight"])
def test_missing_tensor_is_named(tmp_path, tensor):
    assert_refused(NAME, tmp_path, dict(drop_tensors=(tensor,)), tensor)


@pytest.mark.parametrize("key", ["exaone-moe.attention.sliding_window", "exaone-moe.expert_count",
                                 "exaone-moe.expert_used_count", "exaone-moe.expert_feed_forward_length"])
def test_missing_key_is_named(tmp_path, key):
    assert_refused(NAME, tmp_path, dict(drop_keys=(key,)), key)


def test_absent_optional_keys_take_the_defaults(tmp_path):
    """No expert_gating_func: sigmoid (HF's only router); no expert_shared_feed_forward_length:
    expert_feed_forward_length (both the same model here); no sliding_window_pattern: llama.cpp's default 4
    (layers 0-2 local, 3 global); no selection bias tensors: the choice on p."""
    keys = ("exaone-moe.expert_gating_func", "exaone-moe.expert_shared_feed_forward_length")
    eng = rewritten_engine(NAME, tmp_path, drop_keys=keys)
    m = eng.model
    assert m.cfg.expert_gating == "sigmoid" and m.moe[1].gate_shexp.shape[0] == 32
    assert miss(eng) < TOL
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "z.gguf", drop_keys=("exaone-moe.attention.sliding_window_pattern",))
    assert load(p).is_local == (True, True, True, False)
    q = rewrite(DATA / f"{NAME}.gguf", tmp_path / "y.gguf",
                drop_tensors=tuple(f"blk.{i}.exp_probs_b.bias" for i in (1, 2, 3)))
    assert all(e.exp_probs_b is None for e in load(q).moe[1:])


def test_fused_qkv_refused(tmp_path):
    assert_refused(NAME, tmp_path, dict(add_tensors={"blk.0.attn_qkv.weight": np.zeros((128, 64), np.float32)}),
                   "blk.0.attn_qkv.weight")


def test_non_positive_window_refused(tmp_path):
    import gguf

    assert_refused(NAME, tmp_path,
                   dict(set_keys={"exaone-moe.attention.sliding_window": (0, gguf.GGUFValueType.UINT32)}),
                   "exaone-moe.attention.sliding_window")
