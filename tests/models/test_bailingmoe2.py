"""Ling 2.0 (minfer/models/bailingmoe2.py, GGUF arch `bailingmoe2`: Ling-mini-2.0 / Ling-flash-2.0 / Ring-mini-2.0) on
the CPU's float32 reference, against two references that minfer made neither of: a torch forward of the HF checkpoint
written from the architecture (tools/gen_bailingmoe2_fixture.py reference(): the fused query_key_value split q, k, v,
per-head q/k RMSNorm, rotate_half on the first rotary_dim dims, BailingMoeV2Gate's sigmoid / expert_bias / group-limited
top-k / norm_topk_prob / routed_scaling_factor, the shared expert), and llama.cpp's own logits (llama-cpp-python
0.3.36, an F32 copy of the file, F32 KV cache). transformers 5.25 has no BailingMoeV2 class (remote code only), so
test_arch_vs_transformers does not list it; this file runs its checks: logits at every position, greedy continuation
(llama.cpp's), the KV cache in pieces, the batch engine's paged cache; each rule of the graph needed, the routing's
included (with one changed the logits miss both references by more than 10x the tolerance); the loader's refusals
and the MTP layers skipped; the CUDA backend's code (both MoE paths) through Triton's interpreter.

Fixture: tests/data/arch/bailingmoe2.{gguf,npz,json} (tools/gen_bailingmoe2_fixture.py build + goldens): hidden 32, 2
heads of 16 over 1 kv head, rope on 8 of 16 dims (NEOX, base 6e5), 3 layers (layer 0 dense, FFN 64), 8 experts of 32
in 4 groups (3 eligible), top-4, one shared expert of 32, sigmoid router with expert bias, routed_scaling_factor 2.5,
norm_topk_prob; vocab 320, untied output, converted by llama.cpp's convert_hf_to_gguf.py (BailingMoeV2Model).

The checks every llama.cpp-checked decoder shares (logits against both references, greedy, the cache in pieces,
the batch engine's paged cache) run in tests/models/test_llamacpp_decoders.py, which lists this fixture."""

from __future__ import annotations

import json
from dataclasses import replace

import gguf
import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

NAME = "bailingmoe2"
BASE_ERR = 3e-6      # the fixture's float32 misses: 1.5e-6 (reference), 1.3e-6 (llama.cpp); they agree to 7.9e-7
U32 = gguf.GGUFValueType.UINT32


def miss(eng, key: str = "logits") -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r[key])


def test_layout_read_from_the_file():
    from minfer.models.bailingmoe2 import BailingMoe2Model

    eng = engine(NAME)
    m, c = eng.model, eng.model.cfg
    assert type(m) is BailingMoe2Model and c.arch == NAME
    assert (c.head_dim, c.n_heads, c.n_kv_heads, c.d_model, c.ffn, c.vocab, c.n_layers) == (16, 2, 1, 32, 64, 320, 3)
    assert c.rope.style == "neox" and c.rope.n_rot == 8 and c.rope.theta == 6e5 and c.rope.freq_scale == 1.0
    assert (c.n_experts, c.n_experts_used, c.expert_ffn, c.expert_shared_count) == (8, 4, 32, 1)
    assert (c.expert_groups, c.expert_groups_used, c.expert_weights_scale) == (4, 3, 2.5)
    assert c.expert_gating == "sigmoid" and m.weights_norm is True and c.leading_dense_blocks == 1
    assert not c.tied_output and m.output is not m.token_embd
    b0, b1 = m.blocks[0], m.blocks[1]
    assert b0.attn_q is None and tuple(b0.attn_qkv.shape) == (64, 32)        # q 32 rows, k 16, v 16
    assert b0.attn_q_norm.shape == (16,) and b0.attn_k_norm.shape == (16,)
    assert m.moe[0] is None and b0.ffn_gate is not None and b1.ffn_gate is None
    e = m.moe[1]
    assert e.exp_probs_b.shape == (8,) and tuple(e.gate_shexp.shape) == (32, 32) and tuple(e.gate_inp.shape) == (8, 32)
    hf = json.loads((DATA / f"{NAME}.json").read_text())
    assert hf["config"]["architectures"] == ["BailingMoeV2ForCausalLM"]
    # the fixture's routing is not degenerate: every expert chosen, and the group limit and the selection bias each
    # change the choice of many tokens in both MoE layers (the generator's count)
    assert hf["experts_used_per_layer"] == [8, 8]
    assert min(hf["tokens_whose_choice_changes"]["no_group_limit"]) >= 10
    assert min(hf["tokens_whose_choice_changes"]["no_bias"]) >= 10


def test_the_two_references_agree():
    r = ref(NAME)
    assert rel_err(r["lc_logits"], r["logits"]) < BASE_ERR
    assert r["lc_greedy"].tolist() == r["greedy"].tolist()


def test_expert_choices_are_the_references():
    """The experts each MoE layer chose for each position: the reference's (the generator's `choices`)."""
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


def _route_variant(what: str):
    """reference.route with one of its rules changed, for the MoE layers' calls."""
    from minfer.ops import reference

    route = reference.route

    def changed(h, router, k, norm_weights, router_bias=None, gating="softmax", select_bias=None, n_group=1,
                topk_group=1, weights_scale=1.0):
        if what == "bias_in_weights":            # the weights read from the biased scores s, not p
            w, idx = route(h, router, k, False, router_bias, gating, select_bias, n_group, topk_group, 1.0)
            s = torch.sigmoid(h.float() @ router.float().t()) + select_bias.float()
            w = s.gather(1, idx)
            w = w / w.sum(-1, keepdim=True)
            return w * weights_scale, idx
        if what == "group_best_one":             # a group scored by its best expert only, not its two best
            s = torch.sigmoid(h.float() @ router.float().t()) + select_bias.float()
            T, E = s.shape
            best = s.view(T, n_group, E // n_group).max(-1).values
            keep = torch.zeros_like(best, dtype=torch.bool).scatter_(1, best.topk(topk_group, -1).indices, True)
            sel = s.view(T, n_group, -1).masked_fill(~keep[..., None], float("-inf")).view(T, E)
            idx = sel.topk(k, -1).indices
            w = torch.sigmoid(h.float() @ router.float().t()).gather(1, idx)
            return w / w.sum(-1, keepdim=True) * weights_scale, idx
        kw = dict(no_select_bias=dict(select_bias=None), no_group_limit=dict(n_group=1, topk_group=1),
                  no_scale=dict(weights_scale=1.0), no_norm=dict(norm_weights=False))[what]
        args = dict(norm_weights=norm_weights, router_bias=router_bias, gating=gating, select_bias=select_bias,
                    n_group=n_group, topk_group=topk_group, weights_scale=weights_scale) | kw
        return route(h, router, k, **args)
    return changed


ROUTING = ["no_select_bias", "bias_in_weights", "no_group_limit", "group_best_one", "no_scale", "no_norm"]


@pytest.mark.parametrize("what", ROUTING + ["normal_rope", "full_rotation", "no_qk_norm", "no_shared_expert",
                                            "ffn_norm_ones"])
def test_each_rule_is_needed(monkeypatch, what):
    """Routing: the selection bias in the choice only (not absent, not in the weights), the group limit with groups
    scored by their two best, the routed scaling factor, the renormalization. Attention: NEOX rope on 8 of 16 dims
    (not NORM pairs, not the whole head), the per-head q/k norms. FFN: the shared expert, the ffn_norm weight."""
    from minfer.ops import reference

    eng = engine(NAME)
    m, c = eng.model, eng.model.cfg
    assert miss(eng) < BASE_ERR
    if what in ROUTING:
        monkeypatch.setattr(reference, "route", _route_variant(what))
    elif what == "normal_rope":
        object.__setattr__(c, "rope", replace(c.rope, style="normal"))       # (this engine's own cfg)
    elif what == "full_rotation":
        object.__setattr__(c, "rope", replace(c.rope, n_rot=c.head_dim))
    elif what == "no_qk_norm":
        for b in m.blocks:
            monkeypatch.setattr(b, "attn_q_norm", torch.ones_like(b.attn_q_norm))
            monkeypatch.setattr(b, "attn_k_norm", torch.ones_like(b.attn_k_norm))
    elif what == "no_shared_expert":
        for e in m.moe:
            if e is not None:
                monkeypatch.setattr(e, "gate_shexp", None)
    else:
        for b in m.blocks:
            monkeypatch.setattr(b, "ffn_norm", torch.ones_like(b.ffn_norm))
    assert miss(eng) > 10 * TOL and miss(eng, "lc_logits") > 10 * TOL, what


def test_absent_selection_bias_chooses_on_the_scores(tmp_path):
    """exp_probs_b is TENSOR_NOT_REQUIRED: a file without it runs with the choice on p (the fixture's model with its
    biases zeroed)."""
    drop = tuple(f"blk.{i}.exp_probs_b.bias" for i in (1, 2))
    m = load(rewrite(DATA / f"{NAME}.gguf", tmp_path / "nb.gguf", drop_tensors=drop))
    assert m.moe[1].exp_probs_b is None
    want = engine(NAME)
    for e in want.model.moe[1:]:
        e.exp_probs_b = torch.zeros_like(e.exp_probs_b)
    ids = ref(NAME)["ids"].tolist()
    from minfer.models import Step
    from minfer.runtime.kv_cache import KVCache

    got = m.forward(torch.tensor(ids), Step.at(0, len(ids), "cpu"), KVCache.for_config(m.cfg, 64)).numpy()
    assert rel_err(got, want.logits(ids).numpy()) < 1e-6


def test_mtp_layers_are_skipped(tmp_path):
    """A file with an MTP (nextn) layer: block_count counts it and nextn_predict_layers names it; the trunk runs the
    first block_count - nextn layers only and never loads blk.3 (llama.cpp: TENSOR_SKIP)."""
    extra = {f"blk.3.{n}": np.full(s, 7.0) for n, s in (("attn_norm.weight", 32), ("nextn.eh_proj.weight", (32, 64)),
                                                        ("nextn.enorm.weight", 32), ("nextn.hnorm.weight", 32))}
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "mtp.gguf", add_tensors=extra,
                set_keys={f"{NAME}.block_count": (4, U32), f"{NAME}.nextn_predict_layers": (1, U32)})
    m = load(p)
    assert m.cfg.n_layers == 3 and len(m.blocks) == 3
    r = ref(NAME)
    from minfer.models import Step
    from minfer.runtime.kv_cache import KVCache

    ids = r["ids"].tolist()
    got = m.forward(torch.tensor(ids), Step.at(0, len(ids), "cpu"), KVCache.for_config(m.cfg, 64)).numpy()
    assert rel_err(got, r["lc_logits"]) < BASE_ERR


@pytest.mark.parametrize("change, match", [
    (dict(drop_tensors=("output.weight",)), r"output\.weight"),
    (dict(add_tensors={"blk.1.attn_qkv.bias": np.zeros(64)}), r"blk\.1\.attn_qkv\.bias"),
    (dict(add_tensors={"blk.0.attn_output.bias": np.zeros(32)}), r"blk\.0\.attn_output\.bias"),
    (dict(drop_tensors=("blk.2.attn_qkv.weight",)), r"blk\.2\.attn_qkv\.weight"),
    (dict(drop_tensors=("blk.1.attn_k_norm.weight",)), r"blk\.1\.attn_k_norm\.weight"),
    (dict(drop_tensors=("blk.2.ffn_up_shexp.weight",)), r"blk\.2\.ffn_up_shexp\.weight"),
    (dict(drop_keys=(f"{NAME}.expert_gating_func",)), rf"{NAME}\.expert_gating_func"),
    (dict(drop_keys=(f"{NAME}.expert_shared_count",)), rf"{NAME}\.expert_shared_count"),
    (dict(set_keys={f"{NAME}.expert_shared_count": (0, U32)}), "expert_shared_count=0"),
    (dict(drop_keys=(f"{NAME}.feed_forward_length",)), rf"{NAME}\.feed_forward_length"),
])
def test_refusals(tmp_path, change, match):
    """What llama.cpp's loader requires (output.weight, attn_qkv, the q/k norms, the shared expert, the gating and
    shared-count keys) or never creates (attention biases), refused by name rather than run wrongly."""
    with pytest.raises(MinferError, match=match):
        load(rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", **change))


# The CUDA backend's code on the CPU (Triton's interpreter, prefill and the host-free decode step against the
# reference, the paths it must take): tests/ops/test_arch_forward_interpreted.py, which lists this fixture.
