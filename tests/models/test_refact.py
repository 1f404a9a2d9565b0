"""Refact (minfer/models/refact.py, GGUF arch `refact`) on the CPU's float32 reference, against two references that
minfer made neither of: a torch forward of the HF checkpoint written from the architecture (tools/gen_refact_fixture.py
reference(): HF's ALiBi m_h (j + 1) from its _get_slopes, multi-query attention from attn.kv, the gate_up SwiGLU, a tied
lm head, and llama.cpp's RMSNorm where HF has LayerNormNoBias: see minfer/models/refact.py), and llama.cpp's own logits
(llama-cpp-python 0.3.36, an F32 copy of the file, F32 KV cache). transformers 5.25 has no Refact class (remote code
only), so this file runs: logits at every position against both, greedy continuation (llama.cpp's), the KV cache in
pieces; each rule of the graph needed (with one changed the logits miss both by more than 10x the tolerance); HF's
slopes equal to ggml's; the batch engine's refusal (no ALiBi in the paged cache); the loader's refusals.

Fixture: tests/data/arch/refact.{gguf,npz,json} (tools/gen_refact_fixture.py build + goldens): hidden 32, 4 heads of 8
over 1 kv head, FFN 256 (the converter's multiple of 256), 2 layers, vocab 320, tied lm head (no output.weight),
converted by llama.cpp's convert_hf_to_gguf.py (conversion/refact.py RefactModel)."""

from __future__ import annotations

import json
import math

import gguf
import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from minfer.ops.reference import alibi_slopes
from models.arch_checks import assert_refused
from models.test_arch_vs_transformers import DATA, TOL, engine, ref, rel_err, rewrite

NAME = "refact"
BASE_ERR = 3e-6      # the fixture's float32 misses: 9.1e-7 (reference), 1.2e-6 (llama.cpp); they agree to 7.7e-7


def miss(eng, key: str = "logits") -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r[key])


def test_layout_read_from_the_file():
    from minfer.models.refact import RefactModel

    eng = engine(NAME)
    m, c = eng.model, eng.model.cfg
    assert type(m) is RefactModel and c.arch == NAME and m.paged_kv is False
    assert (c.head_dim, c.n_heads, c.n_kv_heads, c.d_model, c.ffn, c.vocab, c.n_layers) == (8, 4, 1, 32, 256, 320, 2)
    assert c.rms_eps == pytest.approx(1e-5)
    assert c.tied_output and m.output is m.token_embd          # no output.weight: llama.cpp's fallback
    assert torch.equal(m.alibi.cpu(), alibi_slopes(4, 8.0))
    b = m.blocks[0]
    assert tuple(b.attn_q.shape) == (32, 32) and tuple(b.attn_k.shape) == (8, 32) and tuple(b.attn_v.shape) == (8, 32)
    assert tuple(b.ffn_gate.shape) == (256, 32) and tuple(b.ffn_down.shape) == (32, 256)


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


def hf_refact_slopes(n_head: int) -> list[float]:
    """HF modeling_gpt_refact _get_slopes, as written there (n = 2^floor(log2 H); m0 = 2^(-8/n) to the powers
    1..n; for the rest 2^(-4/n) to the odd powers 1, 3, 5, ...)."""
    n = 2 ** math.floor(math.log2(n_head))
    m = [(2.0 ** (-8.0 / n)) ** p for p in range(1, 1 + n)]
    if n < n_head:
        m += [(2.0 ** (-4.0 / n)) ** p for p in range(1, 1 + 2 * (n_head - n), 2)]
    return m


@pytest.mark.parametrize("n_head", [1, 2, 4, 6, 12, 32, 48, 64])
def test_hf_refact_slopes_are_ggmls(n_head):
    """HF's slopes are ggml's m0 / m1 rule with llama.cpp's fixed max_bias 8 (Refact-1_6B: 32 heads)."""
    assert torch.allclose(torch.tensor(hf_refact_slopes(n_head), dtype=torch.float32), alibi_slopes(n_head, 8.0),
                          rtol=1e-6, atol=0)


@pytest.mark.parametrize("what", ["no_alibi", "max_bias_4", "rope", "layer_norm"])
def test_each_rule_is_needed(monkeypatch, what):
    """ALiBi (the only position information), its max_bias 8 (the loader's constant), no rope, and RMSNorm (llama.cpp's
    rule, not HF's LayerNormNoBias): with any changed the logits miss both references by far."""
    from minfer import ops
    from minfer.ops import reference

    eng = engine(NAME)
    m, c = eng.model, eng.model.cfg
    assert miss(eng) < BASE_ERR
    if what == "no_alibi":
        m.alibi = None
    elif what == "max_bias_4":
        m.alibi = alibi_slopes(c.n_heads, 4.0)
    elif what == "rope":                 # llama's NORM rope on q and k as well
        def roped(h, blk, layer, cache, step, ctx):
            T = h.shape[0]
            q, k, v = (ops.linear(h, w, None, ctx) for w in (blk.attn_q, blk.attn_k, blk.attn_v))
            q = ops.rope(q.view(T, c.n_heads, c.head_dim), step.positions, c.rope)
            k = ops.rope(k.view(T, c.n_kv_heads, c.head_dim), step.positions, c.rope)
            cache.write(layer, k, v.view(T, c.n_kv_heads, c.head_dim), step)
            return cache.attend(layer, q, step, ctx, alibi=m.alibi).reshape(T, -1)
        monkeypatch.setattr(m, "attention_heads", roped)
    else:                                # HF's LayerNormNoBias: the mean removed first
        monkeypatch.setattr(reference, "rms_norm", lambda x, w, eps: reference.layer_norm(x, w, eps))
    assert miss(eng) > 10 * TOL and miss(eng, "lc_logits") > 10 * TOL
    if what == "layer_norm":             # as far as the generator measured HF's own (LayerNorm) forward to be
        hf = json.loads((DATA / f"{NAME}.json").read_text())["hf_layernorm_rel_err"]
        assert miss(eng) == pytest.approx(hf, abs=1e-3)


def test_untied_output_is_read(tmp_path):
    """An output.weight in the file is the lm head (llama.cpp's loader takes it before the fallback)."""
    from minfer.runtime.engine import Engine

    from models.test_arch_vs_transformers import reference_switches

    rd = gguf.GGUFReader(str(DATA / f"{NAME}.gguf"))
    emb = next(t for t in rd.tensors if t.name == "token_embd.weight")
    out = -2.0 * np.asarray(emb.data, dtype=np.float32).reshape(320, 32)
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "u.gguf", add_tensors={"output.weight": out})
    eng = Engine.load(p, ctx=64, progress=False, switches=reference_switches())
    assert not eng.model.cfg.tied_output
    assert miss(eng) > 10 * TOL
    assert rel_err(eng.logits(ref(NAME)["ids"].tolist()).numpy(), -2.0 * ref(NAME)["logits"]) < BASE_ERR


def test_batch_engine_is_refused_by_name():
    """The paged cache has no ALiBi (runtime/paged_kv.py attend takes no slopes): paged_kv False, as bloom / mpt."""
    from minfer.runtime.batch_engine import BatchEngine

    with pytest.raises(MinferError, match=NAME):
        BatchEngine.from_engine(engine(NAME))


@pytest.mark.parametrize("kw,match", [
    # the graph ignores these (build_attn / build_ffn get NULL biases; no rope, no position table)
    (dict(add_tensors={"blk.0.attn_output.bias": np.zeros(32, np.float32)}), "blk.0.attn_output.bias"),
    (dict(add_tensors={"blk.1.ffn_down.bias": np.zeros(32, np.float32)}), "blk.1.ffn_down.bias"),
    (dict(add_tensors={"blk.0.ffn_gate.bias": np.zeros(256, np.float32)}), "blk.0.ffn_gate.bias"),
    (dict(add_tensors={"rope_freqs.weight": np.ones(4, np.float32)}), "rope_freqs.weight"),
    (dict(add_tensors={"position_embd.weight": np.ones((256, 32), np.float32)}), "position_embd.weight"),
    # never written by the converter (build_qkv would apply them): refused rather than run
    (dict(add_tensors={"blk.0.attn_qkv.weight": np.zeros((48, 32), np.float32)}), "blk.0.attn_qkv.weight"),
    (dict(add_tensors={"blk.1.attn_k.bias": np.zeros(8, np.float32)}), "blk.1.attn_k.bias"),
    (dict(set_keys={f"{NAME}.expert_count": (4, gguf.GGUFValueType.UINT32)}), f"{NAME}.expert_count"),
    # missing pieces named
    (dict(drop_tensors=("blk.0.attn_v.weight",)), "blk.0.attn_v.weight"),
    (dict(drop_tensors=("blk.1.ffn_norm.weight",)), "blk.1.ffn_norm.weight"),
    (dict(drop_keys=(f"{NAME}.attention.layer_norm_rms_epsilon",)), f"{NAME}.attention.layer_norm_rms_epsilon"),
])
def test_bad_files_are_named(tmp_path, kw, match):
    assert_refused(NAME, tmp_path, kw, match)


# The CUDA backend's code on the CPU (Triton's interpreter, prefill and the host-free decode step against the
# reference, the paths it must take): tests/ops/test_arch_forward_interpreted.py, which lists this fixture.
