"""Tencent Hy3 (minfer/models/hy_v3.py) on the CPU's float32 reference: the layout read from the file (dense or
MoE per layer by its router tensor, the selection bias under hy_v3's own name), the MoE against a float64 formula
of llama.cpp's build_moe_ffn rule, each rule needed (with one changed the logits miss transformers' by more than
10x the tolerance), absent optional keys taking llama.cpp's values, what the model needs refused by name. The
logits, greedy continuation, KV cache in pieces and paged cache are test_arch_vs_transformers' (name "hy_v3").
Fixture: tests/data/arch/hy_v3.gguf (tools/gen_arch_fixtures.py: transformers' HYV3ForCausalLM converted by
llama.cpp's convert_hf_to_gguf.py)."""

from __future__ import annotations

from dataclasses import replace

import gguf
import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, reference_switches, rel_err, rewrite

NAME = "hy_v3"


def miss(eng) -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def tensor(name: str) -> np.ndarray:
    t = next(t for t in gguf.GGUFReader(str(DATA / f"{NAME}.gguf")).tensors if t.name == name)
    return np.asarray(t.data, dtype=np.float32)


def test_layout_read_from_the_file():
    m = engine(NAME).model
    c = m.cfg
    assert (c.head_dim, c.n_heads, c.n_kv_heads, c.d_model, c.ffn, c.n_layers) == (16, 4, 2, 64, 96, 3)
    assert [e is None for e in m.moe] == [True, False, False]     # no ffn_gate_inp on layer 0: dense
    assert c.leading_dense_blocks == 0                              # the converter writes no such key
    assert (c.n_experts, c.n_experts_used, c.expert_ffn, c.expert_groups) == (8, 2, 24, 1)
    assert c.expert_gating == "sigmoid" and c.expert_weights_scale == 2.5 and m.weights_norm
    e = m.moe[1]
    assert e.gate_shexp.shape == (24, 64) and e.exp_probs_b.shape == (8,)
    # the selection bias is the file's blk.N.exp_probs_b (no .bias suffix), not zeros
    assert torch.equal(e.exp_probs_b, torch.from_numpy(tensor("blk.1.exp_probs_b")))
    assert e.exp_probs_b.abs().max() > 0.1
    assert c.rope.style == "neox" and c.rope.n_rot == 16 and c.rope.freq_factors is None
    b = m.blocks[2]
    assert b.attn_q_norm.shape == (16,) and b.attn_k_norm.shape == (16,) and b.attn_q_bias is None
    assert miss(engine(NAME)) < TOL


def test_moe_in_float64():
    """build_moe_ffn(sigmoid, exp_probs_b, norm_w, scale) plus the shared expert, in float64."""
    m = engine(NAME).model
    e, c = m.moe[2], m.cfg
    E, F, D = c.n_experts, c.expert_ffn, c.d_model
    torch.manual_seed(5)
    h = torch.randn(6, D)
    gate = e.gate_exps.dense.double().view(E, F, D)
    up = e.up_exps.dense.double().view(E, F, D)
    down = e.down_exps.dense.double().view(E, D, F)
    p = torch.sigmoid(h.double() @ e.gate_inp.double().T)                     # (T, E)
    idx = (p + e.exp_probs_b.double()).topk(c.n_experts_used, dim=-1)[1]
    w = p.gather(1, idx)
    w = w / w.sum(-1, keepdim=True) * c.expert_weights_scale
    want = torch.zeros(6, D, dtype=torch.float64)
    for t in range(6):
        x = h[t].double()
        for j in range(c.n_experts_used):
            k = idx[t, j]
            want[t] += w[t, j] * (down[k] @ (torch.nn.functional.silu(gate[k] @ x) * (up[k] @ x)))
        z = torch.nn.functional.silu(e.gate_shexp.dense.double() @ x) * (e.up_shexp.dense.double() @ x)
        want[t] += e.down_shexp.dense.double() @ z
    got = m.ffn(h, e, None).double()
    err = ((got - want).abs().max() / want.abs().max()).item()
    assert err < 1e-5, err
    e.exp_probs_b = None                      # the choice without the selection bias misses the formula
    got = m.ffn(h, e, None).double()
    assert ((got - want).abs().max() / want.abs().max()).item() > 0.05


@pytest.mark.parametrize("what", ["no_q_norm", "no_k_norm", "adjacent_pairs", "softmax", "no_select_bias",
                                  "no_renorm", "no_scale", "no_shared", "moe_on_layer0"])
def test_each_rule_is_needed(what):
    eng = engine(NAME)
    m = eng.model
    c = m.cfg
    if what == "no_q_norm":
        for b in m.blocks:
            b.attn_q_norm = torch.ones_like(b.attn_q_norm)
    elif what == "no_k_norm":
        for b in m.blocks:
            b.attn_k_norm = torch.ones_like(b.attn_k_norm)
    elif what == "adjacent_pairs":
        m.cfg = replace(c, rope=replace(c.rope, style="normal"))
    elif what == "softmax":
        m.cfg = replace(c, expert_gating="softmax")
    elif what == "no_select_bias":
        for e in m.moe[1:]:
            e.exp_probs_b = None
    elif what == "no_renorm":
        m.weights_norm = False
    elif what == "no_scale":
        m.cfg = replace(c, expert_weights_scale=1.0)
    elif what == "no_shared":
        for e in m.moe[1:]:
            e.gate_shexp = None
    else:                                  # layer 0's dense MLP replaced by layer 1's MoE
        m.moe = [m.moe[1]] + m.moe[1:]
    assert miss(eng) > 10 * TOL, what


@pytest.mark.parametrize("tensor_name", ["blk.1.attn_q_norm.weight", "blk.2.attn_k_norm.weight", "blk.0.ffn_norm.weight",
                                         "blk.0.ffn_gate.weight", "blk.1.ffn_up_shexp.weight",
                                         "blk.2.ffn_down_shexp.weight", "blk.2.ffn_down_exps.weight",
                                         "blk.1.ffn_gate_exps.weight", "output_norm.weight"])
def test_missing_tensor_is_named(tmp_path, tensor_name):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_tensors=(tensor_name,))
    with pytest.raises(MinferError, match=tensor_name.replace(".", r"\.")):
        load(p)


def test_a_layer_without_its_router_is_read_as_dense(tmp_path):
    """hy-v3.cpp decides dense or MoE by ffn_gate_inp alone: without it, layer 1 asks for the dense FFN."""
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_tensors=("blk.1.ffn_gate_inp.weight",))
    with pytest.raises(MinferError, match=r"blk\.1\.ffn_gate\.weight"):
        load(p)


@pytest.mark.parametrize("key", ["hy_v3.expert_count", "hy_v3.expert_used_count", "hy_v3.expert_feed_forward_length"])
def test_missing_key_is_named(tmp_path, key):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_keys=(key,))
    with pytest.raises(MinferError, match=key.replace(".", r"\.")):
        load(p)


def test_absent_optional_keys_and_tensors_take_llamacpps_values(tmp_path):
    """No expert_gating_func: sigmoid (hy-v3.cpp's default), the logits unchanged; no expert_weights_norm: not
    renormalized (llama.cpp's hparams default), which misses; no expert_shared_feed_forward_length: the shared
    expert is expert_feed_forward_length wide (as the fixture's); no exp_probs_b: the choice on the scores."""
    from minfer.runtime.engine import Engine

    def eng(**kw):
        return Engine.load(rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", **kw), ctx=64, progress=False,
                           switches=reference_switches())

    e = eng(drop_keys=("hy_v3.expert_gating_func", "hy_v3.expert_shared_feed_forward_length"))
    assert e.model.cfg.expert_gating == "sigmoid" and e.model.moe[1].gate_shexp.shape == (24, 64)
    assert miss(e) < TOL
    e = eng(drop_keys=("hy_v3.expert_weights_norm",))
    assert not e.model.weights_norm and miss(e) > 10 * TOL
    e = eng(drop_tensors=("blk.1.exp_probs_b", "blk.2.exp_probs_b"))
    assert e.model.moe[1].exp_probs_b is None and e.model.moe[2].exp_probs_b is None
    assert miss(e) > 10 * TOL
    e = eng(set_keys={"hy_v3.expert_gating_func": (1, gguf.GGUFValueType.UINT32)})
    assert e.model.cfg.expert_gating == "softmax" and miss(e) > 10 * TOL


def test_selection_bias_under_another_name_refused(tmp_path):
    """blk.N.exp_probs_b.bias is other archs' name (tn(..., "bias", i)); hy-v3.cpp loads blk.N.exp_probs_b."""
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_tensors=("blk.1.exp_probs_b",),
                add_tensors={"blk.1.exp_probs_b.bias": tensor("blk.1.exp_probs_b")})
    with pytest.raises(MinferError, match=r"blk\.1\.exp_probs_b\.bias"):
        load(p)


def test_dense_and_moe_on_one_layer_refused(tmp_path):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf",
                add_tensors={"blk.1.ffn_gate.weight": np.zeros((96, 64), np.float32)})
    with pytest.raises(MinferError, match=r"blk\.1\.ffn_gate\.weight"):
        load(p)


def test_partial_rope_refused(tmp_path):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf",
                set_keys={"hy_v3.rope.dimension_count": (8, gguf.GGUFValueType.UINT32)})
    with pytest.raises(MinferError, match=r"hy_v3\.rope\.dimension_count"):
        load(p)


def test_bad_expert_counts_named(tmp_path):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf",
                set_keys={"hy_v3.expert_used_count": (9, gguf.GGUFValueType.UINT32)})
    with pytest.raises(MinferError, match=r"expert_used_count=9"):
        load(p)
