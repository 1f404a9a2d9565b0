"""Snowflake Arctic (minfer/models/arctic.py, GGUF arch `arctic`: snowflake-arctic-instruct / -base) on the CPU's float32
reference, against two references that minfer made neither of: a torch forward of the HF checkpoint written from the
architecture (tools/gen_arctic_fixture.py reference(): the dense residual MLP on the attention's residual, the MoE on
the layer INPUT's own norm, softmax top-2 renormalized), and llama.cpp's own logits (llama-cpp-python 0.3.36, an F32
copy of the file, F32 KV cache). transformers 5.25 has no Arctic class (remote code only). This file: the layout,
each rule of the graph needed (with one changed the logits miss both references by more than 10x the tolerance), the
expert choices, the keys llama.cpp's arctic graph does not read (measured) refused, the loader's refusals.

Fixture: tests/data/arch/arctic.{gguf,npz,json} (tools/gen_arctic_fixture.py build + goldens): hidden 32, 4 heads of 8
over 2 kv heads, NORM rope (the converter permutes q/k), 2 layers, each a residual SwiGLU MLP of width 32 and 8
experts of width 16, top-2; vocab 320, untied output, converted by llama.cpp's convert_hf_to_gguf.py (ArcticModel).

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

NAME = "arctic"
BASE_ERR = 5e-6      # the fixture's float32 misses: 2.0e-6 (reference), 2.8e-6 (llama.cpp); they agree to 9.9e-7
U32, F32, BOOL = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.BOOL


def miss(eng, key: str = "logits") -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r[key])


def forward(m, ids) -> np.ndarray:
    from minfer.models import Step
    from minfer.runtime.kv_cache import KVCache

    return m.forward(torch.tensor(ids), Step.at(0, len(ids), "cpu"), KVCache.for_config(m.cfg, 64)).numpy()


def test_layout_read_from_the_file():
    from minfer.models.arctic import ArcticModel

    eng = engine(NAME)
    m, c = eng.model, eng.model.cfg
    assert type(m) is ArcticModel and c.arch == NAME
    assert (c.head_dim, c.n_heads, c.n_kv_heads, c.d_model, c.vocab, c.n_layers, c.ffn) == (8, 4, 2, 32, 320, 2, 16)
    assert c.rope.style == "normal" and c.rope.n_rot == 8 and c.rope.theta == 1e4 and c.rms_eps == pytest.approx(1e-5)
    assert (c.n_experts, c.n_experts_used) == (8, 2) and c.expert_gating == "softmax" and m.weights_norm is True
    assert not c.tied_output and m.output is not m.token_embd
    b, e = m.blocks[0], m.moe[0]
    assert tuple(b.attn_q.shape) == (32, 32) and tuple(b.attn_k.shape) == (16, 32) and b.attn_q_bias is None
    assert tuple(b.ffn_gate.shape) == (32, 32) and tuple(b.ffn_down.shape) == (32, 32)      # the residual MLP: D x D
    assert tuple(e.gate_inp.shape) == (8, 32) and tuple(e.gate_exps.shape) == (8 * 16, 32) and e.gate_exps.n_experts == 8
    assert tuple(e.down_exps.shape) == (8 * 32, 16) and e.ffn_norm_exps.shape == (32,)
    assert not torch.equal(e.ffn_norm_exps, b.ffn_norm)
    hf = json.loads((DATA / f"{NAME}.json").read_text())
    assert hf["config"]["architectures"] == ["ArcticForCausalLM"] and hf["config"]["parallel_attn_mlp_res"] is True
    assert hf["experts_used_per_layer"] == [8, 8]           # routing not degenerate: every expert chosen somewhere


def test_the_two_references_agree():
    r = ref(NAME)
    assert rel_err(r["lc_logits"], r["logits"]) < BASE_ERR
    assert r["lc_greedy"].tolist() == r["greedy"].tolist()


def test_logits_within_the_base_error():
    eng = engine(NAME)
    assert miss(eng) < BASE_ERR and miss(eng, "lc_logits") < BASE_ERR


def test_expert_choices_are_the_references():
    from minfer.ops import reference

    r = ref(NAME)
    got, route = [], reference.route

    def record(*a, **kw):
        w, idx = route(*a, **kw)
        got.append(idx.sort(-1).values)
        return w, idx

    eng = engine(NAME)
    reference.route = record
    try:
        eng.logits(r["ids"].tolist())
    finally:
        reference.route = route
    assert len(got) == 2                                    # one routing per layer
    for g, want in zip(got, r["choices"]):
        assert torch.equal(g, torch.from_numpy(np.sort(want.astype(np.int64), -1)))
    assert all(len({tuple(row.tolist()) for row in g}) > 6 for g in got)     # the top-2 of 8 varies by token


def _route_variant(what: str):
    from minfer.ops import reference

    route = reference.route

    def changed(h, router, k, norm_weights, router_bias=None, gating="softmax", select_bias=None, n_group=1,
                topk_group=1, weights_scale=1.0):
        change = dict(sigmoid=dict(gating="sigmoid"), no_renorm=dict(norm_weights=False), top3=dict(k=3))[what]
        args = dict(k=k, norm_weights=norm_weights, router_bias=router_bias, gating=gating, select_bias=select_bias,
                    n_group=n_group, topk_group=topk_group, weights_scale=weights_scale) | change
        return route(h, router, args.pop("k"), **args)
    return changed


ROUTING = ["sigmoid", "no_renorm", "top3"]


@pytest.mark.parametrize("what", ROUTING + ["neox_rope", "moe_reads_attn_residual", "mlp_reads_layer_input",
                                            "norms_swapped", "no_residual_mlp", "ffn_norm_exps_ones"])
def test_each_rule_is_needed(monkeypatch, what):
    """Routing: softmax (not sigmoid), renormalized top-k (llama.cpp's norm_w = true), top-2 (expert_used_count).
    Attention: NORM rope on the converter's permuted q/k (not NEOX). The parallel block: the MoE reads the norm of
    the layer INPUT (not of x + attn, as a sequential block would), the residual MLP the norm of x + attn (not of the
    input), each with its own norm (ffn_norm_exps for the MoE, ffn_norm for the MLP), the residual MLP itself, and
    ffn_norm_exps' weight."""
    from minfer import ops
    from minfer.models import arctic
    from minfer.ops import reference

    eng = engine(NAME)
    m, c = eng.model, eng.model.cfg
    assert miss(eng) < BASE_ERR
    if what in ROUTING:
        monkeypatch.setattr(reference, "route", _route_variant(what))
    elif what == "neox_rope":
        object.__setattr__(c, "rope", replace(c.rope, style="neox"))       # (this engine's own cfg)
    elif what in ("moe_reads_attn_residual", "mlp_reads_layer_input"):
        attn_norm, ffn, seen = arctic.attention_residual_norm, type(m).ffn, {}

        def attn(h, blk, cfg, cache, i, step, ctx, x, weight, eps, act):
            out, hn = attn_norm(h, blk, cfg, cache, i, step, ctx, x, weight, eps, act)
            seen["x"] = out                                                 # x + attn
            if what == "mlp_reads_layer_input":
                hn = ops.rms_norm(x, weight, eps).to(act)                   # the MLP on the input's norm
            return out, hn

        def moe(self, h, e, ctx):                                           # the MoE on the norm of x + attn
            return ffn(self, ops.rms_norm(seen["x"], e.ffn_norm_exps, c.rms_eps).to(h.dtype), e, ctx)

        monkeypatch.setattr(arctic, "attention_residual_norm", attn)
        if what == "moe_reads_attn_residual":
            monkeypatch.setattr(type(m), "ffn", moe)
    elif what == "norms_swapped":
        for b, e in zip(m.blocks, m.moe):
            a, n = b.ffn_norm, e.ffn_norm_exps
            monkeypatch.setattr(b, "ffn_norm", n)
            monkeypatch.setattr(e, "ffn_norm_exps", a)
    elif what == "no_residual_mlp":
        monkeypatch.setattr(arctic, "ffn_branch", lambda h, blk, ctx: torch.zeros_like(h))
    else:
        for e in m.moe:
            monkeypatch.setattr(e, "ffn_norm_exps", torch.ones_like(e.ffn_norm_exps))
    a, b = miss(eng), miss(eng, "lc_logits")
    assert a > 10 * TOL and b > 10 * TOL, what


IGNORED = {"expert_weights_scale": (2.5, F32), "expert_weights_norm": (False, BOOL), "expert_gating_func": (2, U32)}


@pytest.mark.parametrize("key", sorted(IGNORED))
def test_keys_the_graph_does_not_read_are_refused(tmp_path, key):
    """llama.cpp's arctic graph reads none of these (its logits on a copy with the key set are the file's own:
    measured by the generator's goldens step into arctic.json), so a file asking for a scale, no renormalization or
    sigmoid gating is a model llama.cpp would run otherwise than written: refused by name."""
    value, vtype = IGNORED[key]
    meta = json.loads((DATA / f"{NAME}.json").read_text())
    assert meta["llamacpp_ignores"][f"{NAME}.{key}={value}"] == 0.0
    with pytest.raises(MinferError, match=rf"{NAME}\.{key}"):
        load(rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", set_keys={f"{NAME}.{key}": (value, vtype)}))


@pytest.mark.parametrize("keys", [{"expert_weights_scale": (1.0, F32)}, {"expert_weights_scale": (0.0, F32)},
                                  {"expert_weights_norm": (True, BOOL)}, {"expert_gating_func": (1, U32)}])
def test_values_the_graph_runs_are_accepted(tmp_path, keys):
    """The same keys at the values llama.cpp's graph has (scale 1 or 0: none; renormalized; softmax) load and give
    llama.cpp's logits."""
    r = ref(NAME)
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "ok.gguf", set_keys={f"{NAME}.{k}": v for k, v in keys.items()})
    assert rel_err(forward(load(p), r["ids"][:8].tolist()), r["lc_logits"][:8]) < BASE_ERR


def test_qkv_biases_are_optional(tmp_path):
    """create_tensor_qkv loads q/k/v biases when present (TENSOR_NOT_REQUIRED) and build_qkv adds them: a copy with a
    bias on v shifts the logits; zero biases leave them as they were."""
    r, ids = ref(NAME), ref(NAME)["ids"][:8].tolist()
    zero = {f"blk.{i}.attn_{w}.bias": np.zeros(32 if w == "q" else 16) for i in range(2) for w in "qkv"}
    m = load(rewrite(DATA / f"{NAME}.gguf", tmp_path / "zero.gguf", add_tensors=zero))
    assert m.blocks[0].attn_v_bias is not None
    assert rel_err(forward(m, ids), r["lc_logits"][:8]) < BASE_ERR
    some = dict(zero) | {"blk.0.attn_v.bias": np.full(16, 0.5)}
    assert rel_err(forward(load(rewrite(DATA / f"{NAME}.gguf", tmp_path / "b.gguf", add_tensors=some)), ids),
                   r["lc_logits"][:8]) > 10 * TOL


def test_tied_output_falls_back_to_the_embedding(tmp_path):
    """No output.weight: the lm head is token_embd (load_arch_tensors: TENSOR_NOT_REQUIRED, then TENSOR_DUPLICATED)."""
    m = load(rewrite(DATA / f"{NAME}.gguf", tmp_path / "tied.gguf", drop_tensors=("output.weight",)))
    assert m.cfg.tied_output and m.output is m.token_embd
    ids = ref(NAME)["ids"][:4].tolist()
    assert rel_err(forward(m, ids), forward(load(DATA / f"{NAME}.gguf"), ids)) > 10 * TOL


@pytest.mark.parametrize("change, match", [
    (dict(drop_tensors=("blk.1.ffn_norm_exps.weight",)), r"blk\.1\.ffn_norm_exps\.weight"),
    (dict(drop_tensors=("blk.0.ffn_gate.weight",)), r"blk\.0\.ffn_gate\.weight"),
    (dict(drop_tensors=("blk.0.ffn_gate_exps.weight",)), r"blk\.0\.ffn_gate_exps\.weight"),
    (dict(drop_tensors=("blk.1.ffn_gate_inp.weight",)), r"blk\.1\.ffn_gate_inp\.weight"),
    (dict(drop_tensors=("blk.0.attn_k.weight",)), r"blk\.0\.attn_k\.weight"),
    (dict(add_tensors={"blk.0.attn_qkv.weight": np.zeros((64, 32))}), r"blk\.0\.attn_qkv\.weight.*fused"),
    (dict(add_tensors={"blk.0.attn_output.bias": np.zeros(32)}), r"blk\.0\.attn_output\.bias"),
    (dict(add_tensors={"blk.0.attn_q_norm.weight": np.ones(8)}), r"blk\.0\.attn_q_norm\.weight"),
    (dict(add_tensors={"rope_freqs.weight": np.ones(4)}), r"rope_freqs\.weight"),
    (dict(add_tensors={"blk.1.ffn_gate_shexp.weight": np.zeros((16, 32))}), r"blk\.1\.ffn_gate_shexp\.weight"),
    (dict(add_tensors={"blk.1.exp_probs_b.bias": np.zeros(8)}), r"blk\.1\.exp_probs_b\.bias"),
    (dict(drop_keys=(f"{NAME}.expert_count",)), rf"{NAME}\.expert_count"),
    (dict(drop_keys=(f"{NAME}.expert_used_count",)), rf"{NAME}\.expert_used_count"),
    (dict(set_keys={f"{NAME}.expert_used_count": (9, U32)}), "expert_used_count=9"),
    (dict(drop_keys=(f"{NAME}.feed_forward_length",)), rf"{NAME}\.feed_forward_length"),
    (dict(set_keys={f"{NAME}.feed_forward_length": (32, U32)}), r"ffn_gate_exps\.weight.*shape"),
    (dict(set_keys={f"{NAME}.expert_group_count": (2, U32), f"{NAME}.expert_group_used_count": (1, U32)}),
     "expert_group_count=2"),
    (dict(set_keys={f"{NAME}.rope.dimension_count": (4, U32)}), "rope.dimension_count=4"),
    (dict(set_keys={f"{NAME}.attention.key_length": (16, U32), f"{NAME}.attention.value_length": (16, U32),
                    f"{NAME}.rope.dimension_count": (16, U32)}), "head size 16 != embedding_length 32"),
])
def test_refusals(tmp_path, change, match):
    """What llama.cpp's loader requires (the MoE norm, the residual MLP, the experts, the router, q/k/v, the expert
    keys and the experts' width) or never creates (a fused attn_qkv here, attn_output.bias, q/k norms, rope_freqs, a
    shared expert, a selection bias), what its graph cannot do (expert groups: Arctic has none; a rope narrower than
    the head, heads not tiling the embedding), refused by name."""
    with pytest.raises(MinferError, match=match):
        load(rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", **change))
