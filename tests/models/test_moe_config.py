"""The MoE routing keys of a GGUF (expert_gating_func, the expert groups, the weights scale):
read into ModelConfig, and a value an architecture's graph does not have refused by name
(llama.cpp llama_expert_gating_func_type: 1 softmax, 2 sigmoid)."""

from __future__ import annotations

import gguf
import pytest

from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.gguf_file import GGUFFile
from models.test_arch_vs_transformers import DATA, rewrite

U32, F32 = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32


def test_qwen3moe_defaults():
    c = ModelConfig.from_gguf(GGUFFile(DATA / "qwen3moe.gguf"))
    assert (c.expert_gating, c.expert_weights_scale, c.expert_groups, c.expert_groups_used,
            c.expert_shared_count, c.leading_dense_blocks) == ("softmax", 1.0, 1, 1, 0, 0)


def test_sigmoid_gating_refused_where_the_graph_has_none(tmp_path):
    p = rewrite(DATA / "qwen3moe.gguf", tmp_path / "x.gguf", set_keys={"qwen3moe.expert_gating_func": (2, U32)})
    with pytest.raises(MinferError, match=r"qwen3moe\.expert_gating_func=2 is not supported for qwen3moe "
                                          r"\(supported: 1 \(softmax\)\)"):
        ModelConfig.from_gguf(GGUFFile(p))


def test_unknown_gating_value_refused(tmp_path):
    p = rewrite(DATA / "qwen3moe.gguf", tmp_path / "x.gguf", set_keys={"qwen3moe.expert_gating_func": (9, U32)})
    with pytest.raises(MinferError, match=r"expert_gating_func=9 is not supported"):
        ModelConfig.from_gguf(GGUFFile(p))


def test_groups_that_do_not_divide_the_experts_refused(tmp_path):
    c = ModelConfig.from_gguf(GGUFFile(DATA / "qwen3moe.gguf"))
    bad = c.n_experts + 1
    p = rewrite(DATA / "qwen3moe.gguf", tmp_path / "x.gguf",
                set_keys={"qwen3moe.expert_group_count": (bad, U32), "qwen3moe.expert_group_used_count": (1, U32)})
    with pytest.raises(MinferError, match=rf"expert_group_count={bad}"):
        ModelConfig.from_gguf(GGUFFile(p))


def test_scale_and_groups_read(tmp_path):
    c0 = ModelConfig.from_gguf(GGUFFile(DATA / "qwen3moe.gguf"))
    p = rewrite(DATA / "qwen3moe.gguf", tmp_path / "x.gguf",
                set_keys={"qwen3moe.expert_weights_scale": (2.5, F32), "qwen3moe.expert_group_count": (2, U32),
                          "qwen3moe.expert_group_used_count": (1, U32)})
    c = ModelConfig.from_gguf(GGUFFile(p))
    assert (c.expert_weights_scale, c.expert_groups, c.expert_groups_used) == (2.5, 2, 1)
    assert c0.n_experts % 2 == 0


def test_negative_scale_refused(tmp_path):
    p = rewrite(DATA / "qwen3moe.gguf", tmp_path / "x.gguf", set_keys={"qwen3moe.expert_weights_scale": (-1.0, F32)})
    with pytest.raises(MinferError, match=r"qwen3moe\.expert_weights_scale"):
        ModelConfig.from_gguf(GGUFFile(p))
