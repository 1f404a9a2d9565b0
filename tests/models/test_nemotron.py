"""nemotron (Nemotron-4 / Minitron): each rule needed against transformers, and malformed files refused by name.

Fixtures (tools/arch_fixture_configs_b.py): nemotron (no biases, rope on half of each head, the releases' form)
and nemotron-bias (q/k/v/o and up/down biases, rope on a quarter); test_arch_vs_transformers runs their logits,
greedy, pieces and the batch engine."""

from __future__ import annotations

from dataclasses import replace

import pytest

from minfer import ops
from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite


def logits_err(eng, name: str) -> float:
    r = ref(name)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def test_nemotron_fixtures():
    a, b = engine("nemotron").model, engine("nemotron-bias").model
    assert a.cfg.rope.n_rot == 8 and b.cfg.rope.n_rot == 4 and a.cfg.head_dim == 16
    assert all(blk.attn_q_bias is None and blk.attn_output_b is None and blk.ffn_up_b is None for blk in a.blocks)
    assert all(blk.attn_q_bias is not None and blk.attn_output_b is not None and blk.ffn_up_b is not None
               and blk.ffn_down_b is not None for blk in b.blocks)


@pytest.mark.parametrize("name,what", [
    ("nemotron", "full_rope"), ("nemotron", "adjacent_pairs"), ("nemotron", "relu"), ("nemotron", "norm_weight_1p"),
    ("nemotron", "no_norm_bias"), ("nemotron", "rms_norm"),
    ("nemotron-bias", "no_qkv_bias"), ("nemotron-bias", "no_o_bias"), ("nemotron-bias", "no_mlp_bias"),
    ("nemotron-bias", "full_rope")])
def test_nemotron_each_rule_is_needed(monkeypatch, name, what):
    """Partial NEOX rope, the square of the ReLU, the file's norm weights as they are (the converter's + 1
    already in them: adding 1 again misses), the norms' biases and mean removal, each bias: with any one
    changed the logits miss transformers' by far."""
    import minfer.models.nemotron as nm

    eng = engine(name)
    m = eng.model
    assert logits_err(eng, name) < TOL
    if what == "full_rope":
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, n_rot=m.cfg.head_dim))
    elif what == "adjacent_pairs":
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, style="normal"))
    elif what == "relu":
        monkeypatch.setattr(nm, "relu2", lambda u: u.relu())
    elif what == "rms_norm":
        monkeypatch.setattr(ops, "layer_norm", lambda x, w, eps, out_dtype=None: ops.rms_norm(x.float(), w, eps)
                            .to(out_dtype or x.dtype))
    for blk in m.blocks:
        if what == "norm_weight_1p":
            blk.attn_norm, blk.ffn_norm = blk.attn_norm + 1, blk.ffn_norm + 1
        elif what == "no_norm_bias":
            blk.attn_norm_b, blk.ffn_norm_b = blk.attn_norm_b * 0, blk.ffn_norm_b * 0
        elif what == "no_qkv_bias":
            blk.attn_q_bias = blk.attn_k_bias = blk.attn_v_bias = None
        elif what == "no_o_bias":
            blk.attn_output_b = None
        elif what == "no_mlp_bias":
            blk.ffn_up_b = blk.ffn_down_b = None
    assert logits_err(eng, name) > 10 * TOL


@pytest.mark.parametrize("name,kw,match", [
    ("nemotron", dict(drop_tensors=("output.weight",)), "output.weight"),
    ("nemotron", dict(drop_tensors=("output_norm.bias",)), "output_norm.bias"),
    ("nemotron", dict(drop_tensors=("blk.1.ffn_norm.bias",)), "blk.1.ffn_norm.bias"),
    ("nemotron", dict(drop_tensors=("blk.0.attn_norm.weight",)), "blk.0.attn_norm.weight"),
    ("nemotron", dict(add_tensors={"blk.0.ffn_gate.weight": [[0.0] * 64] * 96}), "blk.0.ffn_gate.weight"),
    ("nemotron", dict(drop_keys=("nemotron.attention.layer_norm_epsilon",)), "nemotron.attention.layer_norm_epsilon"),
    ("nemotron-bias", dict(drop_tensors=("blk.1.ffn_up.weight",)), "blk.1.ffn_up.weight"),
])
def test_nemotron_bad_input_is_named(tmp_path, name, kw, match):
    p = rewrite(DATA / f"{name}.gguf", tmp_path / "x.gguf", **kw)
    with pytest.raises(MinferError, match=match.replace(".", r"\.")):
        load(p)
