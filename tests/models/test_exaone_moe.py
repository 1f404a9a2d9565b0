"""LG K-EXAONE (minfer/models/exaone_moe.py) on the CPU's float32 reference: the layer pattern read from the
file, the MoE against a float64 formula of llama.cpp's build_moe_ffn rule, each rule needed (with one changed
the logits miss by more than 10x the tolerance), absent optional keys taking llama.cpp's / HF's values, what
the model needs refused by name. The logits, greedy continuation, KV cache in pieces and paged cache are
test_arch_vs_transformers' (name "exaone-moe"). Fixture: tests/data/arch/exaone-moe.gguf (tools/
gen_arch_fixtures.py: transformers' ExaoneMoeForCausalLM converted by llama.cpp's convert_hf_to_gguf.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

NAME = "exaone-moe"


def miss(eng) -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def test_layout_read_from_the_file():
    m = engine(NAME).model
    c = m.cfg
    assert (c.head_dim, c.n_heads, c.n_kv_heads, c.d_model, c.ffn, c.n_layers) == (16, 4, 2, 64, 96, 4)
    assert m.is_local == (True, False, True, False) and m.use_rope == m.is_local and m.window == 8
    assert [e is None for e in m.moe] == [True, False, False, False]        # leading_dense_block_count 1
    assert (c.n_experts, c.n_experts_used, c.expert_ffn, c.expert_groups, c.expert_groups_used) == (8, 2, 32, 2, 1)
    assert c.expert_gating == "sigmoid" and c.expert_weights_scale == 2.5 and m.weights_norm
    assert m.moe[1].gate_shexp.shape[0] == 32 and m.moe[1].exp_probs_b.shape == (8,)
    assert c.rope.style == "neox" and c.rope.n_rot == 16 and c.rope.freq_factors is not None
    b = m.blocks[0]
    assert b.attn_q_norm.shape == (16,) and b.attn_k_norm.shape == (16,) and b.attn_q_bias is None
    assert miss(engine(NAME)) < TOL


def test_moe_in_float64():
    """build_moe_ffn(sigmoid, exp_probs_b, groups, norm_w, scale) plus the shared expert, in float64."""
    m = engine(NAME).model
    e, c = m.moe[2], m.cfg
    E, F, D, G = c.n_experts, c.expert_ffn, c.d_model, c.expert_groups
    torch.manual_seed(5)
    h = torch.randn(6, D)
    gate = e.gate_exps.dense.double().view(E, F, D)
    up = e.up_exps.dense.double().view(E, F, D)
    down = e.down_exps.dense.double().view(E, D, F)
    p = torch.sigmoid(h.double() @ e.gate_inp.double().T)                     # (T, E)
    s = p + e.exp_probs_b.double()
    group_score = s.view(6, G, E // G).topk(2, dim=-1)[0].sum(-1)              # (T, G)
    keep = torch.zeros(6, G, dtype=torch.bool)
    keep.scatter_(1, group_score.topk(c.expert_groups_used, dim=-1)[1], True)
    s = s.masked_fill(~keep.repeat_interleave(E // G, dim=1), float("-inf"))
    idx = s.topk(c.n_experts_used, dim=-1)[1]
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


@pytest.mark.parametrize("what", ["no_window", "rope_on_global", "no_rope_local", "adjacent_pairs",
                                  "no_rope_factors", "softmax", "no_select_bias", "no_groups", "no_renorm",
                                  "no_scale", "no_shared", "dense_layer_as_moe_norm"])
def test_each_rule_is_needed(what):
    eng = engine(NAME)
    m = eng.model
    c = m.cfg
    if what == "no_window":
        m.window = 0
    elif what == "rope_on_global":
        m.use_rope = (True,) * c.n_layers
    elif what == "no_rope_local":
        m.use_rope = (False,) * c.n_layers
    elif what == "adjacent_pairs":
        m.cfg = replace(c, rope=replace(c.rope, style="normal"))
    elif what == "no_rope_factors":
        m.cfg = replace(c, rope=replace(c.rope, freq_factors=None))
    elif what == "softmax":
        m.cfg = replace(c, expert_gating="softmax")
    elif what == "no_select_bias":
        for e in m.moe[1:]:
            e.exp_probs_b = None
    elif what == "no_groups":
        m.cfg = replace(c, expert_groups=1, expert_groups_used=1)
    elif what == "no_renorm":
        m.weights_norm = False
    elif what == "no_scale":
        m.cfg = replace(c, expert_weights_scale=1.0)
    elif what == "no_shared":
        for e in m.moe[1:]:
            e.gate_shexp = None
    else:       # the FFN norm taken from the next layer's attention norm (pre-norm order mixed up)
        for b, nxt in zip(m.blocks, m.blocks[1:]):
            b.ffn_norm = nxt.attn_norm
    assert miss(eng) > 10 * TOL, what


@pytest.mark.parametrize("tensor", ["blk.1.attn_q_norm.weight", "blk.2.attn_k_norm.weight", "blk.3.ffn_norm.weight",
                                    "blk.0.attn_norm.weight", "blk.0.ffn_gate.weight", "blk.1.ffn_gate_inp.weight",
                                    "blk.2.ffn_down_exps.weight", "blk.3.ffn_up_shexp.weight"])
def test_missing_tensor_is_named(tmp_path, tensor):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_tensors=(tensor,))
    with pytest.raises(MinferError, match=tensor.replace(".", r"\.")):
        load(p)


@pytest.mark.parametrize("key", ["exaone-moe.attention.sliding_window", "exaone-moe.expert_count",
                                 "exaone-moe.expert_used_count", "exaone-moe.expert_feed_forward_length"])
def test_missing_key_is_named(tmp_path, key):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_keys=(key,))
    with pytest.raises(MinferError, match=key.replace(".", r"\.")):
        load(p)


def test_absent_optional_keys_take_the_defaults(tmp_path):
    """No expert_gating_func: sigmoid (HF's only router); no expert_shared_feed_forward_length:
    expert_feed_forward_length (both the same model here); no sliding_window_pattern: llama.cpp's default 4
    (layers 0-2 local, 3 global); no selection bias tensors: the choice on p."""
    keys = ("exaone-moe.expert_gating_func", "exaone-moe.expert_shared_feed_forward_length")
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_keys=keys)
    from minfer.runtime.engine import Engine
    from models.test_arch_vs_transformers import reference_switches

    eng = Engine.load(p, ctx=64, progress=False, switches=reference_switches())
    m = eng.model
    assert m.cfg.expert_gating == "sigmoid" and m.moe[1].gate_shexp.shape[0] == 32
    assert miss(eng) < TOL
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "z.gguf", drop_keys=("exaone-moe.attention.sliding_window_pattern",))
    assert load(p).is_local == (True, True, True, False)
    q = rewrite(DATA / f"{NAME}.gguf", tmp_path / "y.gguf",
                drop_tensors=tuple(f"blk.{i}.exp_probs_b.bias" for i in (1, 2, 3)))
    assert all(e.exp_probs_b is None for e in load(q).moe[1:])


def test_fused_qkv_refused(tmp_path):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf",
                add_tensors={"blk.0.attn_qkv.weight": np.zeros((128, 64), np.float32)})
    with pytest.raises(MinferError, match=r"blk\.0\.attn_qkv\.weight"):
        load(p)


def test_non_positive_window_refused(tmp_path):
    import gguf

    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf",
                set_keys={"exaone-moe.attention.sliding_window": (0, gguf.GGUFValueType.UINT32)})
    with pytest.raises(MinferError, match=r"exaone-moe\.attention\.sliding_window"):
        load(p)
