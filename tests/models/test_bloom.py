"""bloom (BigScience BLOOM, BloomForCausalLM): each rule shown to be needed on the fixture (tests/data/arch/bloom: a
tiny random BloomForCausalLM of 6 heads converted by llama.cpp's converter; the logits, greedy and cache-in-pieces
checks against transformers are in test_arch_vs_transformers.py), ALiBi's slopes against ggml's formula and HF's
build_alibi_tensor, the batch engine's refusal, and bad files named."""

from __future__ import annotations

import json
import math
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from minfer.ops.reference import alibi_bias, alibi_slopes, attention
from models.arch_checks import assert_refused, drop_bias_group
from models.test_arch_vs_transformers import TOL, engine
from models.test_more_archs import logits_err

A = "bloom"


def ggml_slope(h: int, n_head: int, max_bias: float) -> float:
    """ggml-cpu ggml_compute_forward_soft_max's slope, written as its C code."""
    n_head_log2 = 1 << math.floor(math.log2(n_head))
    m0 = 2.0 ** (-max_bias / n_head_log2)
    m1 = 2.0 ** (-(max_bias / 2.0) / n_head_log2)
    return m0 ** (h + 1) if h < n_head_log2 else m1 ** (2 * (h - n_head_log2) + 1)


HF_SLOPES = json.loads((Path(__file__).resolve().parents[1] / "data" / "alibi_slopes_hf.json").read_text())


@pytest.mark.parametrize("n_head", [1, 4, 6, 12, 16, 32, 112])
def test_alibi_slopes_match_ggml_and_hf(n_head):
    """The slopes of ggml's rule, and HF bloom's build_alibi_tensor (max_bias 8), for powers of two and not (6, 12,
    112 (BLOOM-176B): the heads past n_head_log2 take the finer base's odd powers). HF's slopes come from
    tests/data/alibi_slopes_hf.json (tools/gen_alibi_goldens.py: CI has no transformers)."""
    got = alibi_slopes(n_head, 8.0)
    want = torch.tensor([ggml_slope(h, n_head, 8.0) for h in range(n_head)])
    assert torch.allclose(got, want, rtol=1e-6, atol=0)
    hf = torch.tensor(HF_SLOPES["bloom_max_bias_8"][str(n_head)])              # (H,): slope * position 1
    assert torch.allclose(got, hf, rtol=1e-6, atol=0)
    assert torch.allclose(alibi_slopes(n_head, 4.0), torch.tensor([ggml_slope(h, n_head, 4.0) for h in range(n_head)]))


def test_alibi_slopes_non_power_of_two_rule_is_needed():
    """6 heads: heads 4-5 take m1^1, m1^3 (m1 = 2^(-1)), not m0^5, m0^6 of the power-of-two rule."""
    s = alibi_slopes(6, 8.0)
    assert s[:4].tolist() == [0.25, 0.0625, 0.015625, 0.00390625]
    assert s[4:].tolist() == [0.5, 0.125]


def test_alibi_attention_decode_equals_prefill_and_bias():
    """The op: - m_h |p - j| added to the scaled scores; one decode row equals the prefill's last row; the bias is
    what a hand-written softmax with it gives."""
    torch.manual_seed(0)
    T, H, Dh = 7, 6, 16
    q, k, v = torch.randn(T, H, Dh), torch.randn(T, 3, Dh), torch.randn(T, 3, Dh)
    sl = alibi_slopes(H, 8.0)
    full = attention(q, k, v, 0, alibi=sl)
    last = attention(q[-1:], k, v, T - 1, alibi=sl)
    assert torch.allclose(full[-1:], last, atol=1e-6)
    b = alibi_bias(sl, torch.arange(T), T)
    assert b[1, 5, 2].item() == pytest.approx(-sl[1].item() * 3)
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    s = torch.einsum("thd,shd->hts", q, kk) / Dh ** 0.5 + b
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    want = torch.einsum("hts,shd->thd", torch.softmax(s, -1), vv)
    assert torch.allclose(full, want, atol=1e-5)
    assert not torch.allclose(full, attention(q, k, v, 0), atol=1e-3)


def test_layout():
    """MHA over 6 heads of 16, the fused q/k/v matrix with its bias, the embedding norm, the slopes, the tied head."""
    m = engine(A).model
    c = m.cfg
    assert (c.n_heads, c.n_kv_heads, c.head_dim, c.ffn) == (6, 6, 16, 384)
    assert m.output is m.token_embd and m.embd_norm.shape == (96,) and m.embd_norm_b.shape == (96,)
    assert torch.allclose(m.alibi.cpu(), alibi_slopes(6, 8.0))
    assert all(b.attn_qkv.shape == (288, 96) and b.attn_qkv_b.shape == (288,) for b in m.blocks)
    assert len(m.qweights()) == 1 + 4 * len(m.blocks)


@pytest.mark.parametrize("what", ["no_alibi", "power_of_two_slopes", "no_embd_norm", "qkv_bias", "output_bias",
                                  "mlp_biases", "norm_biases", "gelu_erf"])
def test_each_rule_is_needed(monkeypatch, what):
    """ALiBi, its slope rule for 6 heads, the embedding LayerNorm, each group of biases, the LayerNorms' biases and
    GELU's tanh form (not erf): with any one changed the logits miss transformers' by far; erf's miss is held to
    20x the tanh form's error."""
    import minfer.models.starcoder as sc

    eng = engine(A)
    m = eng.model
    base = logits_err(eng, A)
    assert base < TOL
    if what == "no_alibi":
        m.alibi = None
    elif what == "power_of_two_slopes":     # every head m0^(h + 1): the n_head_log2 rule dropped
        m.alibi = torch.tensor([(2.0 ** -2.0) ** (h + 1) for h in range(6)])
    elif what == "no_embd_norm":
        monkeypatch.setattr(m, "embd_norm", torch.ones_like(m.embd_norm))
        monkeypatch.setattr(m, "embd_norm_b", torch.zeros_like(m.embd_norm_b))
        import minfer.models.bloom as bl
        orig = bl.layer_norm
        monkeypatch.setattr(bl, "layer_norm", lambda x, w, b, eps, dt: x.to(dt) if w is m.embd_norm else
                            orig(x, w, b, eps, dt))
    elif what == "gelu_erf":
        monkeypatch.setattr(sc, "F", types.SimpleNamespace(gelu=lambda x, approximate: torch.nn.functional.gelu(x)))
    drop_bias_group(m, what)
    err = logits_err(eng, A)
    if what == "gelu_erf":
        assert err > 20 * base, (err, base)
    else:
        assert err > 10 * TOL, err


def test_batch_engine_is_refused_by_name():
    """The paged cache has no ALiBi: BatchEngine refuses bloom by name (minfer serve then serves -np 1)."""
    from minfer.runtime.batch_engine import BatchEngine

    assert engine(A).model.paged_kv is False
    with pytest.raises(MinferError, match="bloom"):
        BatchEngine.from_engine(engine(A))


@pytest.mark.parametrize("kw,match", [
    (dict(drop_tensors=("token_embd_norm.weight",)), "token_embd_norm.weight"),
    (dict(drop_tensors=("token_embd_norm.bias",)), "token_embd_norm.bias"),
    (dict(drop_tensors=("output_norm.bias",)), "output_norm.bias"),
    (dict(drop_tensors=("blk.1.attn_qkv.bias",)), "blk.1.attn_qkv.bias"),
    (dict(drop_tensors=("blk.0.attn_output.bias",)), "blk.0.attn_output.bias"),
    (dict(drop_tensors=("blk.1.ffn_norm.bias",)), "blk.1.ffn_norm.bias"),
    (dict(drop_tensors=("blk.0.ffn_down.bias",)), "blk.0.ffn_down.bias"),
    (dict(drop_tensors=("blk.0.attn_qkv.weight",)), "blk.0.attn_qkv.weight"),
    (dict(add_tensors={"blk.0.attn_q.weight": np.ones((96, 96), np.float32)}), "blk.0.attn_q.weight"),
    (dict(drop_keys=(f"{A}.attention.layer_norm_epsilon",)), f"{A}.attention.layer_norm_epsilon"),
])
def test_bad_files_are_named(tmp_path, kw, match):
    """A missing required tensor or key, separate q/k/v (llama.cpp's loader takes the fused matrix only): one
    MinferError naming it."""
    assert_refused(A, tmp_path, kw, match)
