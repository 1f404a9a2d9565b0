"""stablelm (StableLM 2 1.6B / 12B, StableLM-3B-4E1T): each rule needed against transformers, and malformed
files refused by name.

Fixtures (tools/arch_fixture_configs_b.py): stablelm (q/k/v biases, rope on half of each head, sequential
residual) and stablelm-12b (per-head q/k LayerNorms, the parallel residual, rope on a quarter of each head);
test_arch_vs_transformers runs their logits, greedy, pieces and the batch engine."""

from __future__ import annotations

from dataclasses import replace

import gguf
import pytest

from minfer import ops
from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite


def logits_err(eng, name: str) -> float:
    r = ref(name)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def test_stablelm_fixtures_cover_both_layouts():
    a, b = engine("stablelm").model, engine("stablelm-12b").model
    assert a.cfg.rope.n_rot == 8 and b.cfg.rope.n_rot == 4 and a.cfg.head_dim == b.cfg.head_dim == 16
    assert all(blk.ffn_norm is not None and blk.attn_q_bias is not None and blk.attn_q_norm is None
               for blk in a.blocks)
    assert all(blk.ffn_norm is None and blk.attn_q_bias is None and tuple(blk.attn_q_norm.shape) == (4, 16)
               and tuple(blk.attn_k_norm.shape) == (2, 16) for blk in b.blocks)


@pytest.mark.parametrize("name,what", [
    ("stablelm", "full_rope"), ("stablelm", "adjacent_pairs"), ("stablelm", "no_qkv_bias"),
    ("stablelm", "no_norm_bias"), ("stablelm", "no_ffn_norm_bias"), ("stablelm", "rms_norm"),
    ("stablelm-12b", "no_qk_norm"), ("stablelm-12b", "qk_norm_one_weight"), ("stablelm-12b", "sequential"),
    ("stablelm-12b", "full_rope")])
def test_stablelm_each_rule_is_needed(monkeypatch, name, what):
    """Partial NEOX rope, the q/k/v biases, the LayerNorms' biases and mean removal, the per-head q/k norms
    (and each head its own weight), the parallel residual: with any one changed the logits miss
    transformers' by far."""
    eng = engine(name)
    m = eng.model
    assert logits_err(eng, name) < TOL
    if what == "full_rope":
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, n_rot=m.cfg.head_dim))
    elif what == "adjacent_pairs":
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, style="normal"))
    elif what == "rms_norm":
        monkeypatch.setattr(ops, "layer_norm", lambda x, w, eps, out_dtype=None: ops.rms_norm(x.float(), w, eps)
                            .to(out_dtype or x.dtype))
    for blk in m.blocks:
        if what == "no_qkv_bias":
            blk.attn_q_bias = blk.attn_k_bias = blk.attn_v_bias = None
        elif what == "no_norm_bias":
            blk.attn_norm_b = blk.attn_norm_b * 0
        elif what == "no_ffn_norm_bias":
            blk.ffn_norm_b = None
        elif what == "no_qk_norm":
            blk.attn_q_norm = blk.attn_k_norm = None
        elif what == "qk_norm_one_weight":
            blk.attn_q_norm, blk.attn_k_norm = blk.attn_q_norm[0], blk.attn_k_norm[0]
        elif what == "sequential":       # the MLP on a norm of x + a (the attention norm's weights) instead
            blk.ffn_norm, blk.ffn_norm_b = blk.attn_norm, blk.attn_norm_b
    assert logits_err(eng, name) > 10 * TOL


@pytest.mark.parametrize("name,kw,match", [
    ("stablelm", dict(add_tensors={"blk.1.attn_output.bias": [0.0] * 64}), "blk.1.attn_output.bias"),
    ("stablelm", dict(drop_tensors=("output.weight",)), "output.weight"),
    ("stablelm", dict(drop_tensors=("output_norm.bias",)), "output_norm.bias"),
    ("stablelm", dict(drop_tensors=("blk.0.attn_norm.bias",)), "blk.0.attn_norm.bias"),
    ("stablelm", dict(drop_tensors=("blk.1.ffn_norm.weight", "blk.1.ffn_norm.bias")), "blk.1.ffn_norm.weight"),
    ("stablelm", dict(drop_tensors=("blk.1.ffn_norm.weight",)), "blk.1.ffn_norm.bias"),
    ("stablelm", dict(drop_keys=("stablelm.attention.layer_norm_epsilon",)), "stablelm.attention.layer_norm_epsilon"),
    ("stablelm-12b", dict(drop_tensors=("blk.0.attn_k_norm.weight",)), "blk.0.attn_k_norm.weight"),
    ("stablelm-12b", dict(drop_tensors=("blk.1.attn_q_norm.weight", "blk.1.attn_k_norm.weight")),
     "blk.1.attn_q_norm.weight"),
    ("stablelm-12b", dict(drop_tensors=("blk.1.ffn_up.weight",)), "blk.1.ffn_up.weight"),
])
def test_stablelm_bad_input_is_named(tmp_path, name, kw, match):
    p = rewrite(DATA / f"{name}.gguf", tmp_path / "x.gguf", **kw)
    with pytest.raises(MinferError, match=match.replace(".", r"\.")):
        load(p)


def test_stablelm_parallel_residual_key_not_read(tmp_path):
    """llama.cpp decides the parallel residual by ffn_norm's presence, not stablelm.use_parallel_residual."""
    p = rewrite(DATA / "stablelm.gguf", tmp_path / "x.gguf",
                set_keys={"stablelm.use_parallel_residual": (True, gguf.GGUFValueType.BOOL)})
    assert all(blk.ffn_norm is not None for blk in load(p).blocks)
