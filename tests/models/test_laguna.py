"""poolside Laguna (minfer/models/laguna.py) on the CPU's float32 reference: the per-layer query heads, window layers
and rope per layer type read from the file, the softplus gate per head (laguna, XS.2 style) and per element
(laguna-elem, M.1 style), each rule needed (with one changed the logits miss transformers' by more than 10x the
tolerance), the MoE against a float64 formula, absent optional keys taking llama.cpp's values, what the model needs
refused by name. The logits, greedy continuation, KV cache in pieces and paged cache are
test_arch_vs_transformers' (names "laguna", "laguna-elem"). Fixtures: tests/data/arch/laguna*.gguf
(tools/gen_arch_fixtures.py: transformers' LagunaForCausalLM converted by llama.cpp's convert_hf_to_gguf.py)."""

from __future__ import annotations

from dataclasses import replace

import gguf
import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.arch_checks import assert_refused, break_rule, logits_miss, max_rel, rewritten_engine, sigmoid_moe_case
from models.test_arch_vs_transformers import DATA, TOL, engine, load, rewrite

NAME = "laguna"


def miss(eng, name: str = NAME) -> float:
    return logits_miss(name, eng)


def test_layout_read_from_the_file():
    m = engine(NAME).model
    c = m.cfg
    assert m.heads == (4, 8, 8, 8) and c.heads_per_layer == (4, 8, 8, 8) and c.n_heads == 8
    assert m.kv_heads == (2,) * 4 and c.kv_layers == ((2, 16, 16),) * 4
    assert m.is_local == (False, True, True, True) and m.window == 8        # no pattern key: dense-first 4
    assert c.rope.n_rot == 8 and c.rope.theta == 5e5 and m.rope_local.n_rot == 16 and m.rope_local.theta == 1e4
    assert m.rope_full == c.rope and m.q_rot_scale == 1.0                                  # no YaRN here
    assert [g.shape for g in m.attn_gate] == [(4, 64), (8, 64), (8, 64), (8, 64)]          # per head
    assert m.blocks[1].attn_q.shape == (128, 64) and m.blocks[1].attn_output.shape == (64, 128)
    assert [e is None for e in m.moe] == [True, False, False, False]
    assert c.expert_gating == "sigmoid" and m.weights_norm and c.expert_weights_scale == 2.5
    assert m.moe[1].gate_shexp.shape == (32, 64) and m.moe[1].exp_probs_b.shape == (8,)
    assert any(w is m.attn_gate[2] for w in m.qweights())
    e = engine("laguna-elem").model
    assert e.heads == (4, 4, 4) and e.is_local == (False,) * 3 and e.window == 0
    assert [g.shape for g in e.attn_gate] == [(64, 64)] * 3                                 # per element


def test_moe_in_float64():
    """build_moe_ffn(sigmoid, exp_probs_b, norm_w, scale) plus the shared expert, in float64."""
    m = engine(NAME).model
    e, h, want = sigmoid_moe_case(m, 2, seed=4)
    assert max_rel(m.ffn(h, e, None), want) < 1e-5


@pytest.mark.parametrize("what", ["no_window", "window_on_layer0", "one_rope", "full_rope_everywhere",
                                  "adjacent_pairs", "no_gate", "sigmoid_gate", "gate_per_element_as_head",
                                  "no_q_norm", "no_k_norm", "softmax", "no_select_bias", "no_scale", "no_shared",
                                  "moe_on_layer0"])
def test_each_rule_is_needed(what):
    name = "laguna-elem" if what == "gate_per_element_as_head" else NAME
    eng = engine(name)
    m = eng.model
    c = m.cfg
    if break_rule(m, what):
        pass
    elif what == "window_on_layer0":
        m.is_local = (True,) * c.n_layers
        m.rope_local = c.rope                  # the window only: layer 0 keeps its rope
    elif what == "one_rope":                   # the full layers' rope (8 dims, 5e5) on the window layers too
        m.rope_local = m.rope_full
    elif what == "full_rope_everywhere":       # the window layers' rope (16 dims, 1e4) on layer 0 too
        m.rope_full = m.rope_local
    elif what == "adjacent_pairs":
        m.rope_full = replace(m.rope_full, style="normal")
        m.rope_local = replace(m.rope_local, style="normal")
    elif what == "no_gate":
        m.gated = lambda o, gate: o.float().reshape(o.shape[0], -1)
    elif what == "sigmoid_gate":
        m.gated = lambda o, gate: (o.float() * torch.sigmoid(gate.float()).unsqueeze(-1)).reshape(o.shape[0], -1)
    else:                       # gate_per_element_as_head: laguna-elem's gate read per head (its first H columns)
        H = m.heads[0]
        m.gated = lambda o, gate: (o.float() * torch.nn.functional.softplus(gate[:, :H].float()).unsqueeze(-1)
                                   ).reshape(o.shape[0], -1)
    assert miss(eng, name) > 10 * TOL, what


@pytest.mark.parametrize("tensor", ["blk.0.attn_gate.weight", "blk.1.attn_q_norm.weight", "blk.2.attn_k_norm.weight",
                                    "blk.3.exp_probs_b.bias", "blk.1.ffn_up_shexp.weight", "blk.0.ffn_down.weight",
                                    "blk.2.ffn_gate_exps.weight", "blk.3.ffn_gate_inp.weight", "output_norm.weight"])
def test_missing_tensor_is_named(tmp_path, tensor):
    assert_refused(NAME, tmp_path, dict(drop_tensors=(tensor,)), tensor)


@pytest.mark.parametrize("key", ["laguna.leading_dense_block_count", "laguna.expert_count",
                                 "laguna.expert_used_count", "laguna.expert_feed_forward_length"])
def test_missing_key_is_named(tmp_path, key):
    assert_refused(NAME, tmp_path, dict(drop_keys=(key,)), key)


def test_absent_optional_keys_take_llamacpps_values(tmp_path):
    """No expert_gating_func: sigmoid; no expert_shared_feed_forward_length: expert_feed_forward_length x
    expert_shared_count (here 24 != the file's 32: the shared tensors' shape is named); no
    rope.dimension_count_swa: the full layers' count on every layer; no freq_base_swa: freq_base; no
    expert_weights_norm: not renormalized (llama.cpp's default); a window pattern key overrides the default."""
    def eng(**kw):
        return rewritten_engine(NAME, tmp_path, **kw)

    e = eng(drop_keys=("laguna.expert_gating_func",))
    assert e.model.cfg.expert_gating == "sigmoid" and miss(e) < TOL
    e = eng(set_keys={"laguna.expert_shared_feed_forward_length": (32, gguf.GGUFValueType.UINT32),
                      "laguna.expert_shared_count": (1, gguf.GGUFValueType.UINT32)})
    assert miss(e) < TOL
    with pytest.raises(MinferError, match=r"ffn_gate_shexp\.weight"):
        load(rewrite(DATA / f"{NAME}.gguf", tmp_path / "y.gguf", drop_keys=("laguna.expert_shared_feed_forward_length",)))
    e = eng(drop_keys=("laguna.rope.dimension_count_swa",))
    assert e.model.rope_local.n_rot == 8 and miss(e) > 10 * TOL
    e = eng(drop_keys=("laguna.rope.freq_base_swa",))
    assert e.model.rope_local.theta == 5e5 and miss(e) > 10 * TOL
    e = eng(drop_keys=("laguna.expert_weights_norm",))
    assert not e.model.weights_norm and miss(e) > 10 * TOL
    e = eng(set_keys={"laguna.attention.sliding_window_pattern": (2, gguf.GGUFValueType.UINT32)})
    assert e.model.is_local == (False, True, False, True) and miss(e) > 10 * TOL
    e = eng(drop_keys=("laguna.attention.sliding_window",))
    assert e.model.is_local == (False,) * 4 and miss(e) > 10 * TOL


@pytest.mark.parametrize("kw,match", [
    (dict(drop_tensors=("blk.1.attn_gate.weight",), add_tensors={"blk.1.attn_gate.weight": np.zeros((5, 64), np.float32)}),
     r"blk\.1\.attn_gate\.weight' has 5 rows"),
    (dict(add_tensors={"blk.0.attn_q.bias": np.zeros(64, np.float32)}), r"blk\.0\.attn_q\.bias"),
    (dict(add_tensors={"blk.2.attn_qkv.weight": np.zeros((192, 64), np.float32)}), r"blk\.2\.attn_qkv\.weight"),
    (dict(add_tensors={"rope_freqs.weight": np.ones(4, np.float32)}), r"rope_freqs\.weight"),
    (dict(set_keys={"laguna.attention.value_length": (8, gguf.GGUFValueType.UINT32)}), r"laguna\.attention\.value_length"),
    (dict(set_keys={"laguna.rope.dimension_count_swa": (7, gguf.GGUFValueType.UINT32)}),
     r"laguna\.rope\.dimension_count_swa"),
    (dict(set_keys={"laguna.attention.head_count": ([4, 8, 5, 8], gguf.GGUFValueType.ARRAY)}),
     r"laguna\.attention\.head_count"),
    (dict(set_keys={"laguna.attention.head_count": ([4, 8], gguf.GGUFValueType.ARRAY)}), r"laguna\.attention\.head_count"),
    (dict(set_keys={"laguna.rope.scaling.type": ("yarn", gguf.GGUFValueType.STRING),
                    "laguna.rope.scaling.factor": (4.0, gguf.GGUFValueType.FLOAT32)}),
     r"laguna\.rope\.scaling\.original_context_length"),
    (dict(set_keys={"laguna.expert_used_count": (9, gguf.GGUFValueType.UINT32)}), r"expert_used_count=9"),
])
def test_unsupported_input_refused_by_name(tmp_path, kw, match):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", **kw)
    with pytest.raises(MinferError, match=match):
        load(p)


def test_head_count_array_refused_for_other_archs(tmp_path):
    """config.py takes a head_count array only where the model class says so (per_layer_counts)."""
    p = rewrite(DATA / "mellum.gguf", tmp_path / "x.gguf",
                set_keys={"mellum.attention.head_count": ([4, 4, 4, 4], gguf.GGUFValueType.ARRAY)})
    with pytest.raises(MinferError, match=r"mellum\.attention\.head_count"):
        load(p)


def test_metadata_check_takes_the_head_count_array_for_laguna_only(tmp_path):
    """minfer/metadata_check.py: laguna's head_count array passes (PER_LAYER_HEADS), another arch's is flagged."""
    from minfer.gguf_file import GGUFFile
    from minfer.metadata_check import problems

    assert problems(GGUFFile(DATA / f"{NAME}.gguf")) == {}
    p = rewrite(DATA / "mellum.gguf", tmp_path / "x.gguf",
                set_keys={"mellum.attention.head_count": ([4, 4, 4, 4], gguf.GGUFValueType.ARRAY)})
    assert "mellum.attention.head_count" in problems(GGUFFile(p))


# ---- laguna-yarn: XS.2's YaRN on the full layers -------------------------------------------------------------------

def test_yarn_on_the_full_layer_only():
    m = engine("laguna-yarn").model
    assert m.rope_full.freq_factors is not None and m.rope_local.freq_factors is None and m.cfg.rope.freq_scale == 1.0
    assert abs(m.q_rot_scale - (1 + 0.1 * np.log(8.0)) ** 2) < 1e-9
    assert miss(engine("laguna-yarn"), "laguna-yarn") < TOL


@pytest.mark.parametrize("what", ["no_yarn", "no_mscale", "mscale_on_every_dim", "yarn_on_window_layers"])
def test_yarn_rules_are_needed(what):
    eng = engine("laguna-yarn")
    m = eng.model
    if what == "no_yarn":
        m.rope_full, m.q_rot_scale = m.cfg.rope, 1.0
    elif what == "no_mscale":
        m.q_rot_scale = 1.0
    elif what == "mscale_on_every_dim":       # mscale^2 on the whole q (olmo2's whole-head rope), not its rotated dims
        m.blocks[0].attn_q_norm = m.blocks[0].attn_q_norm * m.q_rot_scale
        m.q_rot_scale = 1.0
    else:
        m.rope_local = replace(m.rope_local, freq_factors=(8.0,) * 8)
    assert miss(eng, "laguna-yarn") > 10 * TOL, what
