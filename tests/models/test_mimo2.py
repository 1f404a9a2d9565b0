"""Xiaomi MiMo-V2-Flash (minfer/models/mimo2.py) on the CPU's float32 reference: the per-layer attention layout read
from the file (kv heads, window, sinks, rope base), the value head narrower than the key head, each rule needed
(with one changed the logits miss transformers' by more than 10x the tolerance), absent optional keys and tensors
taking llama.cpp's values, what the model needs refused by name. The logits, greedy continuation, KV cache in
pieces and paged cache are test_arch_vs_transformers' (name "mimo_v2_flash"). Fixture:
tests/data/arch/mimo_v2_flash.gguf (tools/gen_arch_fixtures.py: transformers' MiMoV2FlashForCausalLM, its config.json
as released, converted by llama.cpp's convert_hf_to_gguf.py)."""

from __future__ import annotations

from dataclasses import replace

import gguf
import numpy as np
import pytest
import torch

from minfer import ops
from minfer.errors import MinferError
from models.arch_checks import assert_refused, break_rule, logits_miss, rewritten_engine
from models.test_arch_vs_transformers import DATA, TOL, engine, load, rewrite

NAME = "mimo_v2_flash"
A = "mimo2"


def miss(eng) -> float:
    return logits_miss(NAME, eng)


def test_layout_read_from_the_file():
    m = engine(NAME).model
    c = m.cfg
    assert (c.n_layers, c.n_heads, c.d_model, m.dk, m.dv) == (4, 4, 64, 24, 16)   # block_count 7: 3 NextN not run
    assert m.kv_heads == (2, 4, 4, 2) and m.is_local == (False, True, True, False) and m.window == 8
    assert c.kv_layers == ((2, 24, 24), (4, 24, 24), (4, 24, 24), (2, 24, 24))      # V stored at K's width
    assert [s is None for s in m.sinks] == [True, False, False, True]
    assert c.rope.n_rot == 8 and c.rope.style == "neox" and c.rope.theta == 5e6 and m.rope_local.theta == 1e4
    assert abs(m.v_scale - 0.707) < 1e-6
    assert [e is None for e in m.moe] == [True, False, False, False]
    assert c.expert_gating == "sigmoid" and m.weights_norm and c.expert_weights_scale == 1.0
    assert all(e.exp_probs_b is not None and e.gate_shexp is None for e in m.moe[1:])
    assert m.blocks[1].attn_v.shape == (64, 64) and m.blocks[0].attn_v.shape == (32, 64)
    assert m.blocks[0].attn_output.shape == (64, 64)                                 # H * Dv in
    assert miss(engine(NAME)) < TOL


@pytest.mark.parametrize("what", ["no_window", "window_everywhere", "no_sinks", "no_v_scale", "full_rope",
                                  "adjacent_pairs", "full_base_on_local", "local_base_on_full", "softmax",
                                  "no_select_bias", "no_renorm", "moe_on_layer0"])
def test_each_rule_is_needed(what):
    eng = engine(NAME)
    m = eng.model
    c = m.cfg
    if break_rule(m, what):
        pass
    elif what == "window_everywhere":
        m.is_local = (True,) * c.n_layers
        m.rope_local = c.rope                 # the window only: the full layers keep their rope base
    elif what == "no_sinks":
        m.sinks = [None] * c.n_layers
    elif what == "no_v_scale":
        m.v_scale = 1.0
    elif what == "full_rope":
        m.cfg = replace(c, rope=replace(c.rope, n_rot=24))
        m.rope_local = replace(m.rope_local, n_rot=24)
    elif what == "adjacent_pairs":
        m.cfg = replace(c, rope=replace(c.rope, style="normal"))
        m.rope_local = replace(m.rope_local, style="normal")
    else:                                  # local_base_on_full
        m.cfg = replace(c, rope=m.rope_local)
    assert miss(eng) > 10 * TOL, what


def test_narrow_values_through_the_padded_cache_in_float64():
    """Layer 1's attention (a sliding layer with sinks, 4 kv heads, Dv 16 < Dk 24) against a float64 formula of
    build_attn: softmax over [q k^T / sqrt(Dk), sink] within the window, times the unpadded V, W_o, times vs (the
    partial rotation by ops.rope, tests/ops' own)."""
    from minfer.models import Step
    from minfer.runtime.kv_cache import KVCache

    m = engine(NAME).model
    c, blk, i = m.cfg, m.blocks[1], 1
    T, H, Hkv, Dk, Dv = 12, 4, 4, 24, 16
    torch.manual_seed(2)
    h = torch.randn(T, 64)
    got = m._attention(h, blk, i, KVCache.for_config(c, 32), Step.at(0, T, "cpu"), None).double()
    pos = torch.arange(T)
    q = ops.rope((h @ blk.attn_q.dense.T).view(T, H, Dk), pos, m.rope_local).double()
    k = ops.rope((h @ blk.attn_k.dense.T).view(T, Hkv, Dk), pos, m.rope_local).double()
    v = (h @ blk.attn_v.dense.T).view(T, Hkv, Dv).double()
    s = torch.einsum("thd,jhd->htj", q, k) / Dk ** 0.5                      # (H, T, T), Hkv == H here
    keep = (pos[None, :] <= pos[:, None]) & (pos[:, None] - pos[None, :] < m.window)
    s = s.masked_fill(~keep, float("-inf"))
    s = torch.cat([s, m.sinks[i].double().view(H, 1, 1).expand(H, T, 1)], -1)
    p = torch.softmax(s, -1)[..., :T]
    o = torch.einsum("htj,jhd->thd", p, v).reshape(T, H * Dv)
    want = (o @ blk.attn_output.dense.double().T) * m.v_scale
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-5


@pytest.mark.parametrize("tensor", ["blk.1.attn_v.weight", "blk.2.attn_output.weight", "blk.0.ffn_gate.weight",
                                    "blk.3.ffn_up_exps.weight", "blk.1.ffn_down_exps.weight", "blk.2.ffn_norm.weight",
                                    "output.weight", "output_norm.weight"])
def test_missing_tensor_is_named(tmp_path, tensor):
    assert_refused(NAME, tmp_path, dict(drop_tensors=(tensor,)), tensor)


@pytest.mark.parametrize("key", [f"{A}.attention.sliding_window", f"{A}.attention.sliding_window_pattern",
                                 f"{A}.expert_count", f"{A}.expert_used_count", f"{A}.expert_feed_forward_length"])
def test_missing_key_is_named(tmp_path, key):
    assert_refused(NAME, tmp_path, dict(drop_keys=(key,)), key)


def test_absent_optional_keys_and_tensors_take_llamacpps_values(tmp_path):
    """No sinks on a layer: none there; no exp_probs_b.bias: the choice on the scores; no value_scale: none; no
    freq_base_swa: freq_base on every layer; expert_weights_scale 2: the weights doubled (each misses); no
    value_length: V as wide as K (the file's V then mismatches, named)."""
    def eng(**kw):
        return rewritten_engine(NAME, tmp_path, **kw)

    e = eng(drop_tensors=("blk.1.attn_sinks.weight",))
    assert e.model.sinks[1] is None and e.model.sinks[2] is not None and miss(e) > 10 * TOL
    e = eng(drop_tensors=("blk.2.exp_probs_b.bias",))
    assert e.model.moe[2].exp_probs_b is None and miss(e) > 10 * TOL
    e = eng(drop_keys=(f"{A}.attention.value_scale",))
    assert e.model.v_scale == 1.0 and miss(e) > 10 * TOL
    e = eng(drop_keys=(f"{A}.rope.freq_base_swa",))
    assert e.model.rope_local.theta == 5e6 and miss(e) > 10 * TOL
    e = eng(set_keys={f"{A}.expert_weights_scale": (2.0, gguf.GGUFValueType.FLOAT32)})
    assert e.model.cfg.expert_weights_scale == 2.0 and miss(e) > 10 * TOL
    with pytest.raises(MinferError, match=r"blk\.0\.attn_v\.weight"):
        load(rewrite(DATA / f"{NAME}.gguf", tmp_path / "y.gguf", drop_keys=(f"{A}.attention.value_length",)))


@pytest.mark.parametrize("kw,match", [
    (dict(set_keys={f"{A}.attention.sliding_window_pattern": (4, gguf.GGUFValueType.UINT32)}),
     rf"{A}\.attention\.sliding_window_pattern"),
    (dict(set_keys={f"{A}.attention.value_length": (32, gguf.GGUFValueType.UINT32)}), rf"{A}\.attention\.value_length"),
    (dict(set_keys={f"{A}.rope.dimension_count": (7, gguf.GGUFValueType.UINT32)}), rf"{A}\.rope\.dimension_count"),
    (dict(set_keys={f"{A}.expert_gating_func": (1, gguf.GGUFValueType.UINT32)}), rf"{A}\.expert_gating_func"),
    (dict(add_tensors={"rope_freqs.weight": np.ones(4, np.float32)}), r"rope_freqs\.weight"),
    (dict(add_tensors={"blk.1.attn_q_norm.weight": np.ones(24, np.float32)}), r"blk\.1\.attn_q_norm\.weight"),
    (dict(add_tensors={"blk.2.ffn_gate_shexp.weight": np.zeros((24, 64), np.float32)}),
     r"blk\.2\.ffn_gate_shexp\.weight"),
    (dict(add_tensors={"blk.1.ffn_gate.weight": np.zeros((96, 64), np.float32)}), r"blk\.1\.ffn_gate\.weight"),
    (dict(set_keys={f"{A}.expert_used_count": (9, gguf.GGUFValueType.UINT32)}), r"expert_used_count=9"),
])
def test_unsupported_input_refused_by_name(tmp_path, kw, match):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", **kw)
    with pytest.raises(MinferError, match=match):
        load(p)
