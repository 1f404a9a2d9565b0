"""starcoder (StarCoder 1 / StarCoderBase / SantaCoder, GPTBigCode): each rule shown to be needed on the fixture
(tests/data/arch/starcoder: a tiny random GPTBigCodeForCausalLM converted by llama.cpp's converter; the logits,
greedy and cache-in-pieces checks against transformers are in test_arch_vs_transformers.py), the position table's
limit, the batch engine, the CPU's default (int8/int4) path, and bad files named."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.arch_checks import assert_refused, cpu_quant_kl, drop_bias_group
from models.test_arch_vs_transformers import TOL, engine
from models.test_more_archs import logits_err

A = "starcoder"


def test_layout():
    """Multi-query (one kv head), the fused q/k/v matrix with its bias, the position table of context_length
    rows, the tied head."""
    m = engine(A).model
    c = m.cfg
    assert (c.n_heads, c.n_kv_heads, c.head_dim, c.ffn, c.context_length) == (4, 1, 16, 256, 128)
    assert m.position_embd.shape == (128, 64) and m.output is m.token_embd
    assert all(b.attn_qkv.shape == (96, 64) and b.attn_qkv_b.shape == (96,) for b in m.blocks)
    assert len(m.qweights()) == 2 + 4 * len(m.blocks)


@pytest.mark.parametrize("what", ["no_positions", "qkv_bias", "output_bias", "mlp_biases", "norm_biases",
                                  "gelu_erf"])
def test_each_rule_is_needed(monkeypatch, what):
    """The learned positions, each group of biases, the LayerNorms' biases and GELU's tanh form (not erf): with any
    one changed the logits miss transformers' by far; erf's miss is under the 1e-3 tolerance, held to 50x the
    tanh form's error instead."""
    import minfer.models.starcoder as sc

    eng = engine(A)
    m = eng.model
    base = logits_err(eng, A)
    assert base < TOL
    drop_bias_group(m, what)
    if what == "no_positions":
        orig = sc.ops.embedding
        monkeypatch.setattr(sc.ops, "embedding", lambda ids, w: orig(ids, w) * (0.0 if w is m.position_embd else 1.0))
    if what == "gelu_erf":
        monkeypatch.setattr(sc, "F", types.SimpleNamespace(gelu=lambda x, approximate: torch.nn.functional.gelu(x)))
    err = logits_err(eng, A)
    assert err > 50 * base if what == "gelu_erf" else err > 10 * TOL


def test_context_past_the_position_table_is_refused():
    """A --ctx past the learned position table (128 rows here) is refused by name (at the load's first forward);
    the table's own length runs."""
    with pytest.raises(MinferError, match=r"position_embd\.weight.*128"):
        engine(A, ctx=256).logits([5, 6, 7])
    assert np.isfinite(engine(A, ctx=128).logits([5, 6, 7]).numpy()).all()


def test_batch_engine_greedy_matches_transformers():
    """Through the batch engine's paged cache next to a second sequence (test_arch_vs_transformers' check)."""
    from models import test_arch_vs_transformers as t

    t.test_batch_engine_greedy_matches_transformers(A)


def test_default_cpu_path_stays_close(tmp_path, monkeypatch):
    """MINFER_CPU_QUANT on (the CPU's default): the mean next-token KL against transformers within the
    calibration's bound (runtime/cpu_calibration.py)."""
    from minfer.runtime.cpu_calibration import CPU_INT4_KL_MAX

    got, kl = cpu_quant_kl(A, tmp_path, monkeypatch)
    assert np.isfinite(got).all() and kl < CPU_INT4_KL_MAX, kl


@pytest.mark.parametrize("kw,match", [
    (dict(drop_tensors=("position_embd.weight",)), "position_embd.weight"),
    (dict(drop_tensors=("output_norm.bias",)), "output_norm.bias"),
    (dict(drop_tensors=("blk.1.attn_qkv.bias",)), "blk.1.attn_qkv.bias"),
    (dict(drop_tensors=("blk.0.attn_output.bias",)), "blk.0.attn_output.bias"),
    (dict(drop_tensors=("blk.1.ffn_norm.bias",)), "blk.1.ffn_norm.bias"),
    (dict(drop_tensors=("blk.0.ffn_down.bias",)), "blk.0.ffn_down.bias"),
    (dict(drop_tensors=("blk.0.attn_qkv.weight",)), "blk.0.attn_qkv.weight"),
    (dict(add_tensors={"blk.0.attn_q.weight": np.ones((64, 64), np.float32)}), "blk.0.attn_q.weight"),
    (dict(drop_keys=(f"{A}.attention.layer_norm_epsilon",)), f"{A}.attention.layer_norm_epsilon"),
    (dict(drop_keys=(f"{A}.context_length",)), f"{A}.context_length"),
])
def test_bad_files_are_named(tmp_path, kw, match):
    """A missing required tensor or key, separate q/k/v (llama.cpp's loader takes the fused matrix only): one
    MinferError naming it."""
    assert_refused(A, tmp_path, kw, match)
