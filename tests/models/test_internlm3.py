"""InternLM3 (InternLM3ForCausalLM), which llama.cpp's converter writes as the arch `llama` (conversion/internlm.py
InternLM3Model: q/k permuted as Llama's), on the CPU's float32 reference; and the llama graph's optional bias
tensors (minfer/models/llama_bias.py), which an InternLM3 with qkv_bias = bias = true carries. The logits, greedy
continuation, KV cache in pieces and paged cache are test_arch_vs_transformers' (names "internlm3",
"internlm3-bias"). Fixtures: tests/data/arch/internlm3*.gguf (tools/gen_arch_fixtures.py: transformers 5.25's
InternLM3 config run as its LlamaForCausalLM, converted by llama.cpp's convert_hf_to_gguf.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from minfer.models.llama import LlamaModel
from minfer.models.llama_bias import BIASES, LlamaBiasModel
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite


def miss(eng, name: str) -> float:
    r = ref(name)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def test_released_form_is_the_llama_graph():
    """The file: arch llama, head_dim 24 (key_length) != 64 / 4 rotated whole, one kv head, the release's base 5e7,
    no rope scaling key (the converter writes none for HF's dynamic NTK, which transformers applies only past
    max_position_embeddings: the fixture's 40 tokens are inside its 256), no biases: LlamaModel itself."""
    eng = engine("internlm3")
    m, c = eng.model, eng.model.cfg
    assert type(m) is LlamaModel and c.arch == "llama"
    assert (c.head_dim, c.n_heads, c.n_kv_heads, c.rope.n_rot, c.rope.theta) == (24, 4, 1, 24, 5e7)
    assert c.rope.freq_scale == 1.0 and c.rope.style == "normal"
    hf = json.loads((DATA / "internlm3.json").read_text())["config"]
    assert hf["model_type"] == "internlm3" and hf["rope_parameters"]["rope_type"] == "dynamic"
    assert hf["max_position_embeddings"] > len(ref("internlm3")["ids"])
    assert miss(eng, "internlm3") < TOL


@pytest.mark.parametrize("what", ["neox", "base"])
def test_rope_rules_are_needed(what):
    """Adjacent pairs on the permuted q/k (not halves) and the file's base 5e7 (not llama.cpp's default 1e4)."""
    eng = engine("internlm3")
    c = eng.model.cfg
    rope = replace(c.rope, style="neox") if what == "neox" else replace(c.rope, theta=10000.0)
    object.__setattr__(c, "rope", rope)      # (this engine's own cfg)
    assert miss(eng, "internlm3") > 10 * TOL


def test_biased_file_takes_the_bias_model():
    eng = engine("internlm3-bias")
    m = eng.model
    assert type(m) is LlamaBiasModel and m.cfg.arch == "llama"
    b = m.blocks[0]
    assert b.attn_q_bias.shape == (64,) and b.attn_k_bias.shape == (32,) and b.attn_v_bias.shape == (32,)
    assert [m.bias[0][n].shape[0] for n in ("attn_output", "ffn_gate", "ffn_up", "ffn_down")] == [64, 96, 96, 64]
    assert miss(eng, "internlm3-bias") < TOL


@pytest.mark.parametrize("group", [("attn_q", "attn_k"), ("attn_v",), ("attn_output",), ("ffn_gate", "ffn_up"),
                                   ("ffn_down",)])
def test_each_bias_is_needed(monkeypatch, group):
    eng = engine("internlm3-bias")
    m = eng.model
    for blk, b in zip(m.blocks, m.bias):
        for name in group:
            if name in ("attn_q", "attn_k", "attn_v"):
                monkeypatch.setattr(blk, name + "_bias", None)
            else:
                monkeypatch.setitem(b, name, None)
    assert miss(eng, "internlm3-bias") > 10 * TOL, group


def test_biases_are_not_dropped(tmp_path):
    """The same file without its bias tensors runs as plain llama and misses by far: before models/llama_bias.py the
    llama model ignored them silently."""
    from minfer.gguf_file import GGUFFile

    gf = GGUFFile(DATA / "internlm3-bias.gguf")
    drop = tuple(f"blk.{i}.{b}.bias" for i in range(2) for b in BIASES if f"blk.{i}.{b}.bias" in gf.tensors)
    assert len(drop) == 14
    p = rewrite(DATA / "internlm3-bias.gguf", tmp_path / "nobias.gguf", drop_tensors=drop)
    assert type(load(p)) is LlamaModel
    from minfer.runtime.engine import Engine
    from models.test_arch_vs_transformers import reference_switches

    assert miss(Engine.load(p, ctx=64, progress=False, switches=reference_switches()), "internlm3-bias") > 10 * TOL


def test_other_llama_graph_arches_keep_their_own_loader():
    """Only the `llama` arch's class hands over to the bias model: a subclass (its own arch) keeps its loader."""
    from minfer.models import ARCHITECTURES

    assert ARCHITECTURES["llama"] is LlamaModel
    assert all(cls is not LlamaBiasModel for cls in ARCHITECTURES.values())
