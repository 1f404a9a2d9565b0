"""GroveMoE (minfer/models/grovemoe.py, GGUF arch `grovemoe`: inclusionAI GroveMoE-Inst / GroveMoE-Base) on the CPU's
float32 reference, against two references that minfer made neither of: a torch forward of the checkpoint written from
llama.cpp's grovemoe graph (tools/gen_grovemoe_fixture.py reference(): Qwen3-MoE attention, the softmax top-K routed
experts, then the adjugate (chunk) experts on the routed output, weighted by p of expert number top // 2, renormalized,
scaled by expert_group_scale), and llama.cpp's own logits (llama-cpp-python 0.3.36, an F32 copy of the file, F32 KV
cache). transformers 5.25 has no GroveMoE class (remote code only). Here: the layout read from the file, the two
references' agreement, the experts and chunk experts chosen, each rule of the graph needed (with one changed the
logits miss both references by more than 10x the tolerance), the optional chunk width key, the loader's refusals.

Fixture: tests/data/arch/grovemoe.{gguf,npz,json} (tools/gen_grovemoe_fixture.py build + goldens): hidden 32, 2 heads
of 16 over 1 kv head, NEOX rope (base 5e5), 2 layers, 8 experts of 16, top-3, 4 chunk experts of 16 (experts_per_group
2, expert_group_scale 0.05: what the converter writes), tied output, vocab 320, converted by llama.cpp's
convert_hf_to_gguf.py (conversion/grovemoe.py GroveMoeModel).

The checks every llama.cpp-checked decoder shares (logits against both references, greedy, the cache in pieces, the
batch engine's paged cache) run in tests/models/test_llamacpp_decoders.py, which lists this fixture."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

NAME = "grovemoe"
BASE_ERR = 3e-6      # the fixture's float32 misses: 1.2e-6 (reference), 1.2e-6 (llama.cpp); they agree to 1.8e-6
U32, F32 = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32


def miss(eng, key: str = "logits") -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r[key])


def test_layout_read_from_the_file():
    from minfer.models.grovemoe import GroveMoeBlock, GroveMoeModel

    m = engine(NAME).model
    c = m.cfg
    assert type(m) is GroveMoeModel and c.arch == NAME
    assert (c.head_dim, c.n_heads, c.n_kv_heads, c.d_model, c.vocab, c.n_layers) == (16, 2, 1, 32, 320, 2)
    assert c.rope.style == "neox" and c.rope.n_rot == 16 and c.rope.theta == 5e5
    assert (c.n_experts, c.n_experts_used, c.expert_ffn) == (8, 3, 16)
    assert m.experts_per_group == 2 and abs(m.group_scale - 0.05) < 1e-8 and m.weights_norm is True
    assert c.tied_output and m.output is m.token_embd
    e = m.moe[1]
    assert type(e) is GroveMoeBlock and tuple(e.gate_inp.shape) == (8, 32)
    assert tuple(e.gate_chexps.shape) == (4 * 16, 32) and tuple(e.down_chexps.shape) == (4 * 32, 16)
    assert e.gate_chexps.n_experts == 4 and e.gate_chexps in m.qweights() and e.down_chexps in m.head_weights()
    hf = json.loads((DATA / f"{NAME}.json").read_text())
    assert hf["config"]["architectures"] == ["GroveMoeForCausalLM"]
    # the routing is not degenerate: every expert chosen, and in both layers tokens whose slots share a chunk expert
    assert hf["experts_used_per_layer"] == [8, 8] and min(hf["tokens_with_a_shared_chunk"]) >= 5


def test_the_two_references_agree():
    r = ref(NAME)
    assert rel_err(r["lc_logits"], r["logits"]) < BASE_ERR
    assert r["lc_greedy"].tolist() == r["greedy"].tolist()
    assert len(set(r["greedy"].tolist())) >= 5


def test_logits_match_both_references():
    eng = engine(NAME)
    assert miss(eng) < BASE_ERR and miss(eng, "lc_logits") < BASE_ERR


def test_expert_and_chunk_choices_are_the_references():
    """Per layer, reference.route is called for the routed experts, for the chunk choice (the same top-K), and for
    the chunk call of ops.moe_ffn (gating topk_softmax over log S): the first two are the reference's `choices`, the
    chunk experts given weight those of its `chunks`."""
    from minfer.ops import reference

    r = ref(NAME)
    calls, route = [], reference.route

    def record(*a, **kw):
        w, idx = route(*a, **kw)
        calls.append((w, idx))
        return w, idx

    eng = engine(NAME)
    reference.route = record
    try:
        eng.logits(r["ids"].tolist())
    finally:
        reference.route = route
    assert len(calls) == 6
    for layer in range(2):
        routed, choice, chunk = calls[3 * layer: 3 * layer + 3]
        want = torch.from_numpy(np.sort(r["choices"][layer].astype(np.int64), -1))
        assert torch.equal(routed[1].sort(-1).values, want) and torch.equal(choice[1].sort(-1).values, want)
        w, idx = chunk
        for t in range(idx.shape[0]):
            got = {int(c) for c, x in zip(idx[t], w[t]) if x > 0}
            assert got == set(r["chunks"][layer][t].tolist())


def _variant(monkeypatch, m, what: str) -> None:
    """Break one rule of the chunk branch (or the routed weights' renormalization) in model m."""
    from minfer import ops
    from minfer.models import grovemoe

    if what == "no_chunk_experts":
        m.group_scale = 0.0
    elif what == "scale_one":
        m.group_scale = 1.0
    elif what in ("chunk_input_h", "routed_no_norm"):        # wrap the two ops.moe_ffn calls of each layer
        real, seen = ops.moe_ffn, {}

        def moe_ffn(h, router, *a, **kw):
            if kw.get("gating") == "topk_softmax":
                return real(seen["h"] if what == "chunk_input_h" else h, router, *a, **kw)
            seen["h"] = h
            if what == "routed_no_norm":
                a = (a[0], a[1], a[2], a[3], False) + a[5:]
            return real(h, router, *a, **kw)
        monkeypatch.setattr(ops, "moe_ffn", moe_ffn)
    else:                                                      # the chunk weights S_c
        def chunk_weights(h, e):
            K, G, Ec = m.cfg.n_experts_used, m.experts_per_group, m.chunk_router.shape[0]
            p = torch.softmax(h.float() @ e.gate_inp.float().t(), -1)
            top = p.topk(K, -1).indices
            c = top % Ec if what == "index_mod" else top // G
            a = p.gather(1, top if what == "hf_weights" else c)    # HF: the slot's routed weight
            if what != "no_chunk_norm":
                a = a / a.sum(-1, keepdim=True).clamp(min=grovemoe.CLAMP)
            S = torch.zeros(h.shape[0], Ec).scatter_add_(1, c, a)
            if what == "dedupe":                               # a chunk chosen by two slots counted once
                S = torch.zeros(h.shape[0], Ec).scatter_reduce_(1, c, a, "amax")
            return S
        monkeypatch.setattr(m, "chunk_weights", chunk_weights)


CHUNK_RULES = ["no_chunk_experts", "scale_one", "chunk_input_h", "hf_weights", "no_chunk_norm", "index_mod", "dedupe"]


@pytest.mark.parametrize("what", CHUNK_RULES + ["routed_no_norm", "no_qk_norm", "normal_rope"])
def test_each_rule_is_needed(monkeypatch, what):
    """The adjugate branch: present, scaled by expert_group_scale (not 1), reading the routed output (not h: the HF
    code's), weighted by p of expert number top // G (not the routed weight: the HF code's), renormalized, grouped
    by top // G (not top % Ec), a chunk chosen twice weighted twice. The routed weights renormalized; Qwen3's q/k
    norms and NEOX rope."""
    from dataclasses import replace

    eng = engine(NAME)
    m = eng.model
    assert miss(eng) < BASE_ERR
    if what == "no_qk_norm":
        for b in m.blocks:
            monkeypatch.setattr(b, "attn_q_norm", torch.ones_like(b.attn_q_norm))
            monkeypatch.setattr(b, "attn_k_norm", torch.ones_like(b.attn_k_norm))
    elif what == "normal_rope":
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, style="normal"))    # (this engine's own cfg)
    else:
        _variant(monkeypatch, m, what)
    assert miss(eng) > 10 * TOL and miss(eng, "lc_logits") > 10 * TOL, what


def test_chunk_width_defaults_to_the_head_size(tmp_path):
    """expert_chunk_feed_forward_length is optional (load_arch_hparams: get_key(..., false)); absent, the chunk
    experts' width is the head size (load_arch_tensors: n_ff_chexp ? n_ff_chexp : n_embd_head_k), 16 here."""
    m = load(rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_keys=(f"{NAME}.expert_chunk_feed_forward_length",)))
    assert tuple(m.moe[0].gate_chexps.shape) == (64, 32)
    from minfer.models import Step
    from minfer.runtime.kv_cache import KVCache

    ids = ref(NAME)["ids"].tolist()
    got = m.forward(torch.tensor(ids), Step.at(0, len(ids), "cpu"), KVCache.for_config(m.cfg, 64)).numpy()
    assert rel_err(got, ref(NAME)["lc_logits"]) < BASE_ERR


@pytest.mark.parametrize("change, match", [
    (dict(drop_keys=(f"{NAME}.experts_per_group",)), rf"{NAME}\.experts_per_group"),
    (dict(drop_keys=(f"{NAME}.expert_group_scale",)), rf"{NAME}\.expert_group_scale"),
    (dict(set_keys={f"{NAME}.experts_per_group": (3, U32)}), "does not divide"),
    (dict(set_keys={f"{NAME}.experts_per_group": (4, U32)}), "expert_used_count=3 > "),
    (dict(set_keys={f"{NAME}.experts_per_group": (0, U32)}), rf"{NAME}\.experts_per_group"),
    (dict(set_keys={f"{NAME}.expert_group_count": (2, U32), f"{NAME}.expert_group_used_count": (1, U32)}),
     "expert_group_count=2"),
    (dict(set_keys={f"{NAME}.expert_weights_scale": (2.5, F32)}), rf"{NAME}\.expert_weights_scale"),
    (dict(set_keys={f"{NAME}.rope.dimension_count": (8, U32)}), "rope.dimension_count=8"),
    (dict(drop_tensors=("blk.1.ffn_up_chexps.weight",)), r"blk\.1\.ffn_up_chexps\.weight"),
    (dict(add_tensors={"blk.0.attn_q.bias": np.zeros(32)}), r"blk\.0\.attn_q\.bias"),
    (dict(add_tensors={"blk.1.exp_probs_b.bias": np.zeros(8)}), r"blk\.1\.exp_probs_b\.bias"),
])
def test_refusals(tmp_path, change, match):
    """What llama.cpp's loader requires (the group keys, the chunk tensors) or cannot run as intended (groups that do
    not divide the experts, more slots than chunk experts, group-limited routing, an expert weight scale, a partial
    rope, attention biases, an expert bias), refused by name rather than run wrongly."""
    with pytest.raises(MinferError, match=match):
        load(rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", **change))


# The CUDA backend's code on the CPU (Triton's interpreter, prefill and the host-free decode step against the
# reference, the paths it must take): tests/ops/test_arch_forward_interpreted.py, which lists this fixture.
