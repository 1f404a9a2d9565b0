"""mpt (MosaicML MPT, MptForCausalLM): each rule shown to be needed on the fixture (tests/data/arch/mpt: a tiny random
MptForCausalLM of 6 heads with clip_qkv 0.3 converted by llama.cpp's converter; the logits, greedy and cache-in-pieces
checks against transformers are in test_arch_vs_transformers.py), HF's MPT slopes equal to ggml's, the batch
engine's refusal, and bad files named."""

from __future__ import annotations

import json
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFValueType

from minfer.errors import MinferError
from minfer.ops.reference import alibi_slopes
from models.arch_checks import assert_refused
from models.test_arch_vs_transformers import DATA, TOL, engine, load, rewrite
from models.test_more_archs import logits_err

A = "mpt"


@pytest.mark.parametrize("n_head", [1, 4, 6, 12, 32, 48])
def test_hf_mpt_slopes_are_ggmls(n_head):
    """HF build_mpt_alibi_tensor (2^ceil(log2 H) bases, odd then even ones) gives ggml's m0 / m1 slopes (HF's from
    tests/data/alibi_slopes_hf.json, tools/gen_alibi_goldens.py: CI has no transformers)."""
    hf = json.loads((Path(__file__).resolve().parents[1] / "data" / "alibi_slopes_hf.json").read_text())
    assert torch.allclose(torch.tensor(hf["mpt_max_bias_8"][str(n_head)]), alibi_slopes(n_head, 8.0), rtol=1e-6, atol=0)


def test_layout():
    """MHA over 6 heads, no biases (the norms' biases zeros), the clamp and the slopes from the file."""
    m = engine(A).model
    c = m.cfg
    assert (c.n_heads, c.n_kv_heads, c.head_dim, c.ffn) == (6, 6, 16, 384)
    assert m.clamp_kqv == pytest.approx(0.3) and torch.allclose(m.alibi.cpu(), alibi_slopes(6, 8.0))
    assert all(b.attn_qkv_b is None and b.ffn_up_b is None and not b.attn_norm_b.any() for b in m.blocks)
    assert m.output is m.token_embd and m.paged_kv is False


@pytest.mark.parametrize("what", ["no_alibi", "no_clamp", "gelu_tanh"])
def test_each_rule_is_needed(monkeypatch, what):
    """ALiBi and the q/k/v clamp: without either the logits miss transformers' by far; GELU's tanh form (llama.cpp's)
    misses HF's erf by more than 10x this error, under the tolerance."""
    import minfer.models.mpt as mp

    eng = engine(A)
    m = eng.model
    base = logits_err(eng, A)
    assert base < TOL
    if what == "no_alibi":
        m.alibi = None
    elif what == "no_clamp":
        m.clamp_kqv = 0.0
    else:
        monkeypatch.setattr(mp, "F", types.SimpleNamespace(
            gelu=lambda x: torch.nn.functional.gelu(x, approximate="tanh")))
    err = logits_err(eng, A)
    if what == "gelu_tanh":
        assert 10 * base < err < TOL, (err, base)
    else:
        assert err > 10 * TOL, err


def test_batch_engine_is_refused_by_name():
    from minfer.runtime.batch_engine import BatchEngine

    with pytest.raises(MinferError, match="mpt"):
        BatchEngine.from_engine(engine(A))


@pytest.mark.parametrize("kw,match", [
    (dict(drop_keys=(f"{A}.attention.max_alibi_bias",)), f"{A}.attention.max_alibi_bias"),
    (dict(set_keys={f"{A}.attention.max_alibi_bias": (0.0, GGUFValueType.FLOAT32)}), f"{A}.attention.max_alibi_bias"),
    (dict(add_tensors={"position_embd.weight": np.ones((128, 96), np.float32)}), "position_embd.weight"),
    (dict(add_tensors={"blk.0.attn_q_norm.weight": np.ones((96,), np.float32)}), "blk.0.attn_q_norm.weight"),
    (dict(add_tensors={"blk.0.attn_q.weight": np.ones((96, 96), np.float32)}), "blk.0.attn_q.weight"),
    (dict(drop_tensors=("blk.1.attn_qkv.weight",)), "blk.1.attn_qkv.weight"),
    (dict(drop_tensors=("blk.0.ffn_norm.weight",)), "blk.0.ffn_norm.weight"),
    (dict(drop_keys=(f"{A}.attention.layer_norm_epsilon",)), f"{A}.attention.layer_norm_epsilon"),
])
def test_bad_files_are_named(tmp_path, kw, match):
    """A file without ALiBi, features not implemented, a missing tensor or key: one MinferError naming it."""
    assert_refused(A, tmp_path, kw, match)


def test_without_clamp_key_no_clamp(tmp_path):
    """No attention.clamp_kqv: no clamp (llama.cpp's f_clamp_kqv 0)."""
    p = rewrite(DATA / f"{A}.gguf", tmp_path / "x.gguf", drop_keys=(f"{A}.attention.clamp_kqv",))
    assert load(p).clamp_kqv == 0.0
