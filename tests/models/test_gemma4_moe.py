"""Google Gemma 4, the 26B-A4B MoE form (minfer/models/gemma4_moe.py through ops.moe_ffn, the CPU float32 reference)
against transformers: logits at every position, greedy, the cache in pieces; each rule of the MoE layer
needed (with one changed the logits miss by more than 10x the tolerance); missing keys and tensors
refused by name, and a CUDA load refused by the router tensor. Fixture: tests/data/arch/gemma4-moe.gguf
(tools/gen_arch_fixtures.py: Gemma4ForCausalLM with enable_moe_block, 4 experts of 32, top 2, the
dense fixture's attention; llama.cpp's converter writes the fused ffn_gate_up_exps)."""

from __future__ import annotations

import math

import pytest
import torch

from minfer import ops
from minfer.errors import MinferError
from minfer.models import gemma4_moe
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

NAME = "gemma4-moe"


def miss(eng) -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def _router_input(what):
    """gemma4_moe.router_input with one rule changed."""
    def router_input(r, moe, eps):
        D = r.shape[1]
        if what == "router_on_expert_input":
            return ops.rms_norm(r, moe.pre_norm_2, eps)
        z = ops.rms_norm(r, torch.ones(D), eps)
        if what != "no_router_scale":
            z = z * moe.router_scale
        if what != "no_router_sqrt_d":
            z = z / math.sqrt(D)
        return z
    return router_input


# (the top-k weights' renormalization is not among them: it scales each token's expert sum by one
# factor, which post_ffw_norm_2 takes out; minfer applies it, as llama.cpp and HF do)
ROUTE_RULES = ["router_on_expert_input", "no_router_scale", "no_router_sqrt_d", "no_per_expert_scale"]
LAYER_RULES = ["up_gate_order", "silu_experts", "no_experts", "no_mlp", "no_post_norm_1", "no_post_norm_2",
               "experts_on_ffn_norm"]


@pytest.mark.parametrize("what", ROUTE_RULES + LAYER_RULES)
def test_each_rule_is_needed(monkeypatch, what):
    from minfer.models import gemma4

    eng = engine(NAME)
    m = eng.model
    assert miss(eng) < TOL
    Fe = m.cfg.expert_ffn
    if what == "no_per_expert_scale":
        for moe in m.moe:
            monkeypatch.setattr(moe, "down_scale", torch.ones_like(moe.down_scale))
    elif what in ROUTE_RULES:
        monkeypatch.setattr(gemma4_moe, "router_input", _router_input(what))
    elif what == "up_gate_order":                 # the fused tensor read as [up; gate]
        for moe in m.moe:
            d = moe.gate_up_exps.dense.view(4, 2, Fe, -1)
            monkeypatch.setattr(moe.gate_up_exps, "dense", d.flip(1).reshape(8 * Fe, -1))
    elif what == "silu_experts":
        monkeypatch.setattr(gemma4_moe, "EXPERT_ACT", "silu")
    elif what == "no_experts":
        monkeypatch.setattr(gemma4, "moe_branch", lambda r, *a: torch.zeros_like(r))
    elif what == "experts_on_ffn_norm":           # the experts fed the MLP's normed input (ffn_norm) instead
        for moe, b in zip(m.moe, m.blocks):
            monkeypatch.setattr(moe, "pre_norm_2", b.ffn_norm)
    else:                                         # one of the two outputs or its post-norm dropped
        real = ops.rms_norm
        if what == "no_mlp":
            skip = {id(moe.post_norm_1) for moe in m.moe}
            monkeypatch.setattr(ops, "rms_norm", lambda x, w, eps: x * 0 if id(w) in skip else real(x, w, eps))
        else:
            skip = {id(moe.post_norm_1 if what == "no_post_norm_1" else moe.post_norm_2) for moe in m.moe}
            monkeypatch.setattr(ops, "rms_norm", lambda x, w, eps: x if id(w) in skip else real(x, w, eps))
    assert miss(eng) > 10 * TOL


@pytest.mark.parametrize("key", ["gemma4.expert_used_count", "gemma4.expert_feed_forward_length",
                                 "gemma4.expert_count"])
def test_missing_key_is_named(tmp_path, key):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_keys=(key,))
    with pytest.raises(MinferError, match=key.replace(".", r"\.")):
        load(p)


@pytest.mark.parametrize("tensor", ["blk.1.ffn_gate_inp.scale", "blk.0.pre_ffw_norm_2.weight",
                                    "blk.2.post_ffw_norm_1.weight", "blk.3.post_ffw_norm_2.weight",
                                    "blk.0.ffn_gate_up_exps.weight", "blk.5.ffn_down_exps.weight",
                                    "blk.4.ffn_down_exps.scale", "blk.1.ffn_gate.weight"])
def test_missing_tensor_is_named(tmp_path, tensor):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_tensors=(tensor,))
    with pytest.raises(MinferError, match=tensor.replace(".", r"\.")):
        load(p)
