"""OLMo 3 (Olmo3ForCausalLM), which llama.cpp's converter writes as `olmo2` (conversion/olmo.py Olmo2Model) with
the window keys, and its long-context YaRN on the full-attention layers only (minfer/models/olmo2.py). The
logits, greedy continuation, KV cache in pieces and paged cache are test_arch_vs_transformers' (names "olmo3",
"olmo3-yarn"). Fixtures: tests/data/arch/olmo3*.gguf (tools/gen_arch_fixtures.py: transformers 5.25's
Olmo3ForCausalLM converted by llama.cpp's convert_hf_to_gguf.py)."""

from __future__ import annotations

import json
import math

import gguf
import pytest

from models.arch_checks import assert_refused
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite


def miss(eng, name: str) -> float:
    r = ref(name)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def test_yarn_read_from_the_file():
    """HF's rope_parameters: YaRN (factor 8) for full_attention, default for sliding_attention; the file: the
    full-attention entry as rope.scaling.*; the model: YaRN divisors and mscale^2 on the global layer only."""
    hf = json.loads((DATA / "olmo3-yarn.json").read_text())["config"]["rope_parameters"]
    assert hf["full_attention"]["rope_type"] == "yarn" and hf["sliding_attention"]["rope_type"] == "default"
    m = engine("olmo3-yarn").model
    assert m.is_local == (True, True, True, False)
    assert all(r.freq_factors is None and r.freq_scale == 1.0 for r in m.layer_rope[:3])
    assert m.layer_rope[3].freq_factors is not None and max(m.layer_rope[3].freq_factors) == pytest.approx(8.0)
    assert m.q_scale == pytest.approx((1 + 0.1 * math.log(8)) ** 2)
    assert engine("olmo3").model.q_scale == 1.0 and engine("olmo2").model.q_scale == 1.0


@pytest.mark.parametrize("what", ["no_mscale", "no_yarn_frequencies", "yarn_on_window_layers", "mscale_on_window"])
def test_each_yarn_rule_is_needed(monkeypatch, what):
    eng = engine("olmo3-yarn")
    m = eng.model
    assert miss(eng, "olmo3-yarn") < TOL
    if what == "no_mscale":
        monkeypatch.setattr(m, "q_scale", 1.0)
    elif what == "no_yarn_frequencies":
        monkeypatch.setattr(m, "layer_rope", [m.layer_rope[0]] * 4)
    elif what == "yarn_on_window_layers":
        monkeypatch.setattr(m, "layer_rope", [m.layer_rope[3]] * 4)
    else:                                   # the global layer's mscale^2 on every layer
        monkeypatch.setattr(m, "is_local", (False,) * 4)
        monkeypatch.setattr(m, "window", 0)
        monkeypatch.setattr(m, "layer_rope", [m.layer_rope[0]] * 3 + [m.layer_rope[3]])
    assert miss(eng, "olmo3-yarn") > 10 * TOL, what


def test_attn_factor_key_scales_mscale(tmp_path):
    """rope.scaling.attn_factor multiplies the mscale (llama_context: yarn_attn_factor *= rope_attn_factor)."""
    p = rewrite(DATA / "olmo3-yarn.gguf", tmp_path / "x.gguf",
                set_keys={"olmo2.rope.scaling.attn_factor": (1.5, gguf.GGUFValueType.FLOAT32)})
    assert load(p).q_scale == pytest.approx(((1 + 0.1 * math.log(8)) * 1.5) ** 2)


def test_missing_yarn_key_is_named(tmp_path):
    key = "olmo2.rope.scaling.original_context_length"
    assert_refused("olmo3-yarn", tmp_path, dict(drop_keys=(key,)), key)
