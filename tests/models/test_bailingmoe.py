"""Ling v1 (minfer/models/bailingmoe.py, GGUF arch `bailingmoe`: Ling-lite / Ling-plus / Ling-Coder-lite) on the CPU's
float32 reference, against two references that minfer made neither of: a torch forward of the HF checkpoint written
from the architecture (tools/gen_bailingmoe_fixture.py reference(): query_key_value split q, k, v, rotate_half rope,
softmax top-k router with norm_topk_prob, the shared experts), and llama.cpp's own logits (llama-cpp-python 0.3.36, an
F32 copy of the file, F32 KV cache). transformers 5.25 has no BailingMoe class (remote code only). This file: the
layout, each rule of the graph needed (with one changed the logits miss both references by more than 10x the
tolerance), the expert choices, leading_dense_block_count ignored as llama.cpp's graph does, the loader's refusals.

Fixture: tests/data/arch/bailingmoe.{gguf,npz,json} (tools/gen_bailingmoe_fixture.py build + goldens): hidden 32, 2
heads of 16 over 1 kv head, NORM rope on the whole head (base 6e5), 2 layers, all MoE, 8 experts of 32, top-4,
softmax router, norm_topk_prob, two shared experts (width 64); vocab 320, untied output, converted by llama.cpp's
convert_hf_to_gguf.py (BailingMoeModel).

The checks every llama.cpp-checked decoder shares (logits against both references, greedy, the cache in pieces,
the batch engine's paged cache) run in tests/models/test_llamacpp_decoders.py; the CUDA backend's code through
Triton's interpreter in tests/ops/test_arch_forward_interpreted.py; both list this fixture."""

from __future__ import annotations

import json
from dataclasses import replace

import gguf
import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

NAME = "bailingmoe"
BASE_ERR = 5e-6      # the fixture's float32 misses: 1.5e-6 (reference), 2.5e-6 (llama.cpp); they agree to 1.3e-6
U32 = gguf.GGUFValueType.UINT32


def miss(eng, key: str = "logits") -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r[key])


def forward(m) -> np.ndarray:
    from minfer.models import Step
    from minfer.runtime.kv_cache import KVCache

    ids = ref(NAME)["ids"].tolist()
    return m.forward(torch.tensor(ids), Step.at(0, len(ids), "cpu"), KVCache.for_config(m.cfg, 64)).numpy()


def test_layout_read_from_the_file():
    from minfer.models.bailingmoe import BailingMoeModel

    eng = engine(NAME)
    m, c = eng.model, eng.model.cfg
    assert type(m) is BailingMoeModel and c.arch == NAME
    assert (c.head_dim, c.n_heads, c.n_kv_heads, c.d_model, c.vocab, c.n_layers) == (16, 2, 1, 32, 320, 2)
    assert c.rope.style == "normal" and c.rope.n_rot == 16 and c.rope.theta == 6e5
    assert (c.n_experts, c.n_experts_used, c.expert_ffn, c.expert_shared_count) == (8, 4, 32, 2)
    assert c.expert_gating == "softmax" and c.expert_groups == 1 and c.expert_weights_scale == 1.0
    assert m.weights_norm is True and not c.tied_output and m.output is not m.token_embd
    b = m.blocks[0]
    assert tuple(b.attn_q.shape) == (32, 32) and tuple(b.attn_k.shape) == (16, 32) and b.attn_q_norm is None
    assert all(e is not None for e in m.moe) and all(x.ffn_gate is None for x in m.blocks)
    e = m.moe[1]
    assert e.exp_probs_b is None and tuple(e.gate_shexp.shape) == (64, 32) and tuple(e.gate_inp.shape) == (8, 32)
    hf = json.loads((DATA / f"{NAME}.json").read_text())
    assert hf["config"]["architectures"] == ["BailingMoeForCausalLM"]
    assert hf["experts_used_per_layer"] == [8, 8]         # routing not degenerate: every expert chosen somewhere


def test_the_two_references_agree():
    r = ref(NAME)
    assert rel_err(r["lc_logits"], r["logits"]) < BASE_ERR
    assert r["lc_greedy"].tolist() == r["greedy"].tolist()


def test_expert_choices_are_the_references():
    from minfer.ops import reference

    r = ref(NAME)
    got, route = [], reference.route

    def record(*a, **kw):
        w, idx = route(*a, **kw)
        got.append(idx.sort(-1).values)
        return w, idx

    eng = engine(NAME)
    reference.route, saved = record, reference.route
    try:
        eng.logits(r["ids"].tolist())
    finally:
        reference.route = saved
    assert len(got) == 2
    for g, want in zip(got, r["choices"]):
        assert torch.equal(g, torch.from_numpy(np.sort(want.astype(np.int64), -1)))
    # the top-4 of 8 varies by token: more than 4 distinct sets in each layer
    assert all(len({tuple(row.tolist()) for row in g}) > 4 for g in got)


def _route_variant(what: str):
    from minfer.ops import reference

    route = reference.route

    def changed(h, router, k, norm_weights, router_bias=None, gating="softmax", select_bias=None, n_group=1,
                topk_group=1, weights_scale=1.0):
        kw = dict(sigmoid=dict(gating="sigmoid"), no_norm=dict(norm_weights=False), top2=dict(k=2),
                  scale2=dict(weights_scale=2.0))[what]
        args = dict(k=k, norm_weights=norm_weights, router_bias=router_bias, gating=gating, select_bias=select_bias,
                    n_group=n_group, topk_group=topk_group, weights_scale=weights_scale) | kw
        kk = args.pop("k")
        return route(h, router, kk, **args)
    return changed


ROUTING = ["sigmoid", "no_norm", "top2", "scale2"]


@pytest.mark.parametrize("what", ROUTING + ["neox_rope", "no_shared_expert", "ffn_norm_ones"])
def test_each_rule_is_needed(monkeypatch, what):
    """Routing: softmax (not sigmoid), the renormalization, top-4, a weight scale of 1 (the file's). Attention: NORM
    rope on the converter's permuted q/k (not NEOX). FFN: the shared expert, the ffn_norm weight."""
    from minfer.ops import reference

    eng = engine(NAME)
    m, c = eng.model, eng.model.cfg
    assert miss(eng) < BASE_ERR
    if what in ROUTING:
        monkeypatch.setattr(reference, "route", _route_variant(what))
    elif what == "neox_rope":
        object.__setattr__(c, "rope", replace(c.rope, style="neox"))       # (this engine's own cfg)
    elif what == "no_shared_expert":
        for e in m.moe:
            monkeypatch.setattr(e, "gate_shexp", None)
    else:
        for b in m.blocks:
            monkeypatch.setattr(b, "ffn_norm", torch.ones_like(b.ffn_norm))
    assert miss(eng) > 10 * TOL and miss(eng, "lc_logits") > 10 * TOL, what


def test_leading_dense_block_count_is_ignored(tmp_path):
    """llama.cpp reads leading_dense_block_count but builds every layer as MoE: a file saying 1 runs the same."""
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "lead.gguf", set_keys={f"{NAME}.leading_dense_block_count": (1, U32)})
    m = load(p)
    assert m.moe[0] is not None
    assert rel_err(forward(m), ref(NAME)["lc_logits"]) < BASE_ERR


@pytest.mark.parametrize("change, match", [
    (dict(drop_tensors=("output.weight",)), r"output\.weight"),
    (dict(drop_tensors=("blk.1.attn_q.weight",)), r"blk\.1\.attn_q\.weight"),
    (dict(add_tensors={"blk.0.attn_qkv.weight": np.zeros((64, 32))}), r"blk\.0\.attn_qkv\.weight"),
    (dict(add_tensors={"blk.0.attn_output.bias": np.zeros(32)}), r"blk\.0\.attn_output\.bias"),
    (dict(add_tensors={"blk.1.exp_probs_b.bias": np.zeros(8)}), r"blk\.1\.exp_probs_b\.bias"),
    (dict(add_tensors={"blk.0.attn_q_norm.weight": np.ones(16)}), r"blk\.0\.attn_q_norm\.weight"),
    (dict(drop_tensors=("blk.1.ffn_up_shexp.weight",)), r"blk\.1\.ffn_up_shexp\.weight"),
    (dict(drop_keys=(f"{NAME}.expert_shared_count",)), rf"{NAME}\.expert_shared_count"),
    (dict(set_keys={f"{NAME}.expert_shared_count": (0, U32)}), "expert_shared_count=0"),
    (dict(drop_keys=(f"{NAME}.expert_feed_forward_length",)), rf"{NAME}\.expert_feed_forward_length"),
    (dict(set_keys={f"{NAME}.rope.dimension_count": (8, U32)}), "rope.dimension_count=8"),
])
def test_refusals(tmp_path, change, match):
    """What llama.cpp's loader requires (output.weight, q/k/v, the shared expert, its keys) or never creates (a fused
    attn_qkv here, attn_output.bias, a selection bias, q/k norms), and a rope width not the head's, refused by name."""
    with pytest.raises(MinferError, match=match):
        load(rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", **change))
