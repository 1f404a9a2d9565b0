"""Baichuan-7B (minfer/models/baichuan.py, GGUF arch `baichuan`) on the CPU's float32 reference, against two
references that minfer made neither of: a torch forward of the HF checkpoint written from the Baichuan-7B
architecture (tools/gen_baichuan_fixture.py reference(): W_pack split in thirds, rotate_half rope), and llama.cpp's own
logits (llama-cpp-python 0.3.36, an F32 copy of the file, F32 KV cache). transformers 5.25 has no Baichuan class
(remote code only), so test_arch_vs_transformers does not list it; this file runs its own checks: each rule of the
graph needed (with one changed the logits miss by more than 10x the tolerance); the loader's refusals (the 13B kind
with ALiBi, layer counts llama.cpp runs without position encoding, a missing output, biases); the vocabulary against
llama.cpp's token ids.

Fixture: tests/data/arch/baichuan.{gguf,npz,json} (tools/gen_baichuan_fixture.py build + goldens): 32 layers (llama.cpp
picks rope for 32 layers only), hidden 16, one head of 16, FFN 16, vocab 304, rope base 10000, untied output,
converted by llama.cpp's convert_hf_to_gguf.py (conversion/baichuan.py BaichuanModel).

The checks every llama.cpp-checked decoder shares (logits against both references, greedy, the cache in pieces,
the batch engine's paged cache) run in tests/models/test_llamacpp_decoders.py, which lists this fixture; the CUDA
backend's code through Triton's interpreter in tests/ops/test_arch_forward_interpreted.py."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

NAME = "baichuan"
BASE_ERR = 1.5e-5    # the fixture's float32 misses: 3.4e-6 (reference), 7.9e-6 (llama.cpp); they agree to 6.1e-6


def miss(eng, key: str = "logits") -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r[key])


def test_layout_read_from_the_file():
    from minfer.models.baichuan import BaichuanModel

    eng = engine(NAME)
    m, c = eng.model, eng.model.cfg
    assert type(m) is BaichuanModel and c.arch == "baichuan"
    assert (c.head_dim, c.n_heads, c.n_kv_heads, c.d_model, c.ffn, c.vocab, c.n_layers) == (16, 1, 1, 16, 16, 304, 32)
    assert c.rope.style == "normal" and c.rope.n_rot == 16 and c.rope.theta == 10000.0 and c.rope.freq_scale == 1.0
    assert c.rms_eps == pytest.approx(1e-6)
    assert not c.tied_output and m.output is not m.token_embd
    b = m.blocks[0]      # W_pack split in thirds by the converter
    assert tuple(b.attn_q.shape) == (16, 16) and tuple(b.attn_k.shape) == (16, 16) and tuple(b.attn_v.shape) == (16, 16)
    hf = json.loads((DATA / f"{NAME}.json").read_text())["config"]
    assert hf["architectures"] == ["BaiChuanForCausalLM"] and "rope_theta" not in hf


def test_the_two_references_agree():
    """The fixture's own check: the torch forward of the HF checkpoint and llama.cpp on the converted file."""
    r = ref(NAME)
    assert rel_err(r["lc_logits"], r["logits"]) < BASE_ERR
    assert r["lc_greedy"].tolist() == r["greedy"].tolist()


@pytest.mark.parametrize("what", ["neox", "base", "no_rope", "no_ffn_norm"])
def test_each_rule_is_needed(monkeypatch, what):
    """NORM rope on the converter's permuted rows (not NEOX halves), base 10000 (no key in the file), rope applied at
    all (what llama.cpp's graph would skip for a layer count other than 32), the FFN norm's weight."""
    from dataclasses import replace

    eng = engine(NAME)
    m, c = eng.model, eng.model.cfg
    assert miss(eng) < BASE_ERR
    if what == "neox":
        object.__setattr__(c, "rope", replace(c.rope, style="neox"))       # (this engine's own cfg)
    elif what == "base":
        object.__setattr__(c, "rope", replace(c.rope, theta=1e6))
    elif what == "no_rope":
        object.__setattr__(c, "rope", replace(c.rope, freq_scale=0.0))     # every angle 0: no rotation
    else:
        for b in m.blocks:
            monkeypatch.setattr(b, "ffn_norm", torch.ones_like(b.ffn_norm))
    assert miss(eng) > 10 * TOL and miss(eng, "lc_logits") > 10 * TOL


def test_refusals(tmp_path):
    """What llama.cpp's loader requires (output.weight; whole-head rope), runs with ALiBi (40 layers: the 13B kind)
    or with no position encoding (any count but 32 and 40), or the converter never writes (biases, a fused attn_qkv),
    refused by name rather than run wrongly."""
    src = DATA / f"{NAME}.gguf"
    u32 = gguf.GGUFValueType.UINT32
    with pytest.raises(MinferError, match=r"output\.weight"):
        load(rewrite(src, tmp_path / "a.gguf", drop_tensors=("output.weight",)))
    with pytest.raises(MinferError, match=r"blk\.1\.attn_k\.bias"):
        load(rewrite(src, tmp_path / "b.gguf", add_tensors={"blk.1.attn_k.bias": np.zeros(16)}))
    with pytest.raises(MinferError, match=r"blk\.0\.attn_qkv\.weight"):
        load(rewrite(src, tmp_path / "c.gguf", add_tensors={"blk.0.attn_qkv.weight": np.zeros((48, 16))}))
    with pytest.raises(MinferError, match="rope.dimension_count"):
        load(rewrite(src, tmp_path / "d.gguf", set_keys={f"{NAME}.rope.dimension_count": (8, u32)}))
    shapes = {"attn_norm.weight": (16,), "attn_q.weight": (16, 16), "attn_k.weight": (16, 16), "attn_v.weight": (16, 16),
              "attn_output.weight": (16, 16), "ffn_norm.weight": (16,), "ffn_gate.weight": (16, 16),
              "ffn_up.weight": (16, 16), "ffn_down.weight": (16, 16)}
    more = {f"blk.{i}.{k}": np.ones(v, dtype=np.float32) for i in range(32, 40) for k, v in shapes.items()}
    with pytest.raises(MinferError, match="13B kind.*ALiBi"):
        load(rewrite(src, tmp_path / "e.gguf", set_keys={f"{NAME}.block_count": (40, u32)}, add_tensors=more))
    fewer = tuple(f"blk.{i}.{k}" for i in range(2, 32) for k in shapes)
    with pytest.raises(MinferError, match="with 2 layers"):
        load(rewrite(src, tmp_path / "f.gguf", set_keys={f"{NAME}.block_count": (2, u32)}, drop_tensors=fewer))


def test_vocabulary_as_llamacpp_reads_it():
    """The converter's vocabulary (_set_vocab_sentencepiece): SentencePiece with byte fallback (GGUF's G as <0x47>),
    bos added; minfer's ids equal llama.cpp's (Llama.tokenize(add_bos, special))."""
    r = ref(NAME)
    meta = json.loads((DATA / f"{NAME}.json").read_text())
    tok = engine(NAME).tokenizer
    assert tok.bos_id == 1 and tok.eos_id == 2 and tok.add_bos and tok.is_eog(2)
    assert tok.token_text(ord("G") + 3) == "<0x47>"
    for i, text in enumerate(meta["texts"]):
        assert tok.encode(text, add_bos=True, parse_special=True) == r[f"tok_{i}"].tolist(), text
    assert tok.decode(r["tok_0"].tolist()[1:]) == meta["texts"][0]
