"""DBRX (minfer/models/dbrx.py) on the CPU's float32 reference: each rule needed (with one changed the logits miss
by more than 10x the tolerance), the MoE against a float64 formula of llama.cpp's rule, what the model needs
refused by name when missing. The logits, greedy continuation, KV cache in pieces and paged cache are
test_arch_vs_transformers' (name "dbrx"). Fixture: tests/data/arch/dbrx.gguf (tools/gen_arch_fixtures.py:
transformers' DbrxForCausalLM, clip_qkv 0.3 so the clamp binds, converted by llama.cpp's convert_hf_to_gguf.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

NAME = "dbrx"


def miss(eng) -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def test_layout_read_from_the_file():
    eng = engine(NAME)
    m, c = eng.model, eng.model.cfg
    assert (c.head_dim, c.n_heads, c.n_kv_heads, c.d_model, c.ffn) == (16, 4, 2, 64, 32)
    assert (c.n_experts, c.n_experts_used) == (4, 2) and m.weights_norm
    assert c.rope.style == "neox" and c.rope.n_rot == 16 and c.rms_eps == pytest.approx(1e-5)
    assert abs(m.clip - 0.3) < 1e-6 and m.blocks[0].attn_qkv.shape == (128, 64)
    assert m.output is not m.token_embd
    assert miss(eng) < TOL


def test_moe_is_softmax_topk_renormalized_in_float64():
    """build_moe_ffn(..., norm_w = true, gating SOFTMAX): the top-2 of softmax(W_r h), renormalized, each
    expert W_down(silu(W_gate h) * W_up h)."""
    m = engine(NAME).model
    e, c = m.moe[1], m.cfg
    E, F, D = c.n_experts, c.ffn, c.d_model
    torch.manual_seed(3)
    h = torch.randn(6, D)
    gate = e.gate_exps.dense.double().view(E, F, D)
    up = e.up_exps.dense.double().view(E, F, D)
    down = e.down_exps.dense.double().view(E, D, F)
    p = torch.softmax(h.double() @ e.gate_inp.double().T, -1)
    w3, idx3 = torch.topk(p, 3, dim=-1)
    assert (w3[:, 1] - w3[:, 2]).min() > 1e-4          # no near-tie in the choice
    w, idx = w3[:, :2] / w3[:, :2].sum(-1, keepdim=True), idx3[:, :2]
    want = torch.zeros(6, D, dtype=torch.float64)
    for t in range(6):
        for j in range(2):
            x = idx[t, j]
            z = torch.nn.functional.silu(gate[x] @ h[t].double()) * (up[x] @ h[t].double())
            want[t] += w[t, j] * (down[x] @ z)
    got = m.ffn(h, e, None).double()
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-5


@pytest.mark.parametrize("what", ["no_clip", "rms_norm", "no_renorm", "adjacent_pairs"])
def test_each_rule_is_needed(monkeypatch, what):
    eng = engine(NAME)
    m = eng.model
    if what == "no_clip":
        m.clip = 0.0
    elif what == "rms_norm":     # RMSNorm instead of LayerNorm (LLM_NORM removes the mean)
        from minfer import ops
        monkeypatch.setattr(ops, "layer_norm", lambda x, w, eps, out_dtype=None: ops.rms_norm(x, w, eps).to(
            out_dtype or x.dtype))
    elif what == "no_renorm":
        m.weights_norm = False
    else:
        m.cfg = replace(m.cfg, rope=replace(m.cfg.rope, style="normal"))
    assert miss(eng) > 10 * TOL


@pytest.mark.parametrize("tensor", ["blk.1.attn_qkv.weight", "blk.0.attn_output_norm.weight", "blk.1.attn_norm.weight",
                                    "output.weight", "output_norm.weight", "blk.0.ffn_gate_inp.weight",
                                    "blk.1.ffn_up_exps.weight"])
def test_missing_tensor_is_named(tmp_path, tensor):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_tensors=(tensor,))
    with pytest.raises(MinferError, match=tensor.replace(".", r"\.")):
        load(p)


@pytest.mark.parametrize("key", ["dbrx.expert_count", "dbrx.expert_used_count", "dbrx.attention.layer_norm_epsilon"])
def test_missing_key_is_named(tmp_path, key):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_keys=(key,))
    with pytest.raises(MinferError, match=key.replace(".", r"\.")):
        load(p)


@pytest.mark.parametrize("tensor,shape", [("blk.0.attn_qkv.bias", (128,)), ("blk.1.attn_q.weight", (64, 64)),
                                          ("blk.0.attn_norm.bias", (64,))])
def test_biases_and_split_qkv_refused(tmp_path, tensor, shape):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", add_tensors={tensor: np.zeros(shape, np.float32)})
    with pytest.raises(MinferError, match=tensor.replace(".", r"\.")):
        load(p)


@pytest.mark.parametrize("key,value", [("dbrx.expert_weights_scale", 2.0), ("dbrx.attention.clamp_kqv", float("nan"))])
def test_bad_keys_refused(tmp_path, key, value):
    import gguf

    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", set_keys={key: (value, gguf.GGUFValueType.FLOAT32)})
    with pytest.raises(MinferError, match=key.replace(".", r"\.")):
        load(p)
