"""Mistral Small 4 (minfer/models/mistral4.py: deepseek2's model under the arch `mistral4`) on the CPU's
float32 reference: the layout read from the file (the low-rank q, the latent cache, the fused gate_up experts
llama.cpp's mistral4 converter writes), each rule the fixture exercises needed (with one changed the logits
miss transformers' by more than 10x the tolerance), what the model cannot run refused by name. The logits,
greedy continuation, KV cache in pieces and paged cache are test_arch_vs_transformers' (name "mistral4").
Fixture: tests/data/arch/mistral4.gguf (tools/gen_arch_fixtures.py: transformers' Mistral4ForCausalLM,
converted by llama.cpp's convert_hf_to_gguf.py, conversion/mistral3.py Mistral4Model)."""

from __future__ import annotations

import math
from dataclasses import replace

import gguf
import pytest
import torch

from models.arch_checks import assert_refused, logits_miss
from models.test_arch_vs_transformers import TOL, engine

NAME = "mistral4"


def test_layout_read_from_the_file():
    m = engine(NAME).model
    c = m.cfg
    assert m.arch == "mistral4" and type(m).__name__ == "Mistral4Model"
    assert m.dims == (4, 24, 8, 16, 20)                  # H, kv_lora_rank, rope dims, qk_nope, v_head
    assert (c.n_kv_heads, c.head_dim, c.cache_v_in_k) == (1, 32, 24)  # one latent row of R + Dr, V its first R
    assert m.rope.style == "normal" and m.rope.n_rot == 8
    b0, b1 = m.blocks[0], m.blocks[1]
    assert b0.router is None and b0.ffn_gate.shape == (96, 64)          # leading_dense_block_count 1
    assert b1.attn_q_a.shape == (32, 64) and b1.attn_q_b.shape == (96, 32) and b1.attn_q is None
    assert b1.gate_exps.shape == (8 * 64, 64) and b1.up_exps is None    # ffn_gate_up_exps (E, 2 Fe, D), fused
    assert b1.gate_shexp.shape == (32, 64)
    assert (c.expert_groups, c.expert_groups_used, c.expert_weights_scale) == (4, 2, 1.5)
    assert m.weights_norm and m.gating == "softmax"
    # YaRN factor 16, mscale_all_dim 1 (yarn_log_multiplier 0.1): cos/sin times 1, scores times mscale^2 / sqrt(24)
    assert m.rope_scale == 1.0
    assert abs(m.kq_scale - (1 + 0.1 * math.log(16)) ** 2 / math.sqrt(24)) < 1e-7    # the key is float32 0.1


def swap_gate_up_halves(m) -> None:
    """Each expert's fused rows read as up then gate (not gate then up)."""
    H, R, Dr, Dn, Dv = m.dims
    for b in m.blocks:
        if b.router is None:
            continue
        q = b.gate_exps
        E, Fe = b.router.shape[0], q.shape[0] // b.router.shape[0] // 2
        perm = torch.arange(E * 2 * Fe).view(E, 2, Fe).flip(1).reshape(-1)
        b.gate_exps = replace(q, raw=q.raw[perm], dense=None if q.dense is None else q.dense[perm], packed=None)


@pytest.mark.parametrize("what", ["neox_pairs", "no_yarn_ramp", "no_yarn_mscale", "gate_up_swapped", "no_renorm",
                                  "no_weights_scale", "no_groups", "sigmoid_gating"])
def test_each_rule_is_needed(what):
    eng = engine(NAME)
    m = eng.model
    c = m.cfg
    assert logits_miss(NAME, eng) < TOL
    if what == "neox_pairs":             # HF rope_interleave: adjacent pairs (NORM), not halves
        m.rope = replace(m.rope, style="neox")
    elif what == "no_yarn_ramp":         # the plain frequencies, not YaRN's ramp over the original 16
        m.rope = c.rope
    elif what == "no_yarn_mscale":       # 1/sqrt(qk_nope + qk_rope) without mscale^2 (1 + 0.1 ln 16)^2
        m.kq_scale = 1 / math.sqrt(24)
    elif what == "gate_up_swapped":
        swap_gate_up_halves(m)
    elif what == "no_renorm":            # norm_topk_prob -> expert_weights_norm
        m.weights_norm = False
    elif what == "no_weights_scale":     # routed_scaling_factor 1.5 -> expert_weights_scale
        m.cfg = replace(c, expert_weights_scale=1.0)
    elif what == "no_groups":            # n_group 4, topk_group 2: a group by its two best scores
        m.cfg = replace(c, expert_groups=1, expert_groups_used=1)
    else:                                # HF Mistral4TopkRouter: softmax scores
        m.gating = "sigmoid"
    assert logits_miss(NAME, eng) > 10 * TOL, what


@pytest.mark.parametrize("tensor", ["blk.1.ffn_gate_up_exps.weight", "blk.0.attn_q_a_norm.weight",
                                    "blk.2.attn_k_b.weight", "blk.1.ffn_down_shexp.weight",
                                    "blk.2.ffn_gate_inp.weight"])
def test_missing_tensor_is_named(tmp_path, tensor):
    assert_refused(NAME, tmp_path, dict(drop_tensors=(tensor,)), tensor)


@pytest.mark.parametrize("key", ["mistral4.attention.key_length_mla", "mistral4.attention.kv_lora_rank",
                                 "mistral4.attention.value_length_mla", "mistral4.expert_feed_forward_length"])
def test_missing_key_is_named(tmp_path, key):
    assert_refused(NAME, tmp_path, dict(drop_keys=(key,)), key)


@pytest.mark.parametrize("key, value", [
    # Llama-4's attention temperature (HF llama_4_scaling_beta): llama.cpp's mistral4 converter writes none, so
    # a file carrying it is one minfer would run without the per-position q factor: refused
    ("mistral4.attention.temperature_scale", (0.1, gguf.GGUFValueType.FLOAT32)),
    ("mistral4.attention.temperature_length", (8192, gguf.GGUFValueType.UINT32)),
    ("mistral4.rope.scaling.yarn_ext_factor", (0.5, gguf.GGUFValueType.FLOAT32)),
    ("mistral4.expert_gating_func", (3, gguf.GGUFValueType.UINT32)),
])
def test_unsupported_keys_refused_by_name(tmp_path, key, value):
    assert_refused(NAME, tmp_path, dict(set_keys={key: value}), key)
