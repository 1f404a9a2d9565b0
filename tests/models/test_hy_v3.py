"""Tencent Hy3 (minfer/models/hy_v3.py) on the CPU's float32 reference: the layout read from the file (dense or
MoE per layer by its router tensor, the selection bias under hy_v3's own name), the MoE against a float64 formula
of llama.cpp's build_moe_ffn rule, each rule needed (with one changed the logits miss transformers' by more than
10x the tolerance), absent optional keys taking llama.cpp's values, what the model needs refused by name. The
logits, greedy continuation, KV cache in pieces and paged cache are test_arch_vs_transformers' (name "hy_v3").
Fixture: tests/data/arch/hy_v3.gguf (tools/gen_arch_fixtures.py: transformers' HYV3ForCausalLM converted by
llama.cpp's convert_hf_to_gguf.py)."""

from __future__ import annotations

from dataclasses import replace

import gguf
import numpy as np
import pytest
import torch

from models.arch_checks import assert_refused, break_rule, logits_miss, max_rel, rewritten_engine, sigmoid_moe_case
from models.test_arch_vs_transformers import DATA, TOL, engine

NAME = "hy_v3"


def miss(eng) -> float:
    return logits_miss(NAME, eng)


def tensor(name: str) -> np.ndarray:
    t = next(t for t in gguf.GGUFReader(str(DATA / f"{NAME}.gguf")).tensors if t.name == name)
    return np.asarray(t.data, dtype=np.float32)


def test_layout_read_from_the_file():
    m = engine(NAME).model
    c = m.cfg
    assert (c.head_dim, c.n_heads, c.n_kv_heads, c.d_model, c.ffn, c.n_layers) == (16, 4, 2, 64, 96, 3)
    assert [e is None for e in m.moe] == [True, False, False]     # no ffn_gate_inp on layer 0: dense
    assert c.leading_dense_blocks == 0                              # the converter writes no such key
    assert (c.n_experts, c.n_experts_used, c.expert_ffn, c.expert_groups) == (8, 2, 24, 1)
    assert c.expert_gating == "sigmoid" and c.expert_weights_scale == 2.5 and m.weights_norm
    e = m.moe[1]
    assert e.gate_shexp.shape == (24, 64) and e.exp_probs_b.shape == (8,)
    # the selection bias is the file's blk.N.exp_probs_b (no .bias suffix), not zeros
    assert torch.equal(e.exp_probs_b, torch.from_numpy(tensor("blk.1.exp_probs_b")))
    assert e.exp_probs_b.abs().max() > 0.1
    assert c.rope.style == "neox" and c.rope.n_rot == 16 and c.rope.freq_factors is None
    b = m.blocks[2]
    assert b.attn_q_norm.shape == (16,) and b.attn_k_norm.shape == (16,) and b.attn_q_bias is None
    assert miss(engine(NAME)) < TOL


def test_moe_in_float64():
    """build_moe_ffn(sigmoid, exp_probs_b, norm_w, scale) plus the shared expert, in float64."""
    m = engine(NAME).model
    e, h, want = sigmoid_moe_case(m, 2, seed=5)
    err = max_rel(m.ffn(h, e, None), want)
    assert err < 1e-5, err
    e.exp_probs_b = None                      # the choice without the selection bias misses the formula
    assert max_rel(m.ffn(h, e, None), want) > 0.05


@pytest.mark.parametrize("what", ["no_q_norm", "no_k_norm", "adjacent_pairs", "softmax", "no_select_bias",
                                  "no_renorm", "no_scale", "no_shared", "moe_on_layer0"])
def test_each_rule_is_needed(what):
    eng = engine(NAME)
    m = eng.model
    if not break_rule(m, what):               # adjacent_pairs
        m.cfg = replace(m.cfg, rope=replace(m.cfg.rope, style="normal"))
    assert miss(eng) > 10 * TOL, what


@pytest.mark.parametrize("tensor_name", ["blk.1.attn_q_norm.weight", "blk.2.attn_k_norm.weight", "blk.0.ffn_norm.weight",
                                         "blk.0.ffn_gate.weight", "blk.1.ffn_up_shexp.weight",
                                         "blk.2.ffn_down_shexp.weight", "blk.2.ffn_down_exps.weight",
                                         "blk.1.ffn_gate_exps.weight", "output_norm.weight"])
def test_missing_tensor_is_named(tmp_path, tensor_name):
    assert_refused(NAME, tmp_path, dict(drop_tensors=(tensor_name,)), tensor_name)


def test_a_layer_without_its_router_is_read_as_dense(tmp_path):
    """hy-v3.cpp decides dense or MoE by ffn_gate_inp alone: without it, layer 1 asks for the dense FFN."""
    assert_refused(NAME, tmp_path, dict(drop_tensors=("blk.1.ffn_gate_inp.weight",)), "blk.1.ffn_gate.weight")


@pytest.mark.parametrize("key", ["hy_v3.expert_count", "hy_v3.expert_used_count", "hy_v3.expert_feed_forward_length"])
def test_missing_key_is_named(tmp_path, key):
    assert_refused(NAME, tmp_path, dict(drop_keys=(key,)), key)


def test_absent_optional_keys_and_tensors_take_llamacpps_values(tmp_path):
    """No expert_gating_func: sigmoid (hy-v3.cpp's default), the logits unchanged; no expert_weights_norm: not
    renormalized (llama.cpp's hparams default), which misses; no expert_shared_feed_forward_length: the shared
    expert is expert_feed_forward_length wide (as the fixture's); no exp_probs_b: the choice on the scores."""
    def eng(**kw):
        return rewritten_engine(NAME, tmp_path, **kw)

    e = eng(drop_keys=("hy_v3.expert_gating_func", "hy_v3.expert_shared_feed_forward_length"))
    assert e.model.cfg.expert_gating == "sigmoid" and e.model.moe[1].gate_shexp.shape == (24, 64)
    assert miss(e) < TOL
    e = eng(drop_keys=("hy_v3.expert_weights_norm",))
    assert not e.model.weights_norm and miss(e) > 10 * TOL
    e = eng(drop_tensors=("blk.1.exp_probs_b", "blk.2.exp_probs_b"))
    assert e.model.moe[1].exp_probs_b is None and e.model.moe[2].exp_probs_b is None
    assert miss(e) > 10 * TOL
    e = eng(set_keys={"hy_v3.expert_gating_func": (1, gguf.GGUFValueType.UINT32)})
    assert e.model.cfg.expert_gating == "softmax" and miss(e) > 10 * TOL


def test_selection_bias_under_another_name_refused(tmp_path):
    """blk.N.exp_probs_b.bias is other archs' name (tn(..., "bias", i)); hy-v3.cpp loads blk.N.exp_probs_b."""
    assert_refused(NAME, tmp_path, dict(drop_tensors=("blk.1.exp_probs_b",),
                                        add_tensors={"blk.1.exp_probs_b.bias": tensor("blk.1.exp_probs_b")}),
                   "blk.1.exp_probs_b.bias")


def test_dense_and_moe_on_one_layer_refused(tmp_path):
    assert_refused(NAME, tmp_path, dict(add_tensors={"blk.1.ffn_gate.weight": np.zeros((96, 64), np.float32)}),
                   "blk.1.ffn_gate.weight")


def test_partial_rope_refused(tmp_path):
    assert_refused(NAME, tmp_path, dict(set_keys={"hy_v3.rope.dimension_count": (8, gguf.GGUFValueType.UINT32)}),
                   "hy_v3.rope.dimension_count")


def test_bad_expert_counts_named(tmp_path):
    assert_refused(NAME, tmp_path, dict(set_keys={"hy_v3.expert_used_count": (9, gguf.GGUFValueType.UINT32)}),
                   "expert_used_count=9")
