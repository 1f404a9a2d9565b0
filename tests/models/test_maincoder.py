"""Maincoder (minfer/models/maincoder.py, GGUF arch `maincoder`) on the CPU's float32 reference, against two
references that minfer made neither of: a torch forward of the HF checkpoint written from the architecture
(tools/gen_maincoder_fixture.py reference(): adjacent-pair rope on the unpermuted rows, then the per-head q/k
RMSNorm, a tied lm head), and llama.cpp's own logits (llama-cpp-python 0.3.36, an F32 copy of the file, F32 KV
cache). transformers 5.25 has no Maincoder class (remote code only), so this file runs the checks: logits at every
position, greedy continuation (llama.cpp's), the KV cache in pieces, the batch engine's paged cache; each rule of the
graph needed (with one changed the logits miss by more than 10x the tolerance); the loader's refusals; and the CUDA
backend's code through Triton's interpreter.

Fixture: tests/data/arch/maincoder.{gguf,npz,json} (tools/gen_maincoder_fixture.py build + goldens): hidden 64, 4
heads of 24 (96 != 64) over 2 kv heads, FFN 96, 2 layers, vocab 320, rope base 1e4, tied lm head (no output.weight),
converted by llama.cpp's convert_hf_to_gguf.py (conversion/maincoder.py MaincoderModel).

The checks every llama.cpp-checked decoder shares (logits against both references, greedy, the cache in pieces,
the batch engine's paged cache) run in tests/models/test_llamacpp_decoders.py, which lists this fixture."""

from __future__ import annotations


import gguf
import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

NAME = "maincoder"
BASE_ERR = 5e-6      # the fixture's float32 misses: 1.4e-6 (reference), 2.4e-6 (llama.cpp); they agree to 1.9e-6


def miss(eng, key: str = "logits") -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r[key])


def test_layout_read_from_the_file():
    from minfer.models.maincoder import MaincoderModel

    eng = engine(NAME)
    m, c = eng.model, eng.model.cfg
    assert type(m) is MaincoderModel and c.arch == NAME
    assert (c.head_dim, c.n_heads, c.n_kv_heads, c.d_model, c.ffn, c.vocab, c.n_layers) == (24, 4, 2, 64, 96, 320, 2)
    assert c.rope.style == "normal" and c.rope.n_rot == 24 and c.rope.theta == 1e4
    assert c.tied_output and m.output is m.token_embd          # no output.weight: llama.cpp's fallback
    b = m.blocks[0]
    assert tuple(b.attn_q.shape) == (96, 64) and tuple(b.attn_output.shape) == (64, 96)
    assert tuple(b.attn_q_norm.shape) == (24,) and tuple(b.attn_k_norm.shape) == (24,)


def test_the_two_references_agree():
    r = ref(NAME)
    assert rel_err(r["lc_logits"], r["logits"]) < BASE_ERR
    assert r["lc_greedy"].tolist() == r["greedy"].tolist()
    assert len(set(r["greedy"].tolist())) > 8          # not a degenerate continuation


@pytest.mark.parametrize("what", ["norm_before_rope", "no_qk_norm", "neox", "base"])
def test_each_rule_is_needed(monkeypatch, what):
    """The q/k norms after rope (not before, as qwen3's layers.attention_heads), the q/k norms at all, NORM rope
    on the unpermuted rows (not NEOX halves), the file's rope base."""
    from dataclasses import replace

    from minfer.models import layers

    eng = engine(NAME)
    m, c = eng.model, eng.model.cfg
    assert miss(eng) < BASE_ERR
    if what == "norm_before_rope":
        monkeypatch.setattr(m, "attention_heads", lambda h, blk, i, cache, step, ctx:
                            layers.attention_heads(h, blk, c, cache, i, step, ctx))
    elif what == "no_qk_norm":
        for b in m.blocks:
            monkeypatch.setattr(b, "attn_q_norm", torch.ones_like(b.attn_q_norm))
            monkeypatch.setattr(b, "attn_k_norm", torch.ones_like(b.attn_k_norm))
    elif what == "neox":
        object.__setattr__(c, "rope", replace(c.rope, style="neox"))       # (this engine's own cfg)
    else:
        object.__setattr__(c, "rope", replace(c.rope, theta=1e6))
    assert miss(eng) > 10 * TOL and miss(eng, "lc_logits") > 10 * TOL


def test_untied_output_is_read(tmp_path):
    """An output.weight in the file is the lm head (llama.cpp's loader takes it before the fallback)."""
    from minfer.runtime.engine import Engine

    from models.test_arch_vs_transformers import reference_switches

    rd = gguf.GGUFReader(str(DATA / f"{NAME}.gguf"))
    emb = next(t for t in rd.tensors if t.name == "token_embd.weight")
    out = -2.0 * np.asarray(emb.data, dtype=np.float32).reshape(320, 64)
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "u.gguf", add_tensors={"output.weight": out})
    eng = Engine.load(p, ctx=64, progress=False, switches=reference_switches())
    assert not eng.model.cfg.tied_output
    assert miss(eng) > 10 * TOL
    assert rel_err(eng.logits(ref(NAME)["ids"].tolist()).numpy(), -2.0 * ref(NAME)["logits"]) < BASE_ERR


def test_refusals(tmp_path):
    """Partial rope (maincoder.cpp asserts n_embd_head == n_rot) and tensors the converter never writes (biases, a
    fused attn_qkv), refused by name rather than run wrongly; a missing q/k norm named."""
    src = DATA / f"{NAME}.gguf"
    with pytest.raises(MinferError, match="rope.dimension_count"):
        load(rewrite(src, tmp_path / "a.gguf",
                     set_keys={f"{NAME}.rope.dimension_count": (8, gguf.GGUFValueType.UINT32)}))
    with pytest.raises(MinferError, match=r"blk\.1\.attn_k\.bias"):
        load(rewrite(src, tmp_path / "b.gguf", add_tensors={"blk.1.attn_k.bias": np.zeros(48)}))
    with pytest.raises(MinferError, match=r"blk\.0\.attn_qkv\.weight"):
        load(rewrite(src, tmp_path / "c.gguf", add_tensors={"blk.0.attn_qkv.weight": np.zeros((192, 64))}))
    with pytest.raises(MinferError, match=r"blk\.0\.attn_k_norm\.weight"):
        load(rewrite(src, tmp_path / "d.gguf", drop_tensors=("blk.0.attn_k_norm.weight",)))


# The CUDA backend's code on the CPU (Triton's interpreter, prefill and the host-free decode step against the
# reference, the paths it must take): tests/ops/test_arch_forward_interpreted.py, which lists this fixture.
