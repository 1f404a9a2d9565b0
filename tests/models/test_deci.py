"""deci (minfer/models/deci.py: DeciLM / Llama-3.1-Nemotron-51B, Nano-8B, Super-49B) on the CPU's float32 reference,
against two references that share no code with minfer: an independent float64 torch forward of the DeciLM block
semantics, and llama.cpp's own logits (llama-cpp-python 0.3.36 on an F32 copy of the fixture). transformers has no
DeciLM class (remote code only), so this arch is not in test_arch_vs_transformers.

Fixture: tests/data/arch/deci.gguf (tools/gen_deci_fixture.py: a hand-written DeciLMForCausalLM checkpoint converted by
llama.cpp's conversion/deci.py; hidden 16, 2 heads of 8, llama3 rope factors, six layers: GQA (1 kv head) + FFN 256,
MHA (2 kv heads) + FFN 512, no attention + FFN 256, "linear attention" + FFN 256, no attention + no FFN, GQA + FFN 256).
Each layer kind is needed: with one mishandled the logits miss by far more than the tolerance."""

from __future__ import annotations

from dataclasses import replace

import gguf
import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, engine, load, ref, rel_err, rewrite

NAME = "deci"
TOL = 5e-5            # the float32 miss is 4.4e-6 against both references
FAR = 1e-2            # what a mishandled rule must miss by


def miss(eng, key: str = "logits") -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r[key])


def test_layout_read_from_the_file():
    m = engine(NAME).model
    c = m.cfg
    assert c.arch == "deci" and c.rope.style == "normal" and (c.d_model, c.head_dim) == (16, 8)
    assert m.kinds == ("attention", "attention", "none", "linear", "none", "attention")
    assert c.heads_per_layer == (2, 2, 0, 2, 0, 2) and c.kv_heads_per_layer == (1, 2, 0, 0, 0, 1)
    assert m.ffn_widths == (256, 512, 256, 256, 0, 256)
    # the cache: rows only on the attention layers, each with its own kv heads
    assert c.kv_layers == ((1, 8, 8), (2, 8, 8), None, None, None, (1, 8, 8))
    b = m.blocks
    assert b[0].attn_k.shape == (8, 16) and b[1].attn_k.shape == (16, 16) and b[1].ffn_up.shape == (512, 16)
    assert b[2].attn_norm is None and b[2].attn_output is None and b[2].ffn_up.shape == (256, 16)
    assert b[3].attn_q is None and b[3].attn_output.shape == (16, 16) and b[3].attn_norm is not None
    assert b[4].attn_norm is None and b[4].ffn_norm is None and b[4].matrices() == []
    ff = c.rope.freq_factors      # llama3 scaling at original context 64: factors other than 1
    assert ff is not None and len(ff) == 4 and ff[0] == 1.0 and max(ff) == 8.0
    assert not c.tied_output


def test_logits_match_both_references():
    r = ref(NAME)
    assert rel_err(r["lcpp_logits"], r["logits"]) < TOL        # the two references agree
    eng = engine(NAME)
    assert miss(eng) < TOL
    assert miss(eng, "lcpp_logits") < TOL
    got = eng.logits(r["ids"].tolist()).numpy()
    assert (got.argmax(-1) == r["lcpp_logits"].argmax(-1)).all()


def test_greedy_identical_to_llama_cpp():
    from minfer.runtime.sampling import SamplingParams

    r = ref(NAME)
    assert r["greedy"].tolist() == r["lcpp_greedy"].tolist()
    eng = engine(NAME)
    out = [ev.token_id for ev in eng.generate(r["prompt"].tolist(), SamplingParams(temperature=0),
                                              max_new_tokens=len(r["greedy"]))]
    assert out == r["lcpp_greedy"].tolist()


def test_cache_in_pieces_equals_one_pass():
    """Pieces of 1-3 tokens and longer ones: the attention layers read back their own rows (1 or 2 kv heads), the
    no-op and linear layers keep none."""
    r = ref(NAME)
    ids = r["ids"].tolist()
    eng = engine(NAME)
    whole = eng.logits(ids).numpy()
    cuts = [0, 1, 2, 4, 5, 14, 15, 23, len(ids)]
    got = np.concatenate([eng.forward(ids[a:b], a).numpy() for a, b in zip(cuts, cuts[1:])])
    assert rel_err(got, whole) < 1e-5
    assert rel_err(got, r["logits"]) < TOL


def test_batch_engine_greedy():
    """The paged cache (blocks of 4) with per-layer geometry and cache-less layers, next to a second sequence."""
    from minfer.runtime.batch_engine import BatchEngine
    from minfer.runtime.sampling import SamplingParams

    r = ref(NAME)
    eng = engine(NAME)
    be = BatchEngine(eng.model, eng.tokenizer, n_ctx=64, max_seqs=2, n_blocks=40, block_size=4)
    n = len(r["greedy"])
    other = r["ids"][10:25].tolist()
    outs = be.generate_many([r["prompt"].tolist(), other], SamplingParams(temperature=0), n)
    assert [ev.token_id for ev in outs[0]] == r["lcpp_greedy"].tolist()
    single = [ev.token_id for ev in eng.generate(other, SamplingParams(temperature=0), max_new_tokens=n)]
    assert [ev.token_id for ev in outs[1]] == single


@pytest.mark.parametrize("what", ["linear_dropped", "ffn_512_cut", "kv_heads_swapped", "no_rope_factors",
                                  "neox_rope"])
def test_each_rule_is_needed(monkeypatch, what):
    """The linear layer's W_o n(x) (not skipped as a no-op layer), layer 1's full FFN width (512, not layer 0's 256),
    layer 1's two kv heads each serving its own query head, the llama3 rope factors and NORM pairs."""
    eng = engine(NAME)
    m = eng.model
    assert miss(eng) < TOL
    if what == "linear_dropped":
        m.kinds = m.kinds[:3] + ("none",) + m.kinds[4:]
    elif what == "ffn_512_cut":
        b = m.blocks[1]
        for name in ("ffn_gate", "ffn_up"):
            monkeypatch.setattr(getattr(b, name), "dense", getattr(b, name).dense[:256])
        monkeypatch.setattr(b.ffn_down, "dense", b.ffn_down.dense[:, :256])
    elif what == "kv_heads_swapped":
        b = m.blocks[1]
        for name in ("attn_k", "attn_v"):
            d = getattr(b, name).dense
            monkeypatch.setattr(getattr(b, name), "dense", torch.cat([d[8:], d[:8]]))
    else:
        for i, lc in enumerate(m.layer_cfg):
            if lc is not None:
                rope = (replace(lc.rope, freq_factors=None) if what == "no_rope_factors"
                        else replace(lc.rope, style="neox"))
                m.layer_cfg[i] = replace(lc, rope=rope)
    err = miss(eng)
    assert err > FAR, (what, err)


def test_attention_without_ffn_is_refused(tmp_path):
    """A layer with attention and feed_forward_length 0: llama.cpp's deci graph `continue`s past it, dropping the
    attention's output (the goldens: llama.cpp's logits of such a variant equal the layer skipped whole and miss
    DeciLM's, which adds it), so minfer refuses the file by name rather than pick one."""
    r = ref(NAME)
    assert float(r["variant_lcpp_vs_skip"]) < 1e-4 and float(r["variant_lcpp_vs_hf"]) > 0.1
    src = DATA / f"{NAME}.gguf"
    rd = gguf.GGUFReader(str(src))
    ff = [int(v) for v in rd.fields["deci.feed_forward_length"].contents()]
    ff[1] = 0
    p = rewrite(src, tmp_path / "noffn.gguf", drop_tensors=tuple(f"blk.1.{t}.weight" for t in
                                                                 ("ffn_gate", "ffn_up", "ffn_down", "ffn_norm")),
                set_keys={"deci.feed_forward_length": (ff, gguf.GGUFValueType.ARRAY)})
    with pytest.raises(MinferError, match="layer 1 has attention attention and deci.feed_forward_length 0"):
        load(p)


def test_plain_counts_and_refusals(tmp_path):
    """Scalars read as every layer alike (DeciLM-7B writes one head_count); bias tensors and attention.scale refused
    by name; a layer's missing tensor named."""
    src = DATA / f"{NAME}.gguf"
    p = rewrite(src, tmp_path / "bias.gguf", add_tensors={"blk.0.attn_output.bias": np.zeros(16)})
    with pytest.raises(MinferError, match="blk.0.attn_output.bias"):
        load(p)
    p = rewrite(src, tmp_path / "scale.gguf", set_keys={"deci.attention.scale": (0.5, gguf.GGUFValueType.FLOAT32)})
    with pytest.raises(MinferError, match="deci.attention.scale"):
        load(p)
    p = rewrite(src, tmp_path / "nolin.gguf", drop_tensors=("blk.3.attn_output.weight",))
    with pytest.raises(MinferError, match="blk.3.attn_output.weight"):
        load(p)
    U32 = gguf.GGUFValueType.UINT32
    # all six layers as layer 0's kind cannot load this file's tensors: the per-layer arrays are what is read
    p = rewrite(src, tmp_path / "scalar.gguf", set_keys={"deci.attention.head_count": (2, U32),
                                                          "deci.attention.head_count_kv": (1, U32),
                                                          "deci.feed_forward_length": (256, U32)})
    with pytest.raises(MinferError):
        load(p)


# The CUDA backend's code on the CPU (Triton's interpreter, prefill and the host-free decode step against the
# reference, the paths it must take): tests/ops/test_arch_forward_interpreted.py, which lists this fixture.
