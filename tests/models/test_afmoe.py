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
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, reference_switches, rel_err, rewrite

NAME = "afmoe"


def miss(eng) -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


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
    e, c = m.moe[2], m.cfg
    E, F, D = c.n_experts, c.expert_ffn, c.d_model
    torch.manual_seed(5)
    h = torch.randn(6, D)
    gate = e.gate_exps.dense.double().view(E, F, D)
    up = e.up_exps.dense.double().view(E, F, D)
    down = e.down_exps.dense.double().view(E, D, F)
    p = torch.sigmoid(h.double() @ e.gate_inp.double().T)                     # (T, E)
    idx = (p + e.exp_probs_b.double()).topk(c.n_experts_used, dim=-1)[1]
    w = p.gather(1, idx)
    w = w / w.sum(-1, keepdim=True) * c.expert_weights_scale
    want = torch.zeros(6, D, dtype=torch.float64)
    for t in range(6):
        x = h[t].double()
        for j in range(c.n_experts_used):
            k = idx[t, j]
            want[t] += w[t, j] * (down[k] @ (torch.nn.functional.silu(gate[k] @ x) * (up[k] @ x)))
        z = torch.nn.functional.silu(e.gate_shexp.dense.double() @ x) * (e.up_shexp.dense.double() @ x)
        want[t] += e.down_shexp.dense.double() @ z
    got = m.ffn(h, e, None).double()
    err = ((got - want).abs().max() / want.abs().max()).item()
    assert err < 1e-5, err
    m.weights_norm = False                    # without the renormalization the MoE misses the formula
    got = m.ffn(h, e, None).double()
    assert ((got - want).abs().max() / want.abs().max()).item() > 0.1


@pytest.mark.parametrize("what", ["no_window", "rope_on_global", "no_rope_local", "adjacent_pairs", "no_gate",
                                  "no_embed_scale", "attn_post_norm_weight", "ffn_post_norm_weight", "softmax",
                                  "no_select_bias", "no_renorm", "no_scale", "no_shared"])
def test_each_rule_is_needed(what):
    eng = engine(NAME)
    m = eng.model
    c = m.cfg
    if what == "no_window":
        m.window = 0
    elif what == "rope_on_global":
        m.use_rope = (True,) * c.n_layers
    elif what == "no_rope_local":
        m.use_rope = (False,) * c.n_layers
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
    elif what == "ffn_post_norm_weight":
        for b in m.blocks:
            b.ffn_post_norm = torch.ones_like(b.ffn_post_norm)
    elif what == "softmax":
        m.cfg = replace(c, expert_gating="softmax")
    elif what == "no_select_bias":
        for e in m.moe[1:]:
            e.exp_probs_b = torch.zeros_like(e.exp_probs_b)
    elif what == "no_renorm":
        m.weights_norm = False
    elif what == "no_scale":
        m.cfg = replace(c, expert_weights_scale=1.0)
    else:
        for e in m.moe[1:]:
            e.gate_shexp = None
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
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_tensors=(tensor,))
    with pytest.raises(MinferError, match=tensor.replace(".", r"\.")):
        load(p)


@pytest.mark.parametrize("key", ["afmoe.expert_count", "afmoe.expert_used_count", "afmoe.expert_feed_forward_length",
                                 "afmoe.expert_shared_count"])
def test_missing_key_is_named(tmp_path, key):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_keys=(key,))
    with pytest.raises(MinferError, match=key.replace(".", r"\.")):
        load(p)


def test_absent_optional_keys_take_llamacpps_values(tmp_path):
    """No attention.sliding_window: no window on any layer (swa_type NONE), rope still off on every fourth;
    no leading_dense_block_count: every layer MoE (layer 0's dense tensors then leave its router missing);
    rope.freq_base_swa: the local layers' base only; expert_group_count: ignored (the loader reads none)."""
    from minfer.runtime.engine import Engine

    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_keys=("afmoe.attention.sliding_window",))
    eng = Engine.load(p, ctx=64, progress=False, switches=reference_switches())
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
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf",
                add_tensors={"blk.0.attn_qkv.weight": np.zeros((128, 64), np.float32)})
    with pytest.raises(MinferError, match=r"blk\.0\.attn_qkv\.weight"):
        load(p)


def test_rope_factors_refused(tmp_path):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", add_tensors={"rope_freqs.weight": np.ones(8, np.float32)})
    with pytest.raises(MinferError, match=r"rope_freqs\.weight"):
        load(p)


def test_partial_rope_refused(tmp_path):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf",
                set_keys={"afmoe.rope.dimension_count": (8, gguf.GGUFValueType.UINT32)})
    with pytest.raises(MinferError, match=r"afmoe\.rope\.dimension_count"):
        load(p)
