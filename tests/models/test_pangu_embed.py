"""openPangu-Embedded (minfer/models/pangu_embed.py, GGUF arch `pangu-embedded`) on the CPU's float32 reference,
against two references that minfer made neither of: a torch forward of the HF checkpoint written from the
architecture (tools/gen_pangu_embed_fixture.py reference(): q/k/v/o biases, rotate_half rope on the unpermuted rows),
and llama.cpp's own logits (llama-cpp-python 0.3.36, an F32 copy of the file, F32 KV cache). transformers 5.25 has no
PanguEmbedded class (remote code only), so this file runs the model's own checks: its layout, each rule of the graph
needed (with one changed the logits miss by more than 10x the tolerance), the optional q/k/v biases (a file without
them against both references' no-bias logits), the unused rope_freqs, the tied-head fallback, the loader's refusals.

Fixture: tests/data/arch/pangu-embedded.{gguf,npz,json} (tools/gen_pangu_embed_fixture.py build + goldens): hidden
32, 4 heads of 12 (48 != 32) over 2 kv heads, FFN 64, 2 layers, vocab 320, rope base 1e4, `bias` true, an untied
lm_head, converted by llama.cpp's convert_hf_to_gguf.py (conversion/pangu.py PanguEmbeddedModel).

The checks every llama.cpp-checked decoder shares (logits against both references at every position, greedy, the
cache in pieces, the batch engine's paged cache) run in tests/models/test_llamacpp_decoders.py, which lists this
fixture; the CUDA backend's code through Triton's interpreter in tests/ops/test_arch_forward_interpreted.py."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

NAME = "pangu-embedded"
BASE_ERR = 3e-6      # the fixture's float32 misses: see test_logits_match_both_references


def miss(eng, key: str = "logits") -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r[key])


def test_layout_read_from_the_file():
    from minfer.models.pangu_embed import PanguEmbedModel

    eng = engine(NAME)
    m, c = eng.model, eng.model.cfg
    assert type(m) is PanguEmbedModel and c.arch == NAME
    assert (c.head_dim, c.n_heads, c.n_kv_heads, c.d_model, c.ffn, c.vocab, c.n_layers) == (12, 4, 2, 32, 64, 320, 2)
    assert c.rope.style == "neox" and c.rope.n_rot == 12 and c.rope.theta == 1e4 and c.rope.freq_factors is None
    assert not c.tied_output and m.output is not m.token_embd
    b = m.blocks[0]
    assert tuple(b.attn_q.shape) == (48, 32) and tuple(b.attn_output.shape) == (32, 48)
    assert tuple(b.attn_q_bias.shape) == (48,) and tuple(b.attn_k_bias.shape) == (24,)
    assert tuple(b.attn_v_bias.shape) == (24,) and tuple(m.bias[0]["attn_output"].shape) == (32,)
    assert all(m.bias[0][n] is None for n in ("ffn_gate", "ffn_up", "ffn_down"))


def test_logits_match_both_references():
    """At every position (the shared checks in test_llamacpp_decoders.py do the same; measured here)."""
    r = ref(NAME)
    got = engine(NAME).logits(r["ids"].tolist()).numpy()
    assert rel_err(r["lc_logits"], r["logits"]) < BASE_ERR          # the two references agree (9.0e-7)
    assert rel_err(got, r["logits"]) < BASE_ERR
    assert rel_err(got, r["lc_logits"]) < BASE_ERR
    assert r["lc_greedy"].tolist() == r["greedy"].tolist()
    assert len(set(r["greedy"].tolist())) > 8          # not a degenerate continuation


@pytest.mark.parametrize("what", ["normal_rope", "base", "qkv_bias", "v_bias", "o_bias"])
def test_each_rule_is_needed(monkeypatch, what):
    """NEOX rope on the unpermuted rows (not NORM's adjacent pairs), the file's rope base, the q/k/v biases, the
    v bias alone, the output projection's bias."""
    from dataclasses import replace

    eng = engine(NAME)
    m, c = eng.model, eng.model.cfg
    assert miss(eng) < BASE_ERR
    if what == "normal_rope":
        object.__setattr__(c, "rope", replace(c.rope, style="normal"))     # (this engine's own cfg)
    elif what == "base":
        object.__setattr__(c, "rope", replace(c.rope, theta=1e6))
    elif what in ("qkv_bias", "v_bias"):
        for b in m.blocks:
            for n in ("attn_q_bias", "attn_k_bias", "attn_v_bias") if what == "qkv_bias" else ("attn_v_bias",):
                monkeypatch.setattr(b, n, None)
    else:
        for b in m.bias:
            monkeypatch.setitem(b, "attn_output", None)
    assert miss(eng) > 10 * TOL and miss(eng, "lc_logits") > 10 * TOL


def test_qkv_biases_are_optional(tmp_path):
    """A file without blk.N.attn_{q,k,v}.bias (create_tensor_qkv: TENSOR_NOT_REQUIRED) runs without them: both
    references' logits of that case (llama.cpp ran the same file without the tensors)."""
    from minfer.runtime.engine import Engine

    from models.test_arch_vs_transformers import reference_switches

    r = ref(NAME)
    drop = tuple(f"blk.{i}.attn_{n}.bias" for i in range(2) for n in "qkv")
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "nob.gguf", drop_tensors=drop)
    eng = Engine.load(p, ctx=64, progress=False, switches=reference_switches())
    assert eng.model.blocks[0].attn_q_bias is None
    nb = len(r["logits_noqkvb"])
    got = eng.logits(r["ids"][:nb].tolist()).numpy()
    assert rel_err(r["lc_logits_noqkvb"], r["logits_noqkvb"]) < BASE_ERR
    assert rel_err(got, r["logits_noqkvb"]) < BASE_ERR and rel_err(got, r["lc_logits_noqkvb"]) < BASE_ERR
    assert rel_err(got, r["logits"][:nb]) > 10 * TOL                     # the biases did matter


def test_rope_freqs_are_unused(tmp_path):
    """A rope_freqs.weight changes nothing (pangu-embed.cpp loads it but hands ggml_rope_ext nullptr); applied, it
    would miss both references."""
    from dataclasses import replace

    factors = np.array([1.0, 2.0, 4.0, 8.0, 16.0, 32.0], dtype=np.float32)
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "rf.gguf", add_tensors={"rope_freqs.weight": factors})
    from minfer.runtime.engine import Engine

    from models.test_arch_vs_transformers import reference_switches

    eng = Engine.load(p, ctx=64, progress=False, switches=reference_switches())
    c = eng.model.cfg
    assert c.rope.freq_factors is None
    assert miss(eng) < BASE_ERR and miss(eng, "lc_logits") < BASE_ERR
    object.__setattr__(c, "rope", replace(c.rope, freq_factors=tuple(float(f) for f in factors)))
    assert miss(eng) > 10 * TOL


def test_tied_head_fallback(tmp_path):
    """Without output.weight the token embedding is the lm head (load_arch_tensors: TENSOR_NOT_REQUIRED, then
    TENSOR_DUPLICATED): the converter's file for tie_word_embeddings true."""
    m = load(rewrite(DATA / f"{NAME}.gguf", tmp_path / "t.gguf", drop_tensors=("output.weight",)))
    assert m.cfg.tied_output and m.output is m.token_embd


def test_refusals(tmp_path):
    """Partial rope (pangu-embed.cpp asserts n_embd_head == n_rot), tensors llama.cpp's loader creates none of (MLP
    biases, where its graph adds none; a fused attn_qkv the converter never writes), refused by name; a missing
    attn_output.bias (a required tensor) named."""
    src = DATA / f"{NAME}.gguf"
    with pytest.raises(MinferError, match="rope.dimension_count"):
        load(rewrite(src, tmp_path / "a.gguf",
                     set_keys={f"{NAME}.rope.dimension_count": (8, gguf.GGUFValueType.UINT32)}))
    with pytest.raises(MinferError, match=r"blk\.1\.ffn_down\.bias"):
        load(rewrite(src, tmp_path / "b.gguf", add_tensors={"blk.1.ffn_down.bias": np.zeros(32)}))
    with pytest.raises(MinferError, match=r"blk\.0\.attn_qkv\.weight"):
        load(rewrite(src, tmp_path / "c.gguf", add_tensors={"blk.0.attn_qkv.weight": np.zeros((96, 32))}))
    with pytest.raises(MinferError, match=r"blk\.1\.attn_output\.bias"):
        load(rewrite(src, tmp_path / "d.gguf", drop_tensors=("blk.1.attn_output.bias",)))
    assert torch.is_tensor(load(src).bias[1]["attn_output"])
