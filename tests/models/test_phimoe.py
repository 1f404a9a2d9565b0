"""Phi-3.5-MoE (minfer/models/phimoe.py) on the CPU's float32 reference: llama.cpp's rules (RMSNorm plus
bias, softmax top-k renormalized) against float64 formulas, each rule needed (with one changed the logits
miss by more than 10x the tolerance), what the model needs refused by name when missing. The logits,
greedy continuation, KV cache in pieces and paged cache are test_arch_vs_transformers' (name "phimoe").
Fixture: tests/data/arch/phimoe.gguf (tools/gen_arch_fixtures.py: transformers' PhimoeForCausalLM with
its LayerNorms and sparsemixer router swapped for llama.cpp's rules, LLAMACPP_RULES, since llama.cpp's
phimoe graph (src/models/phi3.cpp) computes those; converted by llama.cpp's convert_hf_to_gguf.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

NAME = "phimoe"


def miss(eng) -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def test_layout_read_from_the_file():
    m = engine(NAME).model
    c = m.cfg
    assert (c.head_dim, c.n_heads, c.n_kv_heads, c.d_model, c.ffn) == (16, 4, 2, 64, 32)
    assert (c.n_experts, c.n_experts_used) == (4, 2) and m.weights_norm
    assert c.rope.style == "neox" and c.rope.n_rot == 16 and c.rope_long is None
    assert m.output_b.shape == (c.vocab,) and m.output_norm_b.shape == (64,)
    b = m.blocks[0]
    assert b.attn_q_bias.shape == (64,) and b.attn_k_bias.shape == (32,) and b.attn_output_b.shape == (64,)
    assert b.attn_norm_b.shape == (64,) and b.ffn_norm_b.shape == (64,)
    assert miss(engine(NAME)) < TOL


def test_norm_is_rms_plus_bias_in_float64():
    """llama.cpp's LLM_NORM_RMS with the bias (phi3.cpp build_norm), not HF's LayerNorm."""
    m = engine(NAME).model
    b = m.blocks[1]
    torch.manual_seed(0)
    x = torch.randn(5, 64, dtype=torch.float64) + 3.0            # a mean far from 0: LayerNorm would differ
    want = x / torch.sqrt((x * x).mean(-1, keepdim=True) + m.cfg.rms_eps) * b.ffn_norm.double() + b.ffn_norm_b.double()
    got = m.norm(x.float(), b.ffn_norm, b.ffn_norm_b).double()
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)


def test_moe_is_softmax_topk_renormalized_in_float64():
    """build_moe_ffn(..., norm_w = true, gating SOFTMAX): the top-2 of softmax(W_r h), renormalized, each
    expert W_down(silu(W_gate h) * W_up h) -- not HF's sparsemixer."""
    m = engine(NAME).model
    e, c = m.moe[0], m.cfg
    E, F, D = c.n_experts, c.ffn, c.d_model
    torch.manual_seed(11)        # second and third choices apart by >= 0.06 in every row: no near-ties
    h = torch.randn(6, D)
    gate = e.gate_exps.dense.double().view(E, F, D)
    up = e.up_exps.dense.double().view(E, F, D)
    down = e.down_exps.dense.double().view(E, D, F)
    p = torch.softmax(h.double() @ e.gate_inp.double().T, -1)
    w, idx = torch.topk(p, 2, dim=-1)
    w = w / w.sum(-1, keepdim=True)
    want = torch.zeros(6, D, dtype=torch.float64)
    for t in range(6):
        for j in range(2):
            x = idx[t, j]
            z = torch.nn.functional.silu(gate[x] @ h[t].double()) * (up[x] @ h[t].double())
            want[t] += w[t, j] * (down[x] @ z)
    got = m.ffn(h, e, None).double()
    err = ((got - want).abs().max() / want.abs().max()).item()
    assert err < 1e-5, err


@pytest.mark.parametrize("what", ["layer_norm", "no_renorm", "no_norm_bias", "no_output_bias", "no_qkv_bias",
                                  "adjacent_pairs"])
def test_each_rule_is_needed(monkeypatch, what):
    eng = engine(NAME)
    m = eng.model
    if what == "layer_norm":     # HF's nn.LayerNorm instead of llama.cpp's RMSNorm + bias
        monkeypatch.setattr(m, "norm", lambda x, w, b: torch.nn.functional.layer_norm(
            x, (x.shape[-1],), w, b, m.cfg.rms_eps).to(m.act_dtype))
    elif what == "no_renorm":
        m.weights_norm = False
    elif what == "no_norm_bias":
        for b in m.blocks:
            b.attn_norm_b = torch.zeros_like(b.attn_norm_b)
            b.ffn_norm_b = torch.zeros_like(b.ffn_norm_b)
    elif what == "no_output_bias":
        m.output_b = None
    elif what == "no_qkv_bias":
        for b in m.blocks:
            b.attn_q_bias = b.attn_k_bias = b.attn_v_bias = None
    else:
        from dataclasses import replace
        m.cfg = replace(m.cfg, rope=replace(m.cfg.rope, style="normal"))
    assert miss(eng) > 10 * TOL


@pytest.mark.parametrize("tensor", ["output.bias", "output_norm.bias", "blk.1.attn_norm.bias", "blk.0.ffn_norm.bias",
                                    "blk.1.attn_output.bias", "blk.0.ffn_gate_inp.weight",
                                    "blk.1.ffn_down_exps.weight"])
def test_missing_tensor_is_named(tmp_path, tensor):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_tensors=(tensor,))
    with pytest.raises(MinferError, match=tensor.replace(".", r"\.")):
        load(p)


@pytest.mark.parametrize("key", ["phimoe.expert_count", "phimoe.expert_used_count"])
def test_missing_key_is_named(tmp_path, key):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_keys=(key,))
    with pytest.raises(MinferError, match=key.replace(".", r"\.")):
        load(p)


def test_expert_weights_scale_refused(tmp_path):
    import gguf

    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf",
                set_keys={"phimoe.expert_weights_scale": (2.0, gguf.GGUFValueType.FLOAT32)})
    with pytest.raises(MinferError, match=r"phimoe\.expert_weights_scale"):
        load(p)


def test_fused_qkv_refused(tmp_path):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf",
                add_tensors={"blk.0.attn_qkv.weight": np.zeros((128, 64), np.float32)})
    with pytest.raises(MinferError, match=r"blk\.0\.attn_qkv\.weight"):
        load(p)


def test_long_rope_factors_past_the_original_context():
    """phi3's rule (Phi3Model.rope_for): short factors within original_context_length, long past it."""
    from dataclasses import replace
    from types import SimpleNamespace

    m = engine(NAME).model
    short, long_ = m.cfg.rope, replace(m.cfg.rope, freq_factors=torch.ones(8))
    m.cfg = replace(m.cfg, rope_long=long_, rope_orig_ctx=32)
    assert m.rope_for(SimpleNamespace(context=32)) is m.cfg.rope
    assert m.rope_for(SimpleNamespace(context=33)) is long_
    with pytest.raises(MinferError, match="context"):
        m.rope_for(SimpleNamespace())
    assert short is m.cfg.rope
