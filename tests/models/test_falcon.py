"""falcon (Falcon-7B / 40B / 180B, Falcon2-11B): each rule shown to be needed on the fixtures (tests/data/arch,
tools/arch_fixture_configs_b.py: tiny random FalconForCausalLM models converted by llama.cpp's converter; the
logits, greedy and cache-in-pieces checks against transformers are in test_arch_vs_transformers.py), the batch
engine, the CPU's default (int8/int4) path, and bad files named.

falcon: the 7B's form (multi-query, one LayerNorm feeding attention and MLP in parallel). falcon-40b: the new
decoder architecture (2 kv groups of 2 query heads, ln_attn -> attn_norm_2 for the attention, ln_mlp -> attn_norm
for the MLP). falcon-11b: the new decoder architecture with one LayerNorm (num_ln_in_parallel_attn 1)."""

from __future__ import annotations

import types
from dataclasses import replace

import gguf
import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.arch_checks import cpu_quant_kl
from models.test_arch_vs_transformers import DATA, TOL, engine, load, rel_err, rewrite
from models.test_more_archs import logits_err

NAMES = ["falcon", "falcon-40b", "falcon-11b"]


def test_layouts():
    """kv heads and which layers carry the attention's own norm, per fixture; the tied head."""
    for name, kv, norm2 in (("falcon", 1, False), ("falcon-40b", 2, True), ("falcon-11b", 2, False)):
        m = engine(name).model
        assert m.cfg.arch == "falcon" and m.cfg.n_kv_heads == kv and m.cfg.n_heads == 4
        assert all((b.attn_norm_2 is not None) == norm2 for b in m.blocks)
        assert all((b.attn_norm_2_b is not None) == norm2 for b in m.blocks)
        assert m.output is m.token_embd
        assert all(b.attn_qkv.shape == ((4 + 2 * kv) * 16, 64) for b in m.blocks)
        assert len(m.qweights()) == 1 + 4 * len(m.blocks)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("what", ["adjacent_pairs", "attn_norm_bias", "output_norm_bias", "gelu_tanh"])
def test_each_rule_is_needed(monkeypatch, name, what):
    """NEOX rope, the norms' biases and GELU's erf form: with any one changed the logits miss transformers' by
    far. GELU's tanh form misses by ~1e-4 (under the 1e-3 tolerance): it is held to 50x the erf form's error."""
    import minfer.models.falcon as fa

    eng = engine(name)
    m = eng.model
    base = logits_err(eng, name)
    assert base < TOL
    if what == "adjacent_pairs":
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, style="normal"))   # (this engine's own cfg)
    elif what == "attn_norm_bias":
        for b in m.blocks:
            b.attn_norm_b = torch.zeros_like(b.attn_norm_b)
    elif what == "output_norm_bias":
        m.output_norm_b = torch.zeros_like(m.output_norm_b)
    else:
        monkeypatch.setattr(fa, "F", types.SimpleNamespace(
            gelu=lambda x: torch.nn.functional.gelu(x, approximate="tanh")))
    err = logits_err(eng, name)
    assert err > 50 * base if what == "gelu_tanh" else err > 10 * TOL


@pytest.mark.parametrize("what", ["attention_from_attn_norm", "mlp_from_attn_norm_2", "attn_norm_2_bias"])
def test_40b_norms_each_needed(what):
    """Falcon-40B: the attention reads attn_norm_2 (ln_attn), the MLP attn_norm (ln_mlp), each with its bias."""
    eng = engine("falcon-40b")
    assert logits_err(eng, "falcon-40b") < TOL
    for b in eng.model.blocks:
        if what == "attention_from_attn_norm":
            b.attn_norm_2 = b.attn_norm_2_b = None
        elif what == "mlp_from_attn_norm_2":
            b.attn_norm, b.attn_norm_b = b.attn_norm_2, b.attn_norm_2_b
        else:
            b.attn_norm_2_b = None
    assert logits_err(eng, "falcon-40b") > 10 * TOL


def test_attn_norm_2_bias_is_optional(tmp_path):
    """llama.cpp loads attn_norm_2.bias as not required (the norm without a bias then): a file without it
    loads, that layer's norm unbiased."""
    p = rewrite(DATA / "falcon-40b.gguf", tmp_path / "x.gguf", drop_tensors=("blk.1.attn_norm_2.bias",))
    m = load(p)
    assert m.blocks[0].attn_norm_2_b is not None and m.blocks[1].attn_norm_2_b is None


@pytest.mark.parametrize("name", NAMES)
def test_batch_engine_greedy_matches_transformers(name):
    """Through the batch engine's paged cache next to a second sequence (test_arch_vs_transformers' check)."""
    from models import test_arch_vs_transformers as t

    t.test_batch_engine_greedy_matches_transformers(name)


def test_default_cpu_path_stays_close(tmp_path, monkeypatch):
    """MINFER_CPU_QUANT on (the CPU's default): the fused q/k/v matrix and the rest run packed, the mean
    next-token KL against transformers within the calibration's bound (runtime/cpu_calibration.py)."""
    from minfer.runtime.cpu_calibration import CPU_INT4_KL_MAX

    for name in NAMES:
        got, kl = cpu_quant_kl(name, tmp_path, monkeypatch)
        assert np.isfinite(got).all() and kl < CPU_INT4_KL_MAX, (name, kl)


A = "falcon"
BIAS = np.zeros(96, np.float32)


@pytest.mark.parametrize("name,kw,match", [
    ("falcon", dict(drop_tensors=("output_norm.bias",)), "output_norm.bias"),
    ("falcon", dict(drop_tensors=("blk.1.attn_norm.bias",)), "blk.1.attn_norm.bias"),
    ("falcon", dict(drop_tensors=("blk.1.attn_qkv.weight",)), "blk.1.attn_qkv.weight"),
    ("falcon", dict(drop_tensors=("blk.0.ffn_up.weight",)), "blk.0.ffn_up.weight"),
    ("falcon-40b", dict(drop_tensors=("blk.1.attn_norm_2.weight",)), None),   # llama.cpp: not required
    ("falcon", dict(add_tensors={"blk.0.attn_qkv.bias": BIAS}), "blk.0.attn_qkv.bias"),
    ("falcon", dict(add_tensors={"blk.0.ffn_norm.weight": np.ones(64, np.float32)}), "blk.0.ffn_norm.weight"),
    ("falcon", dict(add_tensors={"blk.0.attn_q.weight": np.ones((64, 64), np.float32)}), "blk.0.attn_q.weight"),
    ("falcon", dict(drop_keys=(f"{A}.attention.layer_norm_epsilon",)), f"{A}.attention.layer_norm_epsilon"),
    ("falcon", dict(drop_keys=(f"{A}.block_count",)), f"{A}.block_count"),
    ("falcon", dict(set_keys={f"{A}.attention.head_count_kv": (2, gguf.GGUFValueType.UINT32)}), "blk.0.attn_qkv.weight"),
    ("falcon", dict(set_keys={f"{A}.rope.dimension_count": (8, gguf.GGUFValueType.UINT32)}), "rope.dimension_count"),
])
def test_bad_files_are_named(tmp_path, name, kw, match):
    """A missing required tensor or key, a tensor of a Falcon variant llama.cpp's graph does not run (linear
    biases, a norm before the MLP, separate q/k/v), a kv head count the fused matrix does not have, partial
    rotary: one MinferError naming it. Without attn_norm_2 on one layer the layer reads attn_norm (loads)."""
    p = rewrite(DATA / f"{name}.gguf", tmp_path / "x.gguf", **kw)
    if match is None:
        m = load(p)
        assert m.blocks[1].attn_norm_2 is None and m.blocks[0].attn_norm_2 is not None
        return
    with pytest.raises(MinferError, match=match.replace(".", r"\.")):
        load(p)
