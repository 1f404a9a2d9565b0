"""InternLM2 / InternLM2.5 (minfer/models/internlm2.py, GGUF arch `internlm2`) on the CPU's float32 reference, against
two references that minfer made neither of: a torch forward of the HF checkpoint written from the InternLM2
architecture (tools/gen_internlm2_fixture.py reference(): the fused wqkv split per kv group, rotate_half rope, HF
repeat_kv), and llama.cpp's own logits (llama-cpp-python 0.3.36, an F32 copy of the file, F32 KV cache). transformers
5.25 has no InternLM2 class (remote code only), so test_arch_vs_transformers does not list it; this file runs its
checks here: logits at every position, greedy continuation (llama.cpp's), the KV cache in pieces, the batch engine's
paged cache; each rule of the graph needed (with one changed the logits miss by more than 10x the tolerance); the
loader's refusals; the vocabulary as the converter writes it (byte fallback, <|im_start|> / <|im_end|> as control
tokens, eos = <|im_end|>, the ChatML template) against llama.cpp's token ids; and the CUDA backend's code through
Triton's interpreter.

Fixture: tests/data/arch/internlm2.{gguf,npz,json} (tools/gen_internlm2_fixture.py build + goldens): hidden 64, 4
heads of 16 over 2 kv heads, FFN 96, 2 layers, vocab 320, rope base 1e6, untied output, converted by llama.cpp's
convert_hf_to_gguf.py (conversion/internlm.py InternLM2Model).

The checks every llama.cpp-checked decoder shares (logits against both references, greedy, the cache in pieces,
the batch engine's paged cache) run in tests/models/test_llamacpp_decoders.py, which lists this fixture."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

NAME = "internlm2"
BASE_ERR = 3e-6      # the fixture's float32 misses: 1.6e-6 (reference), 1.8e-6 (llama.cpp); they agree to 1.1e-6


def miss(eng, key: str = "logits") -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r[key])


def test_layout_read_from_the_file():
    from minfer.models.internlm2 import InternLM2Model

    eng = engine(NAME)
    m, c = eng.model, eng.model.cfg
    assert type(m) is InternLM2Model and c.arch == "internlm2"
    assert (c.head_dim, c.n_heads, c.n_kv_heads, c.d_model, c.ffn, c.vocab, c.n_layers) == (16, 4, 2, 64, 96, 320, 2)
    assert c.rope.style == "normal" and c.rope.n_rot == 16 and c.rope.theta == 1e6 and c.rope.freq_scale == 1.0
    assert c.rms_eps == pytest.approx(1e-6)
    assert not c.tied_output and m.output is not m.token_embd
    b = m.blocks[0]      # wqkv split by the converter: q (H*Dh, D), k and v (KV*Dh, D)
    assert tuple(b.attn_q.shape) == (64, 64) and tuple(b.attn_k.shape) == (32, 64) and tuple(b.attn_v.shape) == (32, 64)
    hf = json.loads((DATA / f"{NAME}.json").read_text())["config"]
    assert hf["architectures"] == ["InternLM2ForCausalLM"] and hf["rope_scaling"]["type"] == "dynamic"
    # HF's dynamic NTK: no key in the file (the converter's "dynamic": pass), and inside max_position_embeddings
    # HF would not apply it either
    from minfer.gguf_file import GGUFFile

    assert not [k for k in GGUFFile(DATA / f"{NAME}.gguf").metadata if ".rope.scaling." in k]
    assert hf["max_position_embeddings"] > len(ref(NAME)["ids"])


def test_the_two_references_agree():
    """The fixture's own check: the torch forward of the HF checkpoint and llama.cpp on the converted file."""
    r = ref(NAME)
    assert rel_err(r["lc_logits"], r["logits"]) < BASE_ERR
    assert r["lc_greedy"].tolist() == r["greedy"].tolist()


def _heads_as_modulo(m, monkeypatch):
    """Query head i reading kv head i % n_kv (the wrong GQA grouping) instead of i // q_per_kv: the query heads (and
    W_o's matching columns) reordered so the engine's i // q_per_kv grouping computes it."""
    c = m.cfg
    H, KV, Dh = c.n_heads, c.n_kv_heads, c.head_dim
    g = H // KV
    # new head n serves kv head n // g; put there the old head that kv head (old % KV) would serve
    perm = sorted(range(H), key=lambda i: (i % KV, i // KV))
    rows = torch.cat([torch.arange(p * Dh, (p + 1) * Dh) for p in perm])
    assert perm != list(range(H)) and all(perm[n] % KV == n // g for n in range(H))
    for b in m.blocks:
        monkeypatch.setattr(b.attn_q, "dense", b.attn_q.dense[rows])
        monkeypatch.setattr(b.attn_output, "dense", b.attn_output.dense[:, rows])


@pytest.mark.parametrize("what", ["neox", "base", "gqa_modulo", "no_ffn_norm"])
def test_each_rule_is_needed(monkeypatch, what):
    """NORM rope on the converter's permuted rows (not NEOX halves), the file's base 1e6 (not llama.cpp's default
    1e4), query head i on kv head i // q_per_kv (the per-group wqkv order), the FFN norm's weight."""
    from dataclasses import replace

    eng = engine(NAME)
    m, c = eng.model, eng.model.cfg
    assert miss(eng) < BASE_ERR
    if what == "neox":
        object.__setattr__(c, "rope", replace(c.rope, style="neox"))       # (this engine's own cfg)
    elif what == "base":
        object.__setattr__(c, "rope", replace(c.rope, theta=10000.0))
    elif what == "gqa_modulo":
        _heads_as_modulo(m, monkeypatch)
    else:
        for b in m.blocks:
            monkeypatch.setattr(b, "ffn_norm", torch.ones_like(b.ffn_norm))
    assert miss(eng) > 10 * TOL and miss(eng, "lc_logits") > 10 * TOL


def test_refusals(tmp_path):
    """What llama.cpp's loader requires (output.weight; whole-head rope) or the converter never writes (biases,
    a fused attn_qkv), refused by name rather than run wrongly."""
    src = DATA / f"{NAME}.gguf"
    with pytest.raises(MinferError, match=r"output\.weight"):
        load(rewrite(src, tmp_path / "a.gguf", drop_tensors=("output.weight",)))
    with pytest.raises(MinferError, match=r"blk\.1\.attn_k\.bias"):
        load(rewrite(src, tmp_path / "b.gguf", add_tensors={"blk.1.attn_k.bias": np.zeros(32)}))
    with pytest.raises(MinferError, match=r"blk\.0\.attn_qkv\.weight"):
        load(rewrite(src, tmp_path / "c.gguf", add_tensors={"blk.0.attn_qkv.weight": np.zeros((128, 64))}))
    with pytest.raises(MinferError, match="rope.dimension_count"):
        load(rewrite(src, tmp_path / "d.gguf",
                     set_keys={f"{NAME}.rope.dimension_count": (8, gguf.GGUFValueType.UINT32)}))


def test_vocabulary_as_llamacpp_reads_it():
    """The converter's vocabulary: SentencePiece with byte fallback (GGUF's G as <0x47>), <|im_start|> (319) and
    <|im_end|> (318) control tokens from tokenizer_config.json's added_tokens_decoder, eos rewritten to <|im_end|> for
    the chat model (InternLM2Model.set_vocab), bos added; minfer's ids equal llama.cpp's (Llama.tokenize(add_bos,
    special)) and the ChatML template renders the first text."""
    from minfer.tokenizer.chat_template import chat_token_ids

    r = ref(NAME)
    meta = json.loads((DATA / f"{NAME}.json").read_text())
    tok = engine(NAME).tokenizer
    assert tok.eos_id == 318 and tok.token_text(318) == "<|im_end|>" and tok.token_text(319) == "<|im_start|>"
    assert tok.is_eog(318) and tok.bos_id == 1 and tok.add_bos
    assert tok.token_text(ord("G") + 3) == "<0x47>"
    for i, text in enumerate(meta["texts"]):
        assert tok.encode(text, add_bos=True, parse_special=True) == r[f"tok_{i}"].tolist(), text
    assert tok.decode(r["tok_1"].tolist()[1:]) == meta["texts"][1]
    msgs = [{"role": "user", "content": "minfer runs GGUF models"}]
    assert tok.apply_chat_template(msgs) == "<s>" + meta["texts"][0]
    assert chat_token_ids(tok, msgs) == r["tok_0"].tolist()


# The CUDA backend's code on the CPU (Triton's interpreter, prefill and the host-free decode step against the
# reference, the paths it must take): tests/ops/test_arch_forward_interpreted.py, which lists this fixture.
