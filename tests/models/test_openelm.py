"""OpenELM (minfer/models/openelm.py, GGUF arch `openelm`) on the CPU's float32 reference, against two references
that minfer made neither of: a float64 torch forward of the HF checkpoint written from the architecture
(tools/gen_openelm_fixture.py reference(): per-layer head counts and FFN widths, a fused qkv split by heads, the
per-head q/k RMSNorm before NEOX rope, a tied lm head), and llama.cpp's own logits (llama-cpp-python 0.3.36, an F32
copy of the file, F32 KV cache). transformers 5.25 has no OpenELM class (remote code only), so this file runs the
model's own checks: the layout read from the file, each rule of the graph needed (with one changed the logits miss
both references by more than 10x the tolerance), the loader's refusals.

Fixture: tests/data/arch/openelm.{gguf,npz,json} (tools/gen_openelm_fixture.py build + goldens): hidden 32, head_dim
8, 3 layers with 4 / 6 / 8 query heads over 2 / 3 / 4 kv heads (8 is not a multiple of 3, as OpenELM-270M's 20 heads
over some layers' 3) and FFN widths 16 / 80 / 128 (the converter's make_divisible of multipliers 0.5 / 2.25 / 4.0),
vocab 320 (SentencePiece), rope base 1e4, converted by llama.cpp's convert_hf_to_gguf.py (conversion/openelm.py).

The checks every llama.cpp-checked decoder shares (logits against both references, greedy, the cache in pieces,
the batch engine's paged cache) run in tests/models/test_llamacpp_decoders.py, which lists this fixture."""

from __future__ import annotations

from dataclasses import replace

import gguf
import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

NAME = "openelm"
BASE_ERR = 3e-6      # the fixture's float32 misses: 1.4e-6 (reference), 1.4e-6 (llama.cpp); they agree to 1.1e-6
U32 = gguf.GGUFValueType.UINT32


def miss(eng, key: str = "logits") -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r[key])


def test_layout_read_from_the_file():
    from minfer.models.openelm import OpenElmModel

    eng = engine(NAME)
    m, c = eng.model, eng.model.cfg
    assert type(m) is OpenElmModel and c.arch == NAME
    assert (c.d_model, c.head_dim, c.vocab, c.n_layers) == (32, 8, 320, 3)
    assert c.heads_per_layer == (4, 6, 8) and c.kv_heads_per_layer == (2, 3, 4) and c.ffn_per_layer == (16, 80, 128)
    assert c.kv_layers == ((2, 8, 8), (3, 8, 8), (4, 8, 8))     # each layer's cache rows its own kv heads
    assert [(lc.n_heads, lc.n_kv_heads) for lc in m.layer_cfg] == [(4, 2), (6, 3), (8, 4)]
    assert c.rope.style == "neox" and c.rope.n_rot == 8 and c.rope.theta == 1e4 and c.rms_eps == pytest.approx(1e-6)
    assert c.tied_output and m.output is m.token_embd          # the lm head is the token embedding
    for b, (h, kv, f) in zip(m.blocks, ((4, 2, 16), (6, 3, 80), (8, 4, 128))):
        assert b.attn_q is None and tuple(b.attn_qkv.shape) == ((h + 2 * kv) * 8, 32)
        assert tuple(b.attn_output.shape) == (32, h * 8) and tuple(b.ffn_up.shape) == (f, 32)
        assert tuple(b.attn_q_norm.shape) == (8,) and tuple(b.attn_k_norm.shape) == (8,)


def test_the_two_references_agree():
    r = ref(NAME)
    assert rel_err(r["lc_logits"], r["logits"]) < BASE_ERR
    assert r["lc_greedy"].tolist() == r["greedy"].tolist()
    assert len(set(r["greedy"].tolist())) > 6          # not a degenerate continuation


def _rows(w, rows):
    """Monkeypatch-ready copy of a QWeight's dense matrix with its rows reordered."""
    return w.dense[torch.as_tensor(rows)].clone()


@pytest.mark.parametrize("what", ["norm_after_rope", "no_qk_norm", "normal_rope", "base", "k_v_swapped",
                                  "kv_heads_tiled", "gate_up_swapped", "ffn_width_cut"])
def test_each_rule_is_needed(monkeypatch, what):
    """The q/k norms before rope (not after, as maincoder's), the q/k norms at all, NEOX rope (not adjacent pairs),
    the file's rope base, the fused rows' order q | k | v, GQA's kv head j serving query heads 2j and 2j+1 (not tiled:
    j and j + Hkv), silu on ffn_gate (the converter's first half of proj_1), and layer 2's own FFN width 128 (not
    layer 1's 80)."""
    from minfer import ops
    from minfer.models import layers

    eng = engine(NAME)
    m, c = eng.model, eng.model.cfg
    assert miss(eng) < BASE_ERR
    Dh = c.head_dim
    if what == "norm_after_rope":
        def after(h, blk, i, cache, step, ctx):
            lc = m.layer_cfg[i]
            T, H, Hkv = h.shape[0], lc.n_heads, lc.n_kv_heads
            q, k, v = (blk.attn_qkv.dense @ h.T).T.split((H * Dh, Hkv * Dh, Hkv * Dh), -1)
            q = layers.head_norm(ops.rope(q.reshape(T, H, Dh), step.positions, lc.rope), blk.attn_q_norm, lc.rms_eps)
            k = layers.head_norm(ops.rope(k.reshape(T, Hkv, Dh), step.positions, lc.rope), blk.attn_k_norm, lc.rms_eps)
            return layers.merge_heads(layers.rope_write_attend(cache, i, q, k, v.reshape(T, Hkv, Dh), step, None, ctx))
        monkeypatch.setattr(m, "attention_heads", after)
    elif what == "no_qk_norm":
        for b in m.blocks:
            monkeypatch.setattr(b, "attn_q_norm", torch.ones_like(b.attn_q_norm))
            monkeypatch.setattr(b, "attn_k_norm", torch.ones_like(b.attn_k_norm))
    elif what in ("normal_rope", "base"):
        rope = replace(c.rope, style="normal") if what == "normal_rope" else replace(c.rope, theta=1e6)
        monkeypatch.setattr(m, "layer_cfg", [replace(lc, rope=rope) for lc in m.layer_cfg])
    elif what == "k_v_swapped":           # layer 1: rows q | v | k
        H, Hkv = 6, 3
        q, k, v = np.split(np.arange((H + 2 * Hkv) * Dh), [H * Dh, (H + Hkv) * Dh])
        w = m.blocks[1].attn_qkv
        monkeypatch.setattr(w, "dense", _rows(w, np.concatenate([q, v, k])))
    elif what == "kv_heads_tiled":        # layer 2: the query heads reordered so head p meets kv head p % 4
        H, Hkv = 8, 4
        order = [i // 2 + Hkv * (i % 2) for i in range(H)]          # slot i (kv head i // 2) takes head order[i]
        rows = np.concatenate([np.arange(o * Dh, (o + 1) * Dh) for o in order] +
                              [np.arange(H * Dh, (H + 2 * Hkv) * Dh)])
        w = m.blocks[2].attn_qkv
        monkeypatch.setattr(w, "dense", _rows(w, rows))
        o = m.blocks[2].attn_output                                  # and the o projection's columns with them
        cols = np.concatenate([np.arange(p * Dh, (p + 1) * Dh) for p in order])
        monkeypatch.setattr(o, "dense", o.dense[:, torch.as_tensor(cols)].clone())
    elif what == "gate_up_swapped":
        for b in m.blocks:
            g, u = b.ffn_gate.dense, b.ffn_up.dense
            monkeypatch.setattr(b.ffn_gate, "dense", u)
            monkeypatch.setattr(b.ffn_up, "dense", g)
    else:
        b = m.blocks[2]
        for name in ("ffn_gate", "ffn_up"):
            monkeypatch.setattr(getattr(b, name), "dense", getattr(b, name).dense[:80].clone())
        monkeypatch.setattr(b.ffn_down, "dense", b.ffn_down.dense[:, :80].clone())
    assert miss(eng) > 10 * TOL and miss(eng, "lc_logits") > 10 * TOL


def test_refusals(tmp_path):
    """What llama.cpp's openelm loader or graph would not run as minfer does, refused by name: an output.weight (the
    head is always the embedding), biases, separate q/k/v, rope factors, partial rope, value_length != key_length,
    a layer without kv heads or without an FFN; a missing q/k norm named."""
    src = DATA / f"{NAME}.gguf"
    cases = [
        (dict(add_tensors={"output.weight": np.zeros((320, 32))}), r"'output\.weight'"),
        (dict(add_tensors={"blk.1.attn_qkv.bias": np.zeros(96)}), r"blk\.1\.attn_qkv\.bias"),
        (dict(add_tensors={"blk.2.ffn_down.bias": np.zeros(32)}), r"blk\.2\.ffn_down\.bias"),
        (dict(add_tensors={"blk.0.attn_q.weight": np.zeros((32, 32))}), r"blk\.0\.attn_q\.weight"),
        (dict(add_tensors={"rope_freqs.weight": np.ones(4)}), r"rope_freqs\.weight"),
        (dict(set_keys={f"{NAME}.rope.dimension_count": (4, U32)}), r"rope\.dimension_count"),
        (dict(set_keys={f"{NAME}.attention.value_length": (16, U32)}), r"value_length"),
        (dict(set_keys={f"{NAME}.attention.head_count_kv": ([2, 0, 4], gguf.GGUFValueType.ARRAY)}),
         r"head_count_kv"),
        (dict(set_keys={f"{NAME}.feed_forward_length": ([16, 0, 128], gguf.GGUFValueType.ARRAY)}),
         r"feed_forward_length"),
        (dict(drop_tensors=("blk.2.attn_k_norm.weight",)), r"blk\.2\.attn_k_norm\.weight"),
    ]
    for i, (kw, pattern) in enumerate(cases):
        with pytest.raises(MinferError, match=pattern):
            load(rewrite(src, tmp_path / f"r{i}.gguf", **kw))


# The CUDA backend's code on the CPU (Triton's interpreter, prefill and the host-free decode step against the
# reference, the paths it must take): tests/ops/test_arch_forward_interpreted.py, which lists this fixture.
