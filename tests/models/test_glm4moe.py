"""glm4moe (GLM-4.5 / 4.6) on the CPU reference: the layout read from the file, each rule of the
architecture needed to reach transformers' logits (fixture tests/data/arch/glm4moe.*,
tools/gen_arch_fixtures.py: a tiny random Glm4MoeForCausalLM converted by llama.cpp's
convert_hf_to_gguf.py), and the keys whose absence or value changes the model."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, ref, reference_switches, rel_err, rewrite

HF = json.loads((DATA / "glm4moe.json").read_text())["config"]


@pytest.fixture(scope="module")
def eng():
    return engine("glm4moe")


def err(eng) -> float:
    r = ref("glm4moe")
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def test_layout_read_from_the_file(eng):
    """The trunk's layers (block_count 4 counts HF's one NextN layer, which has no tensors here),
    the leading dense layer, the routing constants and the partial NEOX rope, as in the HF config."""
    from minfer.gguf_file import GGUFFile

    m, c = eng.model, eng.model.cfg
    md = GGUFFile(DATA / "glm4moe.gguf").metadata
    assert md["glm4moe.block_count"] == HF["num_hidden_layers"] + HF["num_nextn_predict_layers"] == 4
    assert c.n_layers == len(m.blocks) == HF["num_hidden_layers"] == 3
    assert [e is None for e in m.moe] == [i < HF["first_k_dense_replace"] for i in range(3)] == [True, False, False]
    assert (c.n_experts, c.n_experts_used, c.expert_shared_count) == \
        (HF["n_routed_experts"], HF["num_experts_per_tok"], HF["n_shared_experts"])
    assert (c.expert_groups, c.expert_groups_used) == (HF["n_group"], HF["topk_group"]) == (4, 2)
    assert c.expert_gating == "sigmoid" and c.expert_weights_scale == HF["routed_scaling_factor"] == 2.5
    assert m.weights_norm is HF["norm_topk_prob"] is True
    assert c.rope.style == "neox" and c.rope.n_rot == c.head_dim // 2
    assert all(e.exp_probs_b.abs().min() > 0 for e in m.moe if e is not None)    # the selection bias is random
    assert all(b.attn_q_norm is not None and b.attn_q_bias is not None for b in m.blocks)


RULES = ["softmax", "select_bias", "groups", "scale", "norm", "shared", "dense_gate_up", "full_rotation",
         "adjacent_pairs", "qk_norm", "qkv_bias"]


@pytest.mark.parametrize("what", RULES)
def test_each_rule_is_needed(eng, monkeypatch, what):
    """With any one rule changed the fixture misses transformers' logits by far."""
    m = eng.model
    assert err(eng) < TOL
    c = m.cfg
    if what == "softmax":
        monkeypatch.setattr(m, "cfg", replace(c, expert_gating="softmax"))
    elif what == "groups":
        monkeypatch.setattr(m, "cfg", replace(c, expert_groups=1, expert_groups_used=1))
    elif what == "scale":
        monkeypatch.setattr(m, "cfg", replace(c, expert_weights_scale=1.0))
    elif what == "full_rotation":
        monkeypatch.setattr(m, "cfg", replace(c, rope=replace(c.rope, n_rot=c.head_dim)))
    elif what == "adjacent_pairs":
        monkeypatch.setattr(m, "cfg", replace(c, rope=replace(c.rope, style="normal")))
    elif what == "norm":
        monkeypatch.setattr(m, "weights_norm", False)
    elif what == "dense_gate_up":       # silu on the up projection instead of the gate
        b = m.blocks[0]
        gate, up = b.ffn_gate, b.ffn_up
        monkeypatch.setattr(b, "ffn_gate", up)
        monkeypatch.setattr(b, "ffn_up", gate)
    elif what in ("qk_norm", "qkv_bias"):
        names = ("attn_q_norm", "attn_k_norm") if what == "qk_norm" else ("attn_q_bias", "attn_k_bias", "attn_v_bias")
        for b in m.blocks:
            for n in names:
                monkeypatch.setattr(b, n, None)
    else:
        name = {"select_bias": "exp_probs_b", "shared": "gate_shexp"}[what]
        for e in m.moe:
            if e is not None:
                monkeypatch.setattr(e, name, None)
    assert err(eng) > 10 * TOL


def _engine(path):
    from minfer.runtime.engine import Engine

    return Engine.load(path, ctx=64, progress=False, switches=reference_switches())


def test_gating_key_absent_means_sigmoid_and_softmax_is_obeyed(tmp_path):
    """llama.cpp glm4-moe.cpp: no expert_gating_func -> sigmoid (the file still matches
    transformers); a file asking for softmax (1) gets it (build_moe_ffn takes the file's gating)."""
    import gguf

    key = "glm4moe.expert_gating_func"
    r = ref("glm4moe")
    e = _engine(rewrite(DATA / "glm4moe.gguf", tmp_path / "a.gguf", drop_keys=(key,)))
    assert e.model.cfg.expert_gating == "sigmoid"
    assert rel_err(e.logits(r["ids"].tolist()).numpy(), r["logits"]) < TOL
    e = _engine(rewrite(DATA / "glm4moe.gguf", tmp_path / "b.gguf", set_keys={key: (1, gguf.GGUFValueType.UINT32)}))
    assert e.model.cfg.expert_gating == "softmax"
    assert rel_err(e.logits(r["ids"].tolist()).numpy(), r["logits"]) > 10 * TOL


def test_leading_dense_block_count_is_read(tmp_path):
    """With leading_dense_block_count 0 layer 0 is a MoE layer, whose router the file lacks."""
    import gguf

    from models.test_arch_vs_transformers import load

    p = rewrite(DATA / "glm4moe.gguf", tmp_path / "x.gguf",
                set_keys={"glm4moe.leading_dense_block_count": (0, gguf.GGUFValueType.UINT32)})
    with pytest.raises(MinferError, match=r"blk\.0\.ffn_gate_inp\.weight"):
        load(p)


def test_block_count_without_nextn_key_is_refused(tmp_path):
    """block_count 4 with tensors for 3 blocks is only valid with nextn_predict_layers 1."""
    from models.test_arch_vs_transformers import load

    p = rewrite(DATA / "glm4moe.gguf", tmp_path / "x.gguf", drop_keys=("glm4moe.nextn_predict_layers",))
    with pytest.raises(MinferError, match=r"glm4moe\.block_count"):
        load(p)


def test_config_counts_the_trunk_for_the_preflight(tmp_path):
    """ModelConfig (what the memory preflight, inspect and the KV cache read) counts the trunk's
    layers, not block_count's NextN layer too: the preflight's KV bytes equal a cache of the loaded
    model's layers (it over-counted one layer in four here, ~2% for GLM-4.5-Air). A count the file
    cannot have is refused by key."""
    import gguf
    import torch

    from minfer.commands.preflight import kv_bytes_per_token
    from minfer.config import ModelConfig
    from minfer.gguf_file import GGUFFile
    from minfer.runtime.kv_cache import KVCache
    from models.test_arch_vs_transformers import load

    cfg = ModelConfig.from_gguf(GGUFFile(DATA / "glm4moe.gguf"))
    assert cfg.n_layers == len(load(DATA / "glm4moe.gguf").blocks) == HF["num_hidden_layers"] == 3
    cache = KVCache.for_config(cfg, 16, dtype=torch.float32)
    assert kv_bytes_per_token(cfg, "cpu") * 16 == cache.nbytes()
    p = rewrite(DATA / "glm4moe.gguf", tmp_path / "x.gguf",
                set_keys={"glm4moe.nextn_predict_layers": (4, gguf.GGUFValueType.UINT32)})
    with pytest.raises(MinferError, match=r"glm4moe\.(block_count|nextn_predict_layers)"):
        ModelConfig.from_gguf(GGUFFile(p))


def test_q_norm_without_k_norm_is_named(tmp_path):
    from models.test_arch_vs_transformers import load

    p = rewrite(DATA / "glm4moe.gguf", tmp_path / "x.gguf", drop_tensors=("blk.1.attn_k_norm.weight",))
    with pytest.raises(MinferError, match=r"blk\.1\.attn_k_norm\.weight"):
        load(p)


def test_moe_layer_routes_through_ops_moe_ffn(eng, monkeypatch):
    """The MoE layers hand the sigmoid gating, the selection bias, the groups and the scale to
    ops.moe_ffn (which the CUDA backend implements with reference.route)."""
    from minfer import ops
    from minfer.models import Step
    from minfer.runtime.kv_cache import KVCache

    seen = []
    real = ops.moe_ffn

    def spy(*a, **kw):
        seen.append(kw)
        return real(*a, **kw)

    monkeypatch.setattr(ops, "moe_ffn", spy)
    eng.model.forward(torch.tensor([5, 6, 7]), Step.at(0, 3, "cpu"), KVCache.for_config(eng.model.cfg, 16))
    assert len(seen) == 2
    for kw, e in zip(seen, eng.model.moe[1:]):
        assert kw["gating"] == "sigmoid" and kw["select_bias"] is e.exp_probs_b
        assert (kw["n_group"], kw["topk_group"], kw["weights_scale"]) == (4, 2, 2.5)


def test_batch_engine_greedy_matches_transformers():
    """Through the batch engine's paged cache next to a second sequence (test_arch_vs_transformers'
    check, run on this fixture)."""
    from models import test_arch_vs_transformers as t

    t.test_batch_engine_greedy_matches_transformers("glm4moe")
