"""Google Gemma 4, dense form (minfer/models/gemma4.py) against transformers, on the CPU's float32
reference: the logits at every position, the greedy continuation, the KV cache in pieces across the
window and through the batch engine's paged cache; each rule of the graph needed (with one changed
the logits miss by more than 10x the tolerance); what the model does not run refused by name.
Fixture: tests/data/arch/gemma4.gguf (tools/gen_arch_fixtures.py: transformers' Gemma4ForCausalLM,
layers 0,1,3,4 sliding (window 8 < the 40-token sequence, head size 16, 2 kv heads, rope base 20000),
2 and 5 global (head size 32, 1 kv head, no v projection, proportional rope on a quarter of the head),
random layer scalars, final soft-cap 10; converted by llama.cpp's convert_hf_to_gguf.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import gguf
import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

NAME = "gemma4"


def miss(eng) -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def test_layer_geometry_from_the_file():
    """HF layer_types, head sizes, kv heads (an array in the GGUF), rope bases and rotated dims, the
    proportional factors (1 on the rotated quarter, 1e30 on the rest), k as v on the global layers."""
    m = engine(NAME).model
    hf = json.loads((DATA / "gemma4.json").read_text())["config"]
    assert m.is_local == tuple(t == "sliding_attention" for t in hf["layer_types"]) == (True, True, False, True, True, False)
    assert m.window == hf["sliding_window"] == 8
    assert m.head_dims == (16, 16, 32, 16, 16, 32) and m.kv_heads == (2, 2, 1, 2, 2, 1)
    assert (m.cfg.n_kv_heads, m.cfg.head_dim) == (2, 32)                       # the largest
    assert m.cfg.kv_layers == ((2, 16, 16), (2, 16, 16), (1, 32, 32), (2, 16, 16), (2, 16, 16), (1, 32, 32))
    assert [r.theta for r in m.layer_rope] == [20000.0, 20000.0, 1e6, 20000.0, 20000.0, 1e6]
    assert [r.n_rot for r in m.layer_rope] == [16, 16, 32, 16, 16, 32]
    ff = m.cfg.rope.freq_factors
    assert ff[:4] == (1.0,) * 4 and min(ff[4:]) >= 1e29 and len(ff) == 16      # 0.25 * 32 / 2 = 4 rotated pairs
    assert [b.attn_v is None for b in m.blocks] == [not loc for loc in m.is_local]
    assert all(s is not None and s != 1.0 for s in m.out_scale)


RULES = ["window", "swa_rope_base", "swa_rope_dims_of_global", "proportional_rope", "attention_scale", "q_norm",
         "k_norm", "v_norm", "k_as_v_before_norms", "layer_output_scale", "final_softcap", "norm_plus_one", "neox"]


@pytest.mark.parametrize("what", RULES)
def test_each_rule_is_needed(monkeypatch, what):
    from minfer.models import gemma4

    eng = engine(NAME)
    m = eng.model
    assert miss(eng) < TOL
    if what == "window":
        monkeypatch.setattr(m, "window", 0)
    elif what == "swa_rope_base":                 # the global base on the window layers too
        monkeypatch.setattr(m, "layer_rope", [replace(r, theta=1e6) for r in m.layer_rope])
    elif what == "swa_rope_dims_of_global":       # the global layers without their own (proportional) rope
        monkeypatch.setattr(m, "layer_rope", [replace(r, theta=m.layer_rope[0].theta, freq_factors=None)
                                              for r in m.layer_rope])
    elif what == "proportional_rope":             # every dim of the global heads rotating
        monkeypatch.setattr(m, "layer_rope", [replace(r, freq_factors=None) for r in m.layer_rope])
    elif what == "attention_scale":               # 1/sqrt(Dh), every other architecture's
        monkeypatch.setattr(m, "attn_scale", None)      # None: the caches' default 1/sqrt(Dh)
    elif what in ("q_norm", "k_norm"):            # that per-head norm's weight dropped (RMS only)
        for b in m.blocks:
            w = b.attn_q_norm if what == "q_norm" else b.attn_k_norm
            monkeypatch.setattr(b, "attn_q_norm" if what == "q_norm" else "attn_k_norm", torch.ones_like(w))
    elif what == "v_norm":                        # v as projected
        real = gemma4.head_norm
        ones = {id(v) for v in m.v_norm_ones.values()}
        monkeypatch.setattr(gemma4, "head_norm", lambda x, w, eps: x if w.data_ptr() in
                            {o.data_ptr() for o in m.v_norm_ones.values()} else real(x, w, eps))
        assert ones
    elif what == "k_as_v_before_norms":           # v = k after its norm and rope (not the raw projection)
        real_kv = gemma4.Gemma4Model._kv

        def kv(self, h, blk, i, step, ctx):
            k, v = real_kv(self, h, blk, i, step, ctx)
            return (k, k) if blk.attn_v is None else (k, v)
        monkeypatch.setattr(gemma4.Gemma4Model, "_kv", kv)
    elif what == "layer_output_scale":
        monkeypatch.setattr(m, "out_scale", [None] * m.cfg.n_layers)
    elif what == "final_softcap":
        monkeypatch.setattr(m, "final_softcap", 0.0)
    elif what == "norm_plus_one":                 # gemma3's x * (1 + w) reading of the stored norms
        for b in m.blocks:
            monkeypatch.setattr(b, "attn_norm", b.attn_norm + 1)
            monkeypatch.setattr(b, "ffn_norm", b.ffn_norm + 1)
    else:                                         # NORM (adjacent pairs) instead of NEOX
        monkeypatch.setattr(m, "layer_rope", [replace(r, style="normal") for r in m.layer_rope])
    assert miss(eng) > 10 * TOL


@pytest.mark.parametrize("key", ["gemma4.attention.layer_norm_rms_epsilon", "gemma4.block_count",
                                 "gemma4.attention.head_count", "gemma4.attention.key_length_swa",
                                 "gemma4.attention.sliding_window_pattern", "gemma4.attention.sliding_window"])
def test_missing_key_is_named(tmp_path, key):
    p = rewrite(DATA / "gemma4.gguf", tmp_path / "x.gguf", drop_keys=(key,))
    with pytest.raises(MinferError, match=key.replace(".", r"\.")):
        load(p)


@pytest.mark.parametrize("tensor", ["blk.2.post_ffw_norm.weight", "blk.0.post_attention_norm.weight",
                                    "blk.2.attn_q_norm.weight", "blk.1.attn_k_norm.weight", "blk.3.ffn_up.weight",
                                    "blk.0.attn_v.weight", "rope_freqs.weight"])
def test_missing_tensor_is_named(tmp_path, tensor):
    """attn_v is optional on global layers only (k as v); a window layer without it is refused."""
    p = rewrite(DATA / "gemma4.gguf", tmp_path / "x.gguf", drop_tensors=(tensor,))
    with pytest.raises(MinferError, match=tensor.replace(".", r"\.")):
        load(p)


U32 = gguf.GGUFValueType.UINT32


@pytest.mark.parametrize("keys,match", [
    ({"gemma4.attention.shared_kv_layers": (2, U32)}, "shared_kv_layers"),
    ({"gemma4.embedding_length_per_layer_input": (8, U32)}, r"per_layer_token_embd\.weight"),
    ({"gemma4.attention.value_length_swa": (8, U32)}, "value_length_swa"),
    ({"gemma4.attention.key_length_swa": (64, U32), "gemma4.attention.value_length_swa": (64, U32)},
     "key_length_swa=64 exceeds"),
    ({"gemma4.feed_forward_length": ([96, 96, 96, 96, 192, 192], gguf.GGUFValueType.ARRAY)},
     r"blk\.4\.ffn_gate\.weight"),
])
def test_unsupported_forms_are_refused_by_name(tmp_path, keys, match):
    """Forms this file does not hold or minfer does not run: a shared-KV pattern llama.cpp and HF read
    differently, per-layer embeddings without their tensors, unequal k/v head sizes, window heads
    wider than global ones, MLP widths that do not match the tensors."""
    p = rewrite(DATA / "gemma4.gguf", tmp_path / "x.gguf", set_keys=keys)
    with pytest.raises(MinferError, match=match):
        load(p)


def test_per_layer_counts_refused_for_other_architectures(tmp_path):
    """head_count_kv as an array is a gemma4 form; another architecture's file with one is refused by the key."""
    p = rewrite(DATA / "gemma3.gguf", tmp_path / "x.gguf",
                set_keys={"gemma3.attention.head_count_kv": ([1] * 6, gguf.GGUFValueType.ARRAY)})
    with pytest.raises(MinferError, match=r"gemma3\.attention\.head_count_kv"):
        load(p)


def test_fused_qkv_is_refused_by_name(tmp_path):
    """llama.cpp takes blk.N.attn_qkv.weight in place of q/k/v where present; minfer does not read it."""
    p = rewrite(DATA / "gemma4.gguf", tmp_path / "x.gguf", add_tensors={"blk.0.attn_qkv.weight": np.zeros((128, 64))})
    with pytest.raises(MinferError, match=r"attn_qkv\.weight"):
        load(p)
