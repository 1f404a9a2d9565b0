"""ByteDance Seed-OSS (minfer/models/seed_oss.py) against transformers, on the CPU's float32
reference: the logits at every position, the greedy continuation, the KV cache in pieces; each rule
of the graph needed (with one changed the logits miss by more than 10x the tolerance); what the model
does not run refused by name. Fixture: tests/data/arch/seed_oss.gguf (tools/gen_arch_fixtures.py:
transformers' SeedOssForCausalLM with q/k/v biases and head_dim 24 != 64 / 4, converted by llama.cpp's
convert_hf_to_gguf.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

NAME = "seed_oss"


def miss(eng) -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def test_layout_read_from_the_file():
    m = engine(NAME).model
    c = m.cfg
    assert (c.head_dim, c.n_heads * c.head_dim, c.d_model) == (24, 96, 64)
    assert c.rope.style == "neox" and c.rope.theta == 1e7
    b = m.blocks[0]
    assert b.attn_q_bias.shape == (96,) and b.attn_k_bias.shape == (48,) and b.attn_v_bias.shape == (48,)


@pytest.mark.parametrize("what", ["adjacent_pairs", "no_qkv_bias", "no_k_bias", "ffn_norm_weight",
                                  "ffn_norm_on_attention_output"])
def test_each_rule_is_needed(monkeypatch, what):
    from minfer import ops
    from minfer.models import layers

    eng = engine(NAME)
    m = eng.model
    assert miss(eng) < TOL
    if what == "adjacent_pairs":                 # NORM instead of NEOX
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, style="normal"))    # (this engine's own cfg)
    elif what == "no_qkv_bias":
        for b in m.blocks:
            monkeypatch.setattr(b, "attn_q_bias", None)
            monkeypatch.setattr(b, "attn_k_bias", None)
            monkeypatch.setattr(b, "attn_v_bias", None)
    elif what == "no_k_bias":                    # (a k bias only shifts scores per query unless rope mixes it)
        for b in m.blocks:
            monkeypatch.setattr(b, "attn_k_bias", None)
    elif what == "ffn_norm_weight":              # post_attention_norm's weight not applied
        for b in m.blocks:
            monkeypatch.setattr(b, "ffn_norm", torch.ones_like(b.ffn_norm))
    else:                                        # post_attention_norm read as a norm of the attention's output
        real = ops.linear_add_rms_norm
        ffn_norms = {id(b.ffn_norm) for b in m.blocks}

        def post_norm_residual(a, w, x, g, eps, out_dtype, ctx=None, **kw):
            if id(g) not in ffn_norms:
                return real(a, w, x, g, eps, out_dtype, ctx, **kw)
            y = x + ops.rms_norm(ops.linear(a, w, None, ctx).float(), g, eps)
            return y, ops.rms_norm(y, torch.ones_like(g), eps).to(out_dtype)
        monkeypatch.setattr(layers.ops, "linear_add_rms_norm", post_norm_residual)
    assert miss(eng) > 10 * TOL


def test_file_without_biases_runs_without_them(tmp_path):
    """The q/k/v biases are optional (llama.cpp create_tensor_qkv: TENSOR_NOT_REQUIRED): a file
    without them loads, runs the bias-free graph, and misses this fixture's transformers logits."""
    drop = tuple(f"blk.{i}.attn_{x}.bias" for i in range(2) for x in "qkv")
    from minfer.runtime.engine import Engine
    from models.test_arch_vs_transformers import reference_switches

    eng = Engine.load(rewrite(DATA / "seed_oss.gguf", tmp_path / "x.gguf", drop_tensors=drop), ctx=64,
                      progress=False, switches=reference_switches())
    assert all(b.attn_q_bias is None and b.attn_v_bias is None for b in eng.model.blocks)
    assert miss(eng) > 10 * TOL


@pytest.mark.parametrize("key", ["seed_oss.attention.layer_norm_rms_epsilon", "seed_oss.block_count",
                                 "seed_oss.feed_forward_length"])
def test_missing_key_is_named(tmp_path, key):
    p = rewrite(DATA / "seed_oss.gguf", tmp_path / "x.gguf", drop_keys=(key,))
    with pytest.raises(MinferError, match=key.replace(".", r"\.")):
        load(p)


@pytest.mark.parametrize("tensor", ["blk.1.post_attention_norm.weight", "blk.0.attn_norm.weight",
                                    "blk.1.ffn_gate.weight", "output_norm.weight"])
def test_missing_tensor_is_named(tmp_path, tensor):
    p = rewrite(DATA / "seed_oss.gguf", tmp_path / "x.gguf", drop_tensors=(tensor,))
    with pytest.raises(MinferError, match=tensor.replace(".", r"\.")):
        load(p)


@pytest.mark.parametrize("tensor,n", [("blk.1.attn_output.bias", 64), ("blk.0.ffn_up.bias", 96)])
def test_biases_it_does_not_run_are_refused_by_name(tmp_path, tensor, n):
    """HF attention_out_bias / mlp_bias would write these; llama.cpp's graph has none."""
    p = rewrite(DATA / "seed_oss.gguf", tmp_path / "x.gguf", add_tensors={tensor: np.zeros(n)})
    with pytest.raises(MinferError, match=tensor.replace(".", r"\.")):
        load(p)
