"""Liquid LFM2 (minfer/models/lfm2.py) against transformers, on the CPU's float32 reference: each rule
of the graph needed (with one changed the logits miss by more than 10x the tolerance), the conv rows
in the KV cache (host-free decode steps, pieces, a reused prefix; the bytes the caches allocate and
the preflight counts), what the model does not run refused by name. The logits, greedy, pieces and
batch-engine checks are in test_arch_vs_transformers.py. Fixture: tests/data/arch/lfm2.gguf
(tools/gen_arch_fixtures.py: transformers' Lfm2ForCausalLM, layers 0, 1, 3, 5 short convolutions of
3 taps, 2 and 4 GQA attention, converted by llama.cpp's convert_hf_to_gguf.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import gguf
import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

NAME = "lfm2"


def miss(eng) -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def test_layer_kinds_from_the_file():
    """The conv layers are those with head_count_kv 0 (HF layer_types "conv"); the kernel size from
    shortconv.l_cache (HF conv_L_cache); each conv layer's taps (L, D) as HF's conv weight (D, 1, L)."""
    m = engine(NAME).model
    hf = json.loads((DATA / "lfm2.json").read_text())["config"]
    assert m.is_conv == tuple(t == "conv" for t in hf["layer_types"]) == (True, True, False, True, False, True)
    assert m.l_cache == hf["conv_L_cache"] == 3
    assert m.cfg.rope.style == "neox" and (m.cfg.n_heads, m.cfg.n_kv_heads, m.cfg.head_dim) == (4, 2, 16)
    for i, conv in enumerate(m.is_conv):
        assert (m.conv_w[i] is not None) == conv == (m.blocks[i].attn_q is None)
        assert conv or m.blocks[i].attn_q_norm is not None
    assert m.conv_w[0].shape == (3, 64)


@pytest.mark.parametrize("what", ["taps_reversed", "conv_off", "b_c_swapped", "c_gate_off", "qk_norm",
                                  "adjacent_pairs", "final_norm"])
def test_each_rule_is_needed(monkeypatch, what):
    from minfer import ops
    from minfer.models import layers

    eng = engine(NAME)
    m = eng.model
    assert miss(eng) < TOL
    D = m.cfg.d_model
    if what == "taps_reversed":                 # tap 0 on the current position (a convolution, not HF's correlation)
        monkeypatch.setattr(m, "conv_w", [None if w is None else w.flip(0) for w in m.conv_w])
    elif what == "conv_off":                    # B*x of the position itself only (taps [0, 0, 1])
        monkeypatch.setattr(m, "conv_w", [None if w is None else torch.zeros_like(w).index_fill_(0, torch.tensor([2]), 1.0)
                                          for w in m.conv_w])
    elif what == "b_c_swapped":                 # in_proj's rows are B, C, x in that order
        for w in m.conv_in:
            if w is not None:
                monkeypatch.setattr(w, "dense", torch.cat([w.dense[D:2 * D], w.dense[:D], w.dense[2 * D:]]))
    elif what == "c_gate_off":                  # C gates the conv's output: without it, y = conv(B*x)
        def no_gate(h, i, cache, step, ctx):
            bcx = ops.linear(h, m.conv_in[i], None, ctx)
            rows = cache.write_window(i, bcx[:, :D] * bcx[:, 2 * D:], step, m.l_cache)
            return (rows.float() * m.conv_w[i]).sum(1).to(h.dtype)
        monkeypatch.setattr(m, "short_conv", no_gate)
    elif what == "qk_norm":
        monkeypatch.setattr(layers, "head_norm", lambda x, w, eps: x)
    elif what == "adjacent_pairs":              # NORM instead of NEOX
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, style="normal"))   # (this engine's own cfg)
    else:                                       # token_embd_norm is the final norm: without it the logits miss
        monkeypatch.setattr(m, "output_norm", torch.ones_like(m.output_norm))
    assert miss(eng) > 10 * TOL


def test_host_free_decode_steps_equal_the_whole():
    """Decode steps whose Step has no host start (a CUDA graph's; the conv rows gathered by device
    positions) after a prompt give the whole sequence's logits, first positions (a window reaching
    before position 0) included."""
    from minfer.models import Step
    from minfer.runtime.kv_cache import KVCache

    r = ref(NAME)
    m = engine(NAME).model
    ids = torch.tensor(r["ids"].tolist())
    cache = KVCache.for_config(m.cfg, 64)
    rows = [m.forward(ids[:1], Step.at(0, 1, "cpu"), cache)]
    for p in range(1, 12):
        rows.append(m.forward(ids[p:p + 1], Step(torch.tensor([p]), None, "all"), cache))
    got = torch.cat(rows).numpy()
    assert rel_err(got, r["logits"][:12]) < TOL


def test_reused_prefix_reads_the_cached_conv_rows():
    """Engine.prefill keeps the longest common prefix and computes the rest: a second prompt that shares
    the first 9 tokens gets the logits of a fresh run (the conv windows of positions 9, 10 read the rows
    of positions 7, 8 the first prompt wrote)."""
    r = ref(NAME)
    ids = r["ids"].tolist()
    eng = engine(NAME)
    eng.prefill(ids[:20])
    other = ids[:9] + [5, 6, 7, 8, 9]
    got = eng.prefill(other).numpy()
    want = engine(NAME).logits(other)[-1].numpy()
    assert eng.tokens[:len(other)] == other
    assert np.abs(got - want).max() < 1e-5 * np.abs(want).max()


def expected_bytes_per_position(gf, elem: int) -> int:
    """From the metadata alone: 2 * Hkv * Dh on each attention layer, D (B*x) on each conv layer."""
    md = gf.metadata
    D, H = int(md["lfm2.embedding_length"]), int(md["lfm2.attention.head_count"])
    return sum(D if kv == 0 else 2 * kv * (D // H) for kv in md["lfm2.attention.head_count_kv"]) * elem


def test_cache_bytes_equal_the_preflight():
    """The caches' per-layer geometry ((1, D, 0) on conv layers, (Hkv, Dh, Dh) on attention ones): the
    contiguous and paged caches allocate what the memory preflight counts, 4 * 64 + 2 * 2 * 2 * 16 = 384
    values per position."""
    from minfer.commands.preflight import cache_config, kv_bytes_per_token
    from minfer.gguf_file import GGUFFile
    from minfer.runtime.kv_cache import KVCache
    from minfer.runtime.paged_kv import PagedKVCache

    gf = GGUFFile(DATA / "lfm2.gguf")
    per = expected_bytes_per_position(gf, 4)
    assert per == 384 * 4
    eng = engine(NAME)
    m = eng.model
    assert eng.cache.nbytes() == eng.cache.n_ctx * per
    assert kv_bytes_per_token(cache_config(gf), "cpu") == per
    assert cache_config(gf).kv_layers == m.cfg.kv_layers == ((1, 64, 0),) * 2 + ((2, 16, 16),) + ((1, 64, 0),) + \
        ((2, 16, 16),) + ((1, 64, 0),)
    assert KVCache.for_config(m.cfg, 10).nbytes() == 10 * per
    paged = PagedKVCache.for_config(m.cfg, 7, 4)
    assert paged.nbytes() == 7 * 4 * per == 7 * PagedKVCache.bytes_per_block(m.cfg, 4)
    assert eng.cache.k[0].shape == (eng.cache.n_ctx, 1, 64) and eng.cache.v[0].numel() == 0


# ---- bad input: a clear MinferError naming the file and the key or tensor --------------------

def test_missing_l_cache_is_named(tmp_path):
    p = rewrite(DATA / "lfm2.gguf", tmp_path / "x.gguf", drop_keys=("lfm2.shortconv.l_cache",))
    with pytest.raises(MinferError, match=r"x\.gguf.*'lfm2\.shortconv\.l_cache' is missing"):
        load(p)


@pytest.mark.parametrize("value", [1, 4])
def test_wrong_l_cache_is_named(tmp_path, value):
    """1: no window (llama.cpp asserts L > 1); 4: the conv tensors hold 3 taps."""
    p = rewrite(DATA / "lfm2.gguf", tmp_path / "x.gguf",
                set_keys={"lfm2.shortconv.l_cache": (value, gguf.GGUFValueType.UINT32)})
    match = "lfm2.shortconv.l_cache" if value == 1 else r"blk\.0\.shortconv\.conv\.weight' has shape \(64, 3\)"
    with pytest.raises(MinferError, match=match):
        load(p)


@pytest.mark.parametrize("tensor", ["blk.0.shortconv.conv.weight", "blk.3.shortconv.in_proj.weight",
                                    "blk.5.shortconv.out_proj.weight", "blk.2.attn_k_norm.weight",
                                    "token_embd_norm.weight", "blk.1.ffn_gate.weight"])
def test_missing_tensor_is_named(tmp_path, tensor):
    p = rewrite(DATA / "lfm2.gguf", tmp_path / "x.gguf", drop_tensors=(tensor,))
    with pytest.raises(MinferError, match=tensor.replace(".", r"\.")):
        load(p)


@pytest.mark.parametrize("key,value,vtype,match", [
    ("lfm2.attention.sliding_window", 8, gguf.GGUFValueType.UINT32, "sliding_window"),
    ("lfm2.attention.causal", False, gguf.GGUFValueType.BOOL, "attention.causal"),
    ("lfm2.attention.head_count_kv", [0, 0, 2, 0, 4, 0], gguf.GGUFValueType.ARRAY, "one kv-head count"),
    ("lfm2.attention.head_count_kv", [0] * 6, gguf.GGUFValueType.ARRAY, "at least one item"),
])
def test_unsupported_forms_are_refused_by_the_key(tmp_path, key, value, vtype, match):
    p = rewrite(DATA / "lfm2.gguf", tmp_path / "x.gguf", set_keys={key: (value, vtype)})
    with pytest.raises(MinferError, match=match):
        load(p)


def test_a_zero_kv_head_count_is_refused_where_every_layer_attends(tmp_path):
    """head_count_kv's 0 (a layer without attention) is lfm2's; gemma4 takes an array but refuses a 0."""
    g = gguf.GGUFReader(str(DATA / "gemma4.gguf"))
    kv = [int(x) for x in g.fields["gemma4.attention.head_count_kv"].contents()]
    kv[1] = 0
    p = rewrite(DATA / "gemma4.gguf", tmp_path / "x.gguf",
                set_keys={"gemma4.attention.head_count_kv": (kv, gguf.GGUFValueType.ARRAY)})
    with pytest.raises(MinferError, match=r"gemma4\.attention\.head_count_kv .* has a 0"):
        load(p)
