"""olmo (OLMo 1): each rule needed against transformers, and malformed files refused by name.

The fixture (tests/data/arch/olmo.gguf, tools/arch_fixture_configs_b.py) has clip_qkv 2.0, which clips
about a fifth of the q/k/v values; test_arch_vs_transformers runs its logits, greedy, pieces and the
batch engine."""

from __future__ import annotations

from dataclasses import replace

import gguf
import pytest
import torch

from minfer import ops
from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite


def logits_err(eng) -> float:
    r = ref("olmo")
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


@pytest.mark.parametrize("what", ["no_clip", "neox", "rms_norm", "eps"])
def test_olmo_each_rule_is_needed(monkeypatch, what):
    """The q/k/v clamp, NORM rope (adjacent pairs: the converter's permutation), the LayerNorm's mean
    removal and its eps of 1e-5 (the last is small: one order of magnitude less is still within TOL on this
    fixture, so eps 1 is used): with any one changed the logits miss transformers' by far."""
    eng = engine("olmo")
    m = eng.model
    assert m.clip == 2.0 and m.cfg.rms_eps == pytest.approx(1e-5)
    assert logits_err(eng) < TOL
    if what == "no_clip":
        m.clip = 0.0
    elif what == "neox":
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, style="neox"))
    elif what == "rms_norm":
        monkeypatch.setattr(ops, "layer_norm", lambda x, w, eps, out_dtype=None: ops.rms_norm(x.float(), w, eps)
                            .to(out_dtype or x.dtype))
    else:
        object.__setattr__(m.cfg, "rms_eps", 1.0)
    assert logits_err(eng) > 10 * TOL


def test_olmo_norms_have_no_weight():
    """No norm tensors in the file (llama.cpp's loader creates none); the model's are ones."""
    from minfer.gguf_file import GGUFFile

    gf = GGUFFile(DATA / "olmo.gguf")
    assert not [n for n in gf.tensors if "norm" in n]
    m = engine("olmo").model
    assert all(torch.equal(v, torch.ones_like(v)) for b in m.blocks for v in (b.attn_norm, b.ffn_norm))
    assert torch.equal(m.output_norm, torch.ones_like(m.output_norm))


def test_olmo_clamp_key_absent_or_zero_is_no_clamp(tmp_path):
    """Without olmo.attention.clamp_kqv (OLMo-1B, OLMo-7B) or with 0 (llama.cpp: > 0 only) no clamp."""
    for kw in (dict(drop_keys=("olmo.attention.clamp_kqv",)),
               dict(set_keys={"olmo.attention.clamp_kqv": (0.0, gguf.GGUFValueType.FLOAT32)})):
        p = rewrite(DATA / "olmo.gguf", tmp_path / "x.gguf", **kw)
        assert load(p).clip == 0.0


@pytest.mark.parametrize("kw,match", [
    (dict(add_tensors={"blk.0.attn_q.bias": [0.0] * 64}), "blk.0.attn_q.bias"),
    (dict(add_tensors={"blk.1.attn_output.bias": [0.0] * 64}), "blk.1.attn_output.bias"),
    (dict(set_keys={"olmo.rope.dimension_count": (8, gguf.GGUFValueType.UINT32)}), "olmo.rope.dimension_count"),
    (dict(set_keys={"olmo.attention.clamp_kqv": ("8", gguf.GGUFValueType.STRING)}), "olmo.attention.clamp_kqv"),
    (dict(drop_keys=("olmo.attention.layer_norm_epsilon",)), "olmo.attention.layer_norm_epsilon"),
    (dict(drop_tensors=("blk.1.ffn_gate.weight",)), "blk.1.ffn_gate.weight"),
    (dict(drop_tensors=("blk.0.attn_v.weight",)), "blk.0.attn_v.weight"),
])
def test_olmo_bad_input_is_named(tmp_path, kw, match):
    p = rewrite(DATA / "olmo.gguf", tmp_path / "x.gguf", **kw)
    with pytest.raises(MinferError, match=match.replace(".", r"\.")):
        load(p)
