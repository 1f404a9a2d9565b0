"""gptneox (Pythia, GPT-NeoX-20B, RedPajama-INCITE, StableLM-alpha; GPTNeoXForCausalLM): each rule shown to be needed
on the fixtures (tests/data/arch/gptneox: parallel residual, rotary on 4 of 16 dims; gptneox-seq: sequential
residual, rotary on 8 of 16; tiny random models converted by llama.cpp's converter; the logits, greedy and
cache-in-pieces checks against transformers are in test_arch_vs_transformers.py), the batch engine, the CPU's
default (int8/int4) path, and bad files named."""

from __future__ import annotations

import types
from dataclasses import replace

import numpy as np
import pytest
import torch

from models.arch_checks import assert_refused, cpu_quant_kl, drop_bias_group
from models.test_arch_vs_transformers import TOL, engine
from models.test_more_archs import logits_err

A = "gptneox"


def test_layout():
    """MHA from the fused q/k/v matrix with its bias, partial rotary from rope.dimension_count, the residual form
    from use_parallel_residual, the untied head."""
    a, b = engine(A).model, engine("gptneox-seq").model
    for m, n_rot, par in ((a, 4, True), (b, 8, False)):
        c = m.cfg
        assert (c.n_heads, c.n_kv_heads, c.head_dim, c.ffn) == (4, 4, 16, 256)
        assert c.rope.n_rot == n_rot and c.rope.style == "neox" and m.parallel_residual is par
        assert m.output is not m.token_embd
        assert all(blk.attn_qkv.shape == (192, 64) and blk.attn_qkv_b.shape == (192,) for blk in m.blocks)
        assert len(m.qweights()) == 2 + 4 * len(m.blocks)


@pytest.mark.parametrize("name,what", [
    (A, "residual_form"), ("gptneox-seq", "residual_form"), (A, "full_rope"), ("gptneox-seq", "full_rope"),
    (A, "adjacent_pairs"), (A, "qkv_bias"), (A, "output_bias"), (A, "mlp_biases"), ("gptneox-seq", "norm_biases"),
    (A, "gelu_tanh")])
def test_each_rule_is_needed(monkeypatch, name, what):
    """The residual form each way, partial (not full) NEOX (not adjacent pairs) rope, each group of biases, the
    LayerNorms' biases and GELU's erf form (not tanh): with any one changed the logits miss transformers' by far;
    tanh's miss is under the 1e-3 tolerance, held to 5x the erf form's error instead."""
    import minfer.models.gptneox as gn

    eng = engine(name)
    m = eng.model
    base = logits_err(eng, name)
    assert base < TOL
    if what == "residual_form":
        m.parallel_residual = not m.parallel_residual
    elif what == "full_rope":
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, n_rot=m.cfg.head_dim))
    elif what == "adjacent_pairs":
        object.__setattr__(m.cfg, "rope", replace(m.cfg.rope, style="normal"))
    elif what == "gelu_tanh":
        monkeypatch.setattr(gn, "F", types.SimpleNamespace(
            gelu=lambda x: torch.nn.functional.gelu(x, approximate="tanh")))
    drop_bias_group(m, what)
    err = logits_err(eng, name)
    assert err > 5 * base if what == "gelu_tanh" else err > 10 * TOL, err


@pytest.mark.parametrize("name", [A, "gptneox-seq"])
def test_batch_engine_greedy_matches_transformers(name):
    """Through the batch engine's paged cache next to a second sequence (test_arch_vs_transformers' check)."""
    from models import test_arch_vs_transformers as t

    t.test_batch_engine_greedy_matches_transformers(name)


def test_default_cpu_path_stays_close(tmp_path, monkeypatch):
    """MINFER_CPU_QUANT on (the CPU's default): the mean next-token KL against transformers within the
    calibration's bound (runtime/cpu_calibration.py)."""
    from minfer.runtime.cpu_calibration import CPU_INT4_KL_MAX

    got, kl = cpu_quant_kl(A, tmp_path, monkeypatch)
    assert np.isfinite(got).all() and kl < CPU_INT4_KL_MAX, kl


@pytest.mark.parametrize("kw,match", [
    (dict(drop_tensors=("output.weight",)), "output.weight"),
    (dict(drop_tensors=("output_norm.bias",)), "output_norm.bias"),
    (dict(drop_tensors=("blk.1.attn_qkv.bias",)), "blk.1.attn_qkv.bias"),
    (dict(drop_tensors=("blk.0.attn_output.bias",)), "blk.0.attn_output.bias"),
    (dict(drop_tensors=("blk.1.ffn_norm.bias",)), "blk.1.ffn_norm.bias"),
    (dict(drop_tensors=("blk.0.ffn_up.bias",)), "blk.0.ffn_up.bias"),
    (dict(drop_tensors=("blk.0.attn_qkv.weight",)), "blk.0.attn_qkv.weight"),
    (dict(add_tensors={"blk.0.attn_q.weight": np.ones((64, 64), np.float32)}), "blk.0.attn_q.weight"),
    (dict(drop_keys=(f"{A}.use_parallel_residual",)), f"{A}.use_parallel_residual"),
    (dict(drop_keys=(f"{A}.attention.layer_norm_epsilon",)), f"{A}.attention.layer_norm_epsilon"),
])
def test_bad_files_are_named(tmp_path, kw, match):
    """A missing required tensor or key (the untied head, use_parallel_residual, ...), separate q/k/v (llama.cpp's
    loader takes the fused matrix only): one MinferError naming it."""
    assert_refused(A, tmp_path, kw, match)
