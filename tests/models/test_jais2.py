"""jais2 (Jais-2: minfer/models/jais2.py): each rule needed against transformers, absent optional tensors as
llama.cpp takes them, malformed files refused by name.

Fixture (tools/arch_fixture_configs_b.py "jais2"): LayerNorms with bias, every bias (q/k/v/o, up/down), NEOX
rope over the whole head, GQA, untied head; test_arch_vs_transformers runs its logits, greedy, pieces and the
batch engine."""

from __future__ import annotations

from dataclasses import replace

import gguf
import numpy as np
import pytest

from minfer import ops
from models.arch_checks import assert_refused
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

NAME = "jais2"


def logits_err(eng) -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def test_layout_read_from_the_file():
    m = engine(NAME).model
    c = m.cfg
    assert (c.head_dim, c.n_heads, c.n_kv_heads, c.d_model, c.ffn, c.n_layers) == (16, 4, 2, 64, 128, 2)
    assert c.rope.style == "neox" and c.rope.n_rot == 16 and m.window == 0 and not c.tied_output
    assert all(b.attn_q_bias is not None and b.attn_output_b is not None and b.ffn_up_b is not None
               and b.ffn_down_b is not None and b.ffn_gate is None for b in m.blocks)
    assert m.output_norm_b.shape == (64,)


@pytest.mark.parametrize("what", ["partial_rope", "adjacent_pairs", "relu", "rms_norm", "no_norm_bias",
                                  "no_qkv_bias", "no_o_bias", "no_mlp_bias", "no_output_norm_bias"])
def test_each_rule_is_needed(monkeypatch, what):
    """NEOX rope over the whole head, the square of the ReLU, LayerNorm's mean removal and biases, each
    linear bias: with any one changed the logits miss transformers' by > 10x the tolerance."""
    import minfer.models.nemotron as nm

    eng = engine(NAME)
    m = eng.model
    assert logits_err(eng) < TOL
    if what == "partial_rope":
        m.cfg = replace(m.cfg, rope=replace(m.cfg.rope, n_rot=m.cfg.head_dim // 2))
    elif what == "adjacent_pairs":
        m.cfg = replace(m.cfg, rope=replace(m.cfg.rope, style="normal"))
    elif what == "relu":
        monkeypatch.setattr(nm, "relu2", lambda u: u.relu())
    elif what == "rms_norm":
        monkeypatch.setattr(ops, "layer_norm", lambda x, w, eps, out_dtype=None: ops.rms_norm(x.float(), w, eps)
                            .to(out_dtype or x.dtype))
    elif what == "no_output_norm_bias":
        m.output_norm_b = m.output_norm_b * 0
    for blk in m.blocks:
        if what == "no_norm_bias":
            blk.attn_norm_b, blk.ffn_norm_b = blk.attn_norm_b * 0, blk.ffn_norm_b * 0
        elif what == "no_qkv_bias":
            blk.attn_q_bias = blk.attn_k_bias = blk.attn_v_bias = None
        elif what == "no_o_bias":
            blk.attn_output_b = None
        elif what == "no_mlp_bias":
            blk.ffn_up_b = blk.ffn_down_b = None
    assert logits_err(eng) > 10 * TOL, what


def test_optional_tensors_as_llamacpp(tmp_path):
    """No output.weight: the embedding is the head (TENSOR_NOT_REQUIRED); no q/k/v biases: none
    (create_tensor_qkv's TENSOR_NOT_REQUIRED)."""
    m = load(rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_tensors=("output.weight",)))
    assert m.cfg.tied_output and m.output is m.token_embd
    drop = tuple(f"blk.{i}.attn_{x}.bias" for i in range(2) for x in "qkv")
    m = load(rewrite(DATA / f"{NAME}.gguf", tmp_path / "y.gguf", drop_tensors=drop))
    assert all(b.attn_q_bias is None and b.attn_k_bias is None and b.attn_v_bias is None for b in m.blocks)


@pytest.mark.parametrize("kw,match", [
    (dict(drop_tensors=("blk.0.attn_output.bias",)), "blk.0.attn_output.bias"),
    (dict(drop_tensors=("blk.1.ffn_up.bias",)), "blk.1.ffn_up.bias"),
    (dict(drop_tensors=("blk.0.ffn_down.bias",)), "blk.0.ffn_down.bias"),
    (dict(drop_tensors=("output_norm.bias",)), "output_norm.bias"),
    (dict(drop_tensors=("blk.1.ffn_norm.bias",)), "blk.1.ffn_norm.bias"),
    (dict(drop_tensors=("blk.0.attn_norm.bias",)), "blk.0.attn_norm.bias"),
    (dict(drop_tensors=("blk.1.attn_k.weight",)), "blk.1.attn_k.weight"),
    (dict(add_tensors={"blk.0.ffn_gate.weight": np.zeros((128, 64), np.float32)}), "blk.0.ffn_gate.weight"),
    (dict(add_tensors={"blk.1.attn_qkv.weight": np.zeros((128, 64), np.float32)}), "blk.1.attn_qkv.weight"),
    (dict(drop_keys=("jais2.attention.layer_norm_epsilon",)), "jais2.attention.layer_norm_epsilon"),
    (dict(set_keys={"jais2.rope.dimension_count": (8, gguf.GGUFValueType.UINT32)}), "jais2.rope.dimension_count"),
])
def test_bad_input_is_named(tmp_path, kw, match):
    assert_refused(NAME, tmp_path, kw, match)
