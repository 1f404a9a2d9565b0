"""bench's attention FLOPs count only the layers that run softmax attention: for a hybrid whose GGUF head_count
is one number, the tensor table picks the layers (bench._softmax_attention_layers). The reference is each
fixture's Hugging Face config (tests/data/arch/<name>.json, the file transformers ran): its layer types, or
Jamba's attention period and offset; Falcon-H1 runs attention beside its Mamba mixer in every layer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ARCH = Path(__file__).resolve().parents[1] / "data" / "arch"


def _hf_attention_layers(name: str) -> int:
    c = json.loads((ARCH / f"{name}.json").read_text())
    c = c.get("config", c)
    if name == "jamba":
        return sum(1 for i in range(c["num_hidden_layers"])
                   if i % c["attn_layer_period"] == c["attn_layer_offset"])
    if name == "falcon-h1":
        return c["num_hidden_layers"]
    types = c.get("layer_types") or c["layers_block_type"]
    return sum(1 for t in types if t in ("full_attention", "attention"))


@pytest.mark.parametrize("name", ["jamba", "qwen3next", "qwen35", "kimi-linear", "lfm2", "nemotron_h",
                                  "granitehybrid", "falcon-h1", "qwen3", "llama3", "mamba2"])
def test_attention_heads_of_the_attention_layers(name):
    from minfer.bench.bench import ModelStats
    from minfer.gguf_file import GGUFFile

    path = ARCH / f"{name}.gguf"
    gf = GGUFFile(str(path))
    st = ModelStats.from_gguf(gf)
    hc = gf.arch_get("attention.head_count")
    if name == "mamba2":
        assert st.attn_heads == 0 and st.n_head == 0
        return
    if name in ("qwen3", "llama3"):           # dense: every layer
        assert st.attn_heads == int(hc) * st.n_layers
        return
    assert not isinstance(hc, (list, tuple))  # the case under test: one number for every layer
    assert st.attn_heads == int(hc) * _hf_attention_layers(name), (st.attn_heads, hc)
    assert 0 < st.attn_heads < int(hc) * st.n_layers or name == "falcon-h1"
    # the FLOPs at depth grow by the attention layers' share only
    a, b = st.pp_flops(1, 0), st.pp_flops(1, 1000)
    assert b - a == pytest.approx(4 * st.attn_heads * st.head_dim * 1000)


def test_hrm_text_counts_each_pass_of_its_shared_blocks():
    """hrm_text runs its L stack's blocks H_cycles * L_cycles times a forward and its H stack's H_cycles times, each
    pass attending over its own cache slots (the fixture's HF config: 2 layers a stack, H_cycles 2, L_cycles 2): the
    roofline counts every pass (Model.block_passes), not each weight block once."""
    from minfer.bench.bench import ModelStats
    from minfer.gguf_file import GGUFFile

    c = json.loads((ARCH / "hrm-text.json").read_text())
    c = c.get("config", c)
    lps, hcy, lcy = c["num_layers_per_stack"], c["H_cycles"], c["L_cycles"]
    gf = GGUFFile(str(ARCH / "hrm-text.gguf"))
    st = ModelStats.from_gguf(gf)
    hc = int(gf.arch_get("attention.head_count"))
    assert st.attn_heads == hc * lps * hcy * (lcy + 1)                 # every pass's layers: the slot count
    per_block = {i: sum(x.n_elements for n, x in gf.tensors.items()
                        if n.startswith(f"blk.{i}.") and len(x.shape) == 2) for i in range(2 * lps)}
    assert st.layer_params == sum(per_block[j] * hcy * lcy + per_block[lps + j] * hcy for j in range(lps))
