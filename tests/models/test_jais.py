"""Jais v1 (minfer/models/jais.py, GGUF arch `jais`) on the CPU's float32 reference, against two references that minfer
made neither of: a torch forward of the HF checkpoint written from the architecture (tools/gen_jais_fixture.py
reference(): HF modeling_jais's ALiBi - m_h |p - j| from its _get_alibi_slopes, the 1/Dh score scale of
scale_qk_dot_by_d, the fused Conv1D c_attn, the c_fc * silu(c_fc2) MLP with biases, LayerNorms with bias, and the muP
embeddings_scale / width_scale at their places in HF's forward), and llama.cpp's own logits (llama-cpp-python 0.3.36,
an F32 copy of the file, F32 KV cache). transformers 5.25 has no Jais class (remote code only), so this file runs:
logits at every position against both, greedy continuation (llama.cpp's), the KV cache in pieces; each rule of the
graph needed (with one changed the logits miss both by more than 10x the tolerance); HF's slopes equal to ggml's and
the converter's max_alibi_bias 8 for any head count; the batch engine's refusal (no ALiBi in the paged cache); the
loader's refusals.

Fixture: tests/data/arch/jais.{gguf,npz,json} (tools/gen_jais_fixture.py build + goldens): hidden 40, 5 heads of 8
(not a power of two: the extra head takes the finer base), FFN 80, 2 layers, vocab 320, embeddings_scale 14.6 and
width_scale 0.111 (Jais-13B's), an untied lm head, converted by llama.cpp's convert_hf_to_gguf.py --no-lazy
(conversion/jais.py JaisModel)."""

from __future__ import annotations

import json
import math

import gguf
import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from minfer.models.jais import JaisModel
from minfer.ops.reference import alibi_slopes
from models.arch_checks import BIAS_GROUPS, assert_refused, drop_bias_group, rewritten_engine
from models.test_arch_vs_transformers import DATA, TOL, engine, ref, rel_err

NAME = "jais"
BASE_ERR = 3e-6      # the fixture's float32 misses: 6.8e-7 (reference), 9.8e-7 (llama.cpp); they agree to 6.6e-7
EMB_SCALE, WIDTH_SCALE = 14.6, 0.111      # the fixture's config.json (tools/gen_jais_fixture.py)


def miss(eng, key: str = "logits") -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r[key])


def test_layout_read_from_the_file():
    eng = engine(NAME)
    m, c = eng.model, eng.model.cfg
    assert type(m) is JaisModel and c.arch == NAME and m.paged_kv is False
    assert (c.head_dim, c.n_heads, c.n_kv_heads, c.d_model, c.ffn, c.vocab, c.n_layers) == (8, 5, 5, 40, 80, 320, 2)
    assert c.rms_eps == pytest.approx(1e-5)
    assert not c.tied_output and m.output is not m.token_embd
    assert torch.equal(m.alibi.cpu(), alibi_slopes(5, 8.0)) and m.kq_scale == 1.0 / 8
    b = m.blocks[0]
    assert tuple(b.attn_qkv.shape) == (120, 40) and tuple(b.attn_output.shape) == (40, 40)
    assert tuple(b.ffn_gate.shape) == (80, 40) and tuple(b.ffn_up.shape) == (80, 40)
    assert tuple(b.ffn_down.shape) == (40, 80) and tuple(b.ffn_gate_b.shape) == (80,)


@pytest.mark.parametrize("key", ["logits", "lc_logits"])
def test_logits_match_both_references(key):
    r = ref(NAME)
    got = engine(NAME).logits(r["ids"].tolist()).numpy()
    assert got.shape == r[key].shape
    assert rel_err(got, r[key]) < BASE_ERR
    assert (got.argmax(-1) == r[key].argmax(-1)).all()


def test_the_two_references_agree():
    r = ref(NAME)
    assert rel_err(r["lc_logits"], r["logits"]) < BASE_ERR
    assert r["lc_greedy"].tolist() == r["greedy"].tolist()
    assert len(set(r["greedy"].tolist())) > 8          # not a degenerate continuation


def test_greedy_matches_llamacpp():
    from minfer.runtime.sampling import SamplingParams

    r = ref(NAME)
    out = [ev.token_id for ev in engine(NAME).generate(r["prompt"].tolist(), SamplingParams(temperature=0),
                                                       max_new_tokens=len(r["lc_greedy"]))]
    assert out == r["lc_greedy"].tolist()


def test_cache_in_pieces_equals_one_pass():
    """ALiBi's distances from cached keys: one-token decode steps and chunks at other offsets."""
    r = ref(NAME)
    ids = r["ids"].tolist()
    eng = engine(NAME)
    cuts = [0, 1, 2, 5, 14, 15, 23, len(ids)]
    got = np.concatenate([eng.forward(ids[a:b], a).numpy() for a, b in zip(cuts, cuts[1:])])
    assert rel_err(got, r["logits"]) < BASE_ERR and rel_err(got, r["lc_logits"]) < BASE_ERR


def hf_jais_slopes(n: int) -> list[float]:
    """HF modeling_jais AlibiPositionEmbeddingLayer._get_alibi_slopes, as written there (Press's recursion)."""
    def power_of_2(k):
        start = 2 ** (-(2 ** -(math.log2(k) - 3)))
        return [start * start ** i for i in range(k)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + hf_jais_slopes(2 * closest)[0::2][:n - closest]


@pytest.mark.parametrize("n_head", [1, 2, 3, 5, 8, 12, 16, 32, 40, 48, 56, 64])
def test_hf_jais_slopes_are_ggmls(n_head):
    """HF's slopes (relative_pe.slopes) are ggml's m0 / m1 rule with the max_bias the converter derives from them
    (conversion/jais.py: -round(log2(slopes[0]) * 2^floor(log2 H)) = 8); Jais-13B has 40 heads, Jais-30B 56."""
    hf = hf_jais_slopes(n_head)
    n_log2 = 2 ** math.floor(math.log2(n_head))
    max_bias = -round(math.log2(hf[0]) * n_log2)
    assert max_bias == 8
    assert torch.allclose(torch.tensor(hf, dtype=torch.float32), alibi_slopes(n_head, float(max_bias)),
                          rtol=1e-6, atol=0)


RULES = ["no_alibi", "max_bias_4", "sqrt_scale", "gate_up_swapped", "rms_norm", "embeddings_scale_again",
         "width_scale_again", "ffn_gate_bias", *BIAS_GROUPS]


@pytest.mark.parametrize("what", RULES)
def test_each_rule_is_needed(monkeypatch, what):
    """ALiBi (the only position information), its max_bias 8, the 1/Dh score scale (not 1/sqrt(Dh)), silu on the
    gate (c_fc2) not the up (c_fc), LayerNorm (not RMSNorm), the muP scales taken from the file as they are (applied
    once more: both miss), and each group of biases (the gate's alone too): with any changed the logits miss both
    references by far."""
    from minfer import ops
    from minfer.models import jais

    eng = engine(NAME)
    m, c = eng.model, eng.model.cfg
    assert miss(eng) < BASE_ERR
    if what == "no_alibi":
        m.alibi = None
    elif what == "max_bias_4":
        m.alibi = alibi_slopes(c.n_heads, 4.0)
    elif what == "sqrt_scale":           # HF's scale_qk_dot_by_d false (GPT-2's scale): what llama.cpp never does
        m.kq_scale = 1.0 / math.sqrt(c.head_dim)
    elif what == "gate_up_swapped":
        for b in m.blocks:
            b.ffn_gate, b.ffn_up, b.ffn_gate_b, b.ffn_up_b = b.ffn_up, b.ffn_gate, b.ffn_up_b, b.ffn_gate_b
    elif what == "rms_norm":             # RMSNorm * w + b: the mean kept
        monkeypatch.setattr(jais, "layer_norm", lambda x, w, b, eps, dt: (ops.rms_norm(x, w, eps) + b).to(dt))
    elif what == "embeddings_scale_again":
        emb = ops.embedding
        monkeypatch.setattr(ops, "embedding", lambda t, w: emb(t, w) * EMB_SCALE)
    elif what == "width_scale_again":
        head = m.head
        monkeypatch.setattr(m, "head", lambda h, ctx: head(h, ctx) * WIDTH_SCALE)
    elif what == "ffn_gate_bias":
        for b in m.blocks:
            b.ffn_gate_b = None
    else:
        drop_bias_group(m, what)
    assert miss(eng) > 10 * TOL and miss(eng, "lc_logits") > 10 * TOL
    if what == "sqrt_scale":             # as far as the generator measured HF's 1/sqrt(Dh) forward to be
        hf = json.loads((DATA / f"{NAME}.json").read_text())["hf_sqrt_scale_rel_err"]
        assert miss(eng) == pytest.approx(hf, abs=1e-3)


def test_max_alibi_bias_is_read_from_the_file(tmp_path):
    """jais.attention.max_alibi_bias is the slopes' max_bias (load_arch_hparams reads it; no constant as bloom's)."""
    key = f"{NAME}.attention.max_alibi_bias"
    eng = rewritten_engine(NAME, tmp_path, set_keys={key: (4.0, gguf.GGUFValueType.FLOAT32)})
    assert torch.equal(eng.model.alibi.cpu(), alibi_slopes(5, 4.0))
    assert miss(eng) > 10 * TOL and miss(eng, "lc_logits") > 10 * TOL


def test_batch_engine_is_refused_by_name():
    """The paged cache has no ALiBi (runtime/paged_kv.py attend takes no slopes): paged_kv False, as bloom / mpt."""
    from minfer.runtime.batch_engine import BatchEngine

    with pytest.raises(MinferError, match=NAME):
        BatchEngine.from_engine(engine(NAME))


@pytest.mark.parametrize("kw,match", [
    # no ALiBi: llama.cpp's use_alibi off, no position information at all
    (dict(drop_keys=(f"{NAME}.attention.max_alibi_bias",)), f"{NAME}.attention.max_alibi_bias"),
    (dict(set_keys={f"{NAME}.attention.max_alibi_bias": (0.0, gguf.GGUFValueType.FLOAT32)}),
     f"{NAME}.attention.max_alibi_bias"),
    # tensors llama.cpp's jais loader does not create
    (dict(add_tensors={"position_embd.weight": np.ones((256, 40), np.float32)}), "position_embd.weight"),
    (dict(add_tensors={"token_embd_norm.weight": np.ones(40, np.float32)}), "token_embd_norm.weight"),
    (dict(add_tensors={"blk.0.attn_q.weight": np.zeros((40, 40), np.float32)}), "blk.0.attn_q.weight"),
    (dict(set_keys={f"{NAME}.expert_count": (4, gguf.GGUFValueType.UINT32)}), f"{NAME}.expert_count"),
    # required (flag 0): the lm head, the biases, the norms' biases, the eps
    (dict(drop_tensors=("output.weight",)), "output.weight"),
    (dict(drop_tensors=("blk.0.attn_qkv.bias",)), "blk.0.attn_qkv.bias"),
    (dict(drop_tensors=("blk.1.ffn_gate.bias",)), "blk.1.ffn_gate.bias"),
    (dict(drop_tensors=("blk.1.ffn_gate.weight",)), "blk.1.ffn_gate.weight"),
    (dict(drop_tensors=("blk.0.ffn_down.bias",)), "blk.0.ffn_down.bias"),
    (dict(drop_tensors=("blk.1.attn_norm.bias",)), "blk.1.attn_norm.bias"),
    (dict(drop_tensors=("output_norm.bias",)), "output_norm.bias"),
    (dict(drop_keys=(f"{NAME}.attention.layer_norm_epsilon",)), f"{NAME}.attention.layer_norm_epsilon"),
])
def test_bad_files_are_named(tmp_path, kw, match):
    assert_refused(NAME, tmp_path, kw, match)


# The CUDA backend's code on the CPU (Triton's interpreter, prefill and the host-free decode step against the
# reference, the paths it must take): tests/ops/test_arch_forward_interpreted.py, once it lists this fixture.
