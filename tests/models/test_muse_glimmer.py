"""Muse Glimmer's language model (minfer/models/muse_glimmer.py) against transformers, on the CPU's float32
reference: the layout read from the file, each rule of the graph needed (with one changed or dropped the logits
miss by more than 10x the tolerance), what the model does not support refused by name. The logits, greedy
continuation and the cache in pieces are test_arch_vs_transformers' (name "muse-glimmer"). Fixture:
tests/data/arch/muse-glimmer.gguf (tools/gen_arch_fixtures.py: transformers' MuseGlimmerForConditionalGeneration,
5 layers, window 8, qk_scale_factor 2.5, output_multiplier 0.6, softcap 4, converted by llama.cpp's
convert_hf_to_gguf.py, text only)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minfer import ops
from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

NAME = "muse-glimmer"
A = NAME


def miss(eng) -> float:
    r = ref(NAME)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def test_layout_read_from_the_file():
    """HF's layer_types (full attention on every 4th layer counted back from the last: 0 and 4) as the
    converter's per-layer flags, rope on the window layers only, the one rope base, the q/k norm weights the
    converter synthesized (qk_scale_factor on q, ones on k), the logit scale and the softcap."""
    eng = engine(NAME)
    m = eng.model
    assert m.is_local == (False, True, True, True, False)
    assert m.use_rope == m.is_local
    assert m.window == 8
    assert m.rope_local.theta == 10000.0 and m.rope_local.style == "normal" and m.rope_local.freq_scale == 1.0
    assert m.post_eps == 1e-8
    assert m.logit_scale == pytest.approx(0.6) and m.final_softcap == 4.0
    for b in m.blocks:
        assert torch.allclose(b.attn_q_norm, torch.full_like(b.attn_q_norm, 2.5))
        assert torch.equal(b.attn_k_norm, torch.ones_like(b.attn_k_norm))
    assert m.output is not m.token_embd
    assert miss(eng) < TOL


def _skip_norms(monkeypatch, weights):
    """ops.rms_norm returns its input unchanged when called with one of `weights` (by identity)."""
    real = ops.rms_norm
    ids = {id(w) for w in weights}
    monkeypatch.setattr(ops, "rms_norm", lambda x, w, eps: x if id(w) in ids else real(x, w, eps))


@pytest.mark.parametrize("what", ["no_embd_norm", "no_post_attn_norm", "no_post_ffn_norm", "no_qk_norm",
                                  "no_qk_scale", "no_gate", "rope_everywhere", "no_window", "no_logit_scale",
                                  "no_softcap"])
def test_each_rule_is_needed(monkeypatch, what):
    """The weight-less embedding norm, both post-norms, the per-head q/k norms, q's qk_scale_factor (in
    attn_q_norm), the sigmoid gate, NoPE on the global layers, the window on the local ones, the logit scale,
    the softcap."""
    eng = engine(NAME)
    m = eng.model
    if what == "no_embd_norm":
        _skip_norms(monkeypatch, [m.embd_norm])
    elif what == "no_post_attn_norm":
        _skip_norms(monkeypatch, m.attn_post_norm)
    elif what == "no_post_ffn_norm":
        _skip_norms(monkeypatch, m.ffn_post_norm)
    elif what == "no_qk_norm":
        _skip_norms(monkeypatch, [w for b in m.blocks for w in (b.attn_q_norm, b.attn_k_norm)])
    elif what == "no_qk_scale":
        for b in m.blocks:
            b.attn_q_norm = torch.ones_like(b.attn_q_norm)
    elif what == "no_gate":
        monkeypatch.setattr(m, "gated", lambda o, gate: o.float())
    elif what == "rope_everywhere":
        m.use_rope = (True,) * len(m.blocks)
    elif what == "no_window":
        m.window = 10 ** 6
    elif what == "no_logit_scale":
        m.logit_scale = 1.0
    else:
        m.final_softcap = 0.0
    err = miss(eng)
    assert err > 10 * TOL, (what, err)


def _load(tmp_path, **kw):
    return load(rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", **kw))


def test_default_pattern_without_the_key(tmp_path):
    """Without attention.sliding_window_pattern llama.cpp's load_swa_pattern(ml, 4) applies: layers 0-2 local,
    3 global, 4 local (not HF's layout, so the logits move away)."""
    from minfer.runtime.engine import Engine

    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_keys=(f"{A}.attention.sliding_window_pattern",))
    eng = Engine.load(p, ctx=64, progress=False, switches=engine(NAME).switches)
    assert eng.model.is_local == (True, True, True, False, True)
    assert miss(eng) > 10 * TOL


def test_swa_rope_base_from_its_key(tmp_path):
    """rope.freq_base_swa, when the file has it, is the window layers' base (the fixture has none: the global
    base, as llama.cpp's load_arch_hparams defaults it)."""
    import gguf

    from minfer.runtime.engine import Engine

    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf",
                set_keys={f"{A}.rope.freq_base_swa": (500.0, gguf.GGUFValueType.FLOAT32)})
    eng = Engine.load(p, ctx=64, progress=False, switches=engine(NAME).switches)
    assert eng.model.rope_local.theta == 500.0 and eng.model.cfg.rope.theta == 10000.0
    assert miss(eng) > 10 * TOL


def test_qkv_biases_taken_when_present(tmp_path):
    """create_tensor_qkv takes q/k/v biases optionally: zero ones change nothing, loaded on every layer."""
    n = 5
    adds = {f"blk.{i}.attn_{x}.bias": np.zeros(64 if x == "q" else 32, dtype=np.float32)
            for i in range(n) for x in "qkv"}
    from minfer.runtime.engine import Engine

    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", add_tensors=adds)
    eng = Engine.load(p, ctx=64, progress=False, switches=engine(NAME).switches)
    assert all(b.attn_q_bias is not None and b.attn_v_bias.shape == (32,) for b in eng.model.blocks)
    assert miss(eng) < TOL


def _refused(tmp_path, match, **kw):
    with pytest.raises(MinferError, match=match):
        _load(tmp_path, **kw)


@pytest.mark.parametrize("key", [f"{A}.logit_scale", f"{A}.attention.sliding_window",
                                 f"{A}.attention.layer_norm_rms_epsilon"])
def test_missing_key_is_named(tmp_path, key):
    _refused(tmp_path, key.replace(".", r"\."), drop_keys=(key,))


@pytest.mark.parametrize("tensor", ["blk.0.attn_gate.weight", "blk.1.post_attention_norm.weight",
                                    "blk.2.post_ffw_norm.weight", "blk.0.attn_q_norm.weight",
                                    "blk.3.attn_k_norm.weight", "output.weight"])
def test_missing_tensor_is_named(tmp_path, tensor):
    _refused(tmp_path, tensor.replace(".", r"\."), drop_tensors=(tensor,))


def test_refusals_by_name(tmp_path):
    """A window of 0, rope factors, a linear rope scaling (llama.cpp's window layers rotate at scale 1), a fused
    attn_qkv, an o-projection bias."""
    import gguf

    _refused(tmp_path, r"attention\.sliding_window' is 0",
             set_keys={f"{A}.attention.sliding_window": (0, gguf.GGUFValueType.UINT32)})
    _refused(tmp_path, r"rope_freqs\.weight", add_tensors={"rope_freqs.weight": np.ones(8)})
    _refused(tmp_path, r"rope\.scaling\.type 'linear'",
             set_keys={f"{A}.rope.scaling.type": ("linear", gguf.GGUFValueType.STRING),
                       f"{A}.rope.scaling.factor": (2.0, gguf.GGUFValueType.FLOAT32)})
    _refused(tmp_path, r"blk\.0\.attn_qkv\.weight", add_tensors={"blk.0.attn_qkv.weight": np.zeros((128, 64))})
    _refused(tmp_path, r"blk\.2\.attn_output\.bias", add_tensors={"blk.2.attn_output.bias": np.zeros(64)})
