"""Microsoft Phi-2 (minfer/models/phi2.py) against transformers, on the CPU's float32 reference: each
rule of the graph needed (with one changed the logits miss by more than 10x the tolerance), the fused
attn_qkv form of older conversions equal to the separate one, what the model needs refused by name
when missing. The logits, greedy continuation, KV cache in pieces and paged cache are
test_arch_vs_transformers' (name "phi2"). Fixture: tests/data/arch/phi2.gguf (tools/gen_arch_fixtures.py:
transformers' PhiForCausalLM, partial rotary 0.5, biases drawn around 0, converted by llama.cpp's
convert_hf_to_gguf.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, reference_switches, rewrite

NAME = "phi2"
BASE_ERR = 6.2e-7      # the fixture's float32 miss


def miss(eng) -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def test_layout_read_from_the_file():
    m = engine(NAME).model
    c = m.cfg
    assert (c.head_dim, c.n_heads, c.n_kv_heads, c.d_model, c.ffn) == (16, 4, 4, 64, 256)
    assert c.rope.style == "neox" and c.rope.n_rot == 8 and c.rope.theta == 10000.0
    assert not c.tied_output and m.output_b.shape == (c.vocab,)
    b = m.blocks[0]
    assert b.ffn_norm is None and b.attn_qkv is None and b.attn_q_bias.shape == (64,)


@pytest.mark.parametrize("what", ["adjacent_pairs", "full_rotation", "sequential", "no_output_bias",
                                  "no_qkv_bias", "no_norm_bias", "gelu_erf"])
def test_each_rule_is_needed(monkeypatch, what):
    import torch.nn.functional as F

    from minfer.models import phi2

    eng = engine(NAME)
    m = eng.model
    assert miss(eng) < TOL
    if what == "adjacent_pairs":                 # NORM instead of NEOX
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, style="normal"))    # (this engine's own cfg)
    elif what == "full_rotation":                # every dim of the head rotated
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, n_rot=m.cfg.head_dim))
    elif what == "sequential":                   # the MLP after the attention's residual add, on its LayerNorm
        def forward(tokens, step, cache, ctx=None):
            eps, act = m.cfg.rms_eps, m.act_dtype
            from minfer import ops
            x = ops.embedding(tokens, m.token_embd)
            for i, blk in enumerate(m.blocks):
                x = x + m.attention(phi2.layer_norm(x, blk.attn_norm, blk.attn_norm_b, eps, act), blk, i, cache,
                                    step, ctx).float()
                x = x + m.mlp(phi2.layer_norm(x, blk.attn_norm, blk.attn_norm_b, eps, act), blk, ctx).float()
            h = phi2.layer_norm(step.rows(x), m.output_norm, m.output_norm_b, eps, act)
            return ops.linear(h, m.output, m.output_b, ctx, out_dtype=torch.float32)
        monkeypatch.setattr(m, "forward", forward)
    elif what == "no_output_bias":
        monkeypatch.setattr(m, "output_b", torch.zeros_like(m.output_b))
    elif what == "no_qkv_bias":
        for b in m.blocks:
            for k in ("attn_q_bias", "attn_k_bias", "attn_v_bias"):
                monkeypatch.setattr(b, k, None)
    elif what == "no_norm_bias":
        for b in m.blocks:
            monkeypatch.setattr(b, "attn_norm_b", torch.zeros_like(b.attn_norm_b))
    else:                                        # GELU without the tanh approximation
        monkeypatch.setattr(phi2.Starcoder2Model, "mlp", lambda self, h, blk, ctx: phi2.ops.linear(
            F.gelu(phi2.ops.linear(h, blk.ffn_up, blk.ffn_up_b, ctx).float()).to(h.dtype), blk.ffn_down,
            blk.ffn_down_b, ctx))
    err = miss(eng)
    assert err > (100 * BASE_ERR if what == "gelu_erf" else 10 * TOL), (what, err)


def fused_file(tmp_path, with_bias: bool = True):
    """The fixture with each layer's q/k/v as one attn_qkv (rows q, k, v) and, with_bias, attn_qkv.bias."""
    import gguf

    rd = gguf.GGUFReader(str(DATA / "phi2.gguf"))
    t = {x.name: np.asarray(x.data, dtype=np.float32) for x in rd.tensors}
    drop, add = [], {}
    for i in range(2):
        p = f"blk.{i}."
        drop += [p + f"attn_{x}.{k}" for x in "qkv" for k in ("weight", "bias")]
        add[p + "attn_qkv.weight"] = np.concatenate([t[p + f"attn_{x}.weight"] for x in "qkv"])
        if with_bias:
            add[p + "attn_qkv.bias"] = np.concatenate([t[p + f"attn_{x}.bias"] for x in "qkv"])
        else:
            drop = [d for d in drop if not d.endswith(".bias")]
    return rewrite(DATA / "phi2.gguf", tmp_path / "fused.gguf", drop_tensors=tuple(drop), add_tensors=add)


@pytest.mark.parametrize("with_bias", [True, False])
def test_fused_qkv_equals_separate(tmp_path, with_bias):
    """Older phi-2 conversions carry attn_qkv (with attn_qkv.bias, or the separate q/k/v biases: llama.cpp
    create_tensor_qkv takes either); the same weights give transformers' logits, in pieces too."""
    from minfer.runtime.engine import Engine

    eng = Engine.load(fused_file(tmp_path, with_bias), ctx=64, progress=False, switches=reference_switches())
    assert eng.model.blocks[0].attn_qkv is not None and eng.model.blocks[0].attn_q is None
    assert miss(eng) < 10 * BASE_ERR
    r = ref(NAME)
    ids = r["ids"].tolist()
    got = np.concatenate([eng.forward(ids[a:b], a).numpy() for a, b in ((0, 7), (7, 8), (8, len(ids)))])
    assert rel_err(got, r["logits"]) < TOL


@pytest.mark.parametrize("key", ["phi2.attention.layer_norm_epsilon", "phi2.block_count",
                                 "phi2.feed_forward_length", "phi2.attention.head_count"])
def test_missing_key_is_named(tmp_path, key):
    p = rewrite(DATA / "phi2.gguf", tmp_path / "x.gguf", drop_keys=(key,))
    with pytest.raises(MinferError, match=key.replace(".", r"\.")):
        load(p)


@pytest.mark.parametrize("tensor", ["output.weight", "output.bias", "output_norm.bias", "blk.1.attn_norm.bias",
                                    "blk.0.attn_output.bias", "blk.1.ffn_up.bias", "blk.0.ffn_down.bias",
                                    "blk.1.attn_k.weight"])
def test_missing_tensor_is_named(tmp_path, tensor):
    p = rewrite(DATA / "phi2.gguf", tmp_path / "x.gguf", drop_tensors=(tensor,))
    with pytest.raises(MinferError, match=tensor.replace(".", r"\.")):
        load(p)
