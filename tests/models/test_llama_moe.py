"""Mixtral: the `llama` arch with experts (minfer/models/llama_moe.py) against transformers, on the CPU's float32
reference: each rule of the MoE needed (with one changed the logits miss by more than 10x the tolerance), the
keys llama.cpp's llama loader does not read ignored, the dense llama path untouched, and what the model cannot
run refused by name. The logits, greedy continuation, KV cache in pieces and paged cache are
test_arch_vs_transformers' (name "mixtral"). Fixture: tests/data/arch/mixtral.gguf (tools/gen_arch_fixtures.py:
transformers' MixtralForCausalLM, top-2 of 8 experts of 32, GQA 2:1, converted by llama.cpp's
convert_hf_to_gguf.py, which writes it as `llama`)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, reference_switches, rewrite

NAME = "mixtral"
SRC = DATA / f"{NAME}.gguf"
E, K, F, D, LAYERS = 8, 2, 32, 64, 2


def miss(eng) -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def load_engine(path):
    from minfer.runtime.engine import Engine

    return Engine.load(path, ctx=64, progress=False, switches=reference_switches())


def test_layout_read_from_the_file():
    from minfer.models.llama_moe import LlamaMoeModel

    eng = engine(NAME)
    m, c = eng.model, eng.model.cfg
    assert type(m) is LlamaMoeModel and c.arch == "llama"
    assert (c.n_experts, c.n_experts_used, c.ffn, c.expert_ffn) == (E, K, F, 0)   # the experts' width: n_ff
    assert c.rope.style == "normal" and c.rope.theta == 1e6 and not c.tied_output
    assert m.weights_norm is True
    assert len(m.moe) == LAYERS and all(b.ffn_gate is None for b in m.blocks)
    e = m.moe[0]
    assert e.gate_inp.shape == (E, D) and e.gate_exps.shape == (E * F, D) and e.down_exps.shape == (E * D, F)
    assert e.gate_shexp is None
    assert miss(eng) < TOL


def test_dense_llama_paths_unchanged():
    """A llama file without experts still loads as LlamaModel (and one with biases as LlamaBiasModel)."""
    from minfer.models.llama import LlamaModel
    from minfer.models.llama_bias import LlamaBiasModel

    assert type(engine("llama3").model) is LlamaModel
    assert type(engine("internlm3-bias").model) is LlamaBiasModel


@pytest.mark.parametrize("what", ["no_renorm", "top1", "top3", "all_experts", "sigmoid_router", "expert_order",
                                  "neox"])
def test_each_rule_is_needed(monkeypatch, what):
    """The top-K weights renormalized over the K (norm_w), K = expert_used_count (not 1, 3 or all 8), the router's
    softmax (a sigmoid picks the same experts but weighs them otherwise), each expert matched to its router row
    (the stacked experts in reverse order), NORM rope (not NEOX halves)."""
    from dataclasses import replace

    from minfer import ops

    eng = engine(NAME)
    m = eng.model
    assert miss(eng) < TOL
    if what == "no_renorm":
        monkeypatch.setattr(m, "weights_norm", False)
    elif what in ("top1", "top3", "all_experts"):
        k = {"top1": 1, "top3": 3, "all_experts": E}[what]
        object.__setattr__(m.cfg, "n_experts_used", k)     # (this engine's own cfg)
    elif what == "sigmoid_router":
        monkeypatch.setattr(m, "ffn", lambda h, e, ctx: ops.moe_ffn(
            h, e.gate_inp, e.gate_exps, e.up_exps, e.down_exps, K, True, ctx, gating="sigmoid"))
    elif what == "expert_order":
        for e in m.moe:        # the float32 reference multiplies by the dense copies (cpu_experts.densify_experts)
            for w in (e.gate_exps, e.up_exps, e.down_exps):
                d = w.dense
                monkeypatch.setattr(w, "dense", d.view(E, -1, d.shape[1]).flip(0).reshape(d.shape))
    else:
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, style="neox"))
    err = miss(eng)
    assert err > 10 * TOL, (what, err)


def test_moe_layer_equals_the_float64_formula():
    """Layer 0's FFN against softmax -> top-2 -> renormalize -> sum of SwiGLU experts in float64 (HF
    MixtralSparseMoeBlock's formula; llama.cpp build_moe_ffn with norm_w)."""
    m = engine(NAME).model
    e = m.moe[0]
    h = torch.randn(7, D, generator=torch.Generator().manual_seed(0))
    got = m.ffn(h, e, None).double()
    p = torch.softmax(h.double() @ e.gate_inp.double().T, -1)
    w, idx = p.topk(K, -1)
    w = w / w.sum(-1, keepdim=True)
    g, u, dn = (x.dense.double().view(E, -1, x.dense.shape[1]) for x in (e.gate_exps, e.up_exps, e.down_exps))
    want = torch.zeros(7, D, dtype=torch.float64)
    for t in range(7):
        for j in range(K):
            x = idx[t, j]
            a = torch.nn.functional.silu(g[x] @ h[t].double()) * (u[x] @ h[t].double())
            want[t] += w[t, j] * (dn[x] @ a)
    assert float((got - want).abs().max() / want.abs().max()) < 1e-5


@pytest.mark.parametrize("key,value,vtype", [
    ("llama.expert_weights_norm", False, gguf.GGUFValueType.BOOL),
    ("llama.expert_weights_scale", 2.5, gguf.GGUFValueType.FLOAT32),
    ("llama.expert_shared_feed_forward_length", 48, gguf.GGUFValueType.UINT32),
    ("llama.expert_feed_forward_length", 16, gguf.GGUFValueType.UINT32)])
def test_keys_the_llama_loader_does_not_read_are_ignored(tmp_path, key, value, vtype):
    """llama.cpp's llama graph fixes norm_w = true; its loader reads no expert_weights_norm, expert_weights_scale,
    expert_shared_feed_forward_length nor expert_feed_forward_length (the experts are n_ff wide): a file carrying
    them runs as without them."""
    p = rewrite(SRC, tmp_path / "k.gguf", set_keys={key: (value, vtype)})
    eng = load_engine(p)
    assert miss(eng) < TOL


def test_old_per_expert_layout_is_refused_by_name(tmp_path):
    """The pre-2024 layout (blk.N.ffn_gate.E.weight, one tensor per expert): llama.cpp's loader no longer takes it."""
    rd = gguf.GGUFReader(str(SRC))
    t = {x.name: np.asarray(x.data, dtype=np.float32) for x in rd.tensors}
    drop, add = [], {}
    for i in range(LAYERS):
        for w in ("ffn_gate", "ffn_up", "ffn_down"):
            name = f"blk.{i}.{w}_exps.weight"
            drop.append(name)
            for x in range(E):
                add[f"blk.{i}.{w}.{x}.weight"] = t[name][x]
    p = rewrite(SRC, tmp_path / "old.gguf", drop_tensors=tuple(drop), add_tensors=add)
    with pytest.raises(MinferError, match=r"'blk\.0\.ffn_gate\.0\.weight' is the old per-expert layout"):
        load(p)


@pytest.mark.parametrize("tensor", ["blk.1.ffn_gate_inp.weight", "blk.0.ffn_gate_exps.weight",
                                    "blk.1.ffn_up_exps.weight", "blk.0.ffn_down_exps.weight"])
def test_missing_expert_tensor_is_named(tmp_path, tensor):
    p = rewrite(SRC, tmp_path / "m.gguf", drop_tensors=(tensor,))
    with pytest.raises(MinferError, match=f"tensor '{tensor}' is missing"):
        load(p)


def test_missing_expert_used_count_is_named(tmp_path):
    p = rewrite(SRC, tmp_path / "u.gguf", drop_keys=("llama.expert_used_count",))
    with pytest.raises(MinferError, match="llama.expert_used_count"):
        load(p)


def test_expert_groups_and_attention_biases_are_refused(tmp_path):
    p = rewrite(SRC, tmp_path / "g.gguf", set_keys={"llama.expert_group_count": (2, gguf.GGUFValueType.UINT32),
                                                   "llama.expert_group_used_count": (1, gguf.GGUFValueType.UINT32)})
    with pytest.raises(MinferError, match="llama.expert_group_count=2"):
        load(p)
    p = rewrite(SRC, tmp_path / "b.gguf", add_tensors={"blk.1.attn_q.bias": np.zeros(D)})
    with pytest.raises(MinferError, match=r"'blk\.1\.attn_q\.bias' is not supported"):
        load(p)
