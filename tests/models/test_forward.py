"""The forward pass against an independent HF-style reference, and prefill vs cached decode."""

from __future__ import annotations

import pytest
import torch

from gguf import GGMLQuantizationType as T
from minfer.gguf_file import GGUFFile
from minfer.models import load_model
from minfer.runtime.engine import Engine
from models.tiny import TinySpec, hf_forward, hf_weights, write_tiny_model

TOKENS = [3, 17, 42, 5, 9, 33, 1, 28, 11, 49, 0, 7]


def tiny_engine(tmp_path, spec, ctx=None):
    path = write_tiny_model(tmp_path / f"{spec.arch}.gguf", spec)
    return Engine(load_model(GGUFFile(path), progress=False), None, ctx)


SPECS = [
    TinySpec(arch="llama"),
    TinySpec(arch="llama", tied=True, n_kv_heads=4, seed=1),
    TinySpec(arch="llama", n_kv_heads=1, rope_theta=500000.0, seed=2),
    TinySpec(arch="qwen2", seed=3),
    TinySpec(arch="qwen2", tied=True, n_heads=8, n_kv_heads=2, seed=4),
    TinySpec(arch="qwen3", seed=5),
    TinySpec(arch="qwen3", tied=True, n_heads=8, n_kv_heads=2, seed=6),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.arch}-kv{s.n_kv_heads}-tied{int(s.tied)}")
def test_forward_matches_hf_reference(tmp_path, spec):
    """GGUF (q/k permuted for llama as the converter does) + minfer's ggml-style RoPE must equal
    HF's formulation on the original weights."""
    w = hf_weights(spec)
    path = write_tiny_model(tmp_path / "m.gguf", spec, w)
    eng = Engine(load_model(GGUFFile(path), progress=False), None)
    got = eng.forward(TOKENS, 0).double()
    want = hf_forward(w, spec, TOKENS)
    assert got.shape == (len(TOKENS), spec.vocab)
    torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)


def test_wrong_rope_convention_would_be_caught(tmp_path):
    """The reference test above can fail: an unpermuted llama file gives different logits."""
    spec = TinySpec(arch="llama")
    w = hf_weights(spec)
    path = write_tiny_model(tmp_path / "m.gguf", TinySpec(arch="qwen2"), {**w, **{
        f"l{i}.{b}_bias": torch.zeros(n).numpy() for i in range(spec.n_layers)
        for b, n in (("q", 64), ("k", 32), ("v", 32))}})
    eng = Engine(load_model(GGUFFile(path), progress=False), None)
    got = eng.forward(TOKENS, 0).double()
    # same weights, zero biases, but NEOX rope on unpermuted q/k == HF: must match
    torch.testing.assert_close(got, hf_forward(w, spec, TOKENS), atol=2e-4, rtol=1e-4)
    # whereas reading the permuted llama file with NEOX would not
    path2 = write_tiny_model(tmp_path / "l.gguf", spec, w)
    m = load_model(GGUFFile(path2), progress=False)
    from dataclasses import replace
    m.cfg = replace(m.cfg, rope=replace(m.cfg.rope, style="neox"))
    bad = Engine(m, None).forward(TOKENS, 0).double()
    assert (bad - hf_forward(w, spec, TOKENS)).abs().max() > 1e-2


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("qtype", [T.F32, T.Q8_0])
def test_prefill_equals_token_by_token(tmp_path, arch, qtype):
    spec = TinySpec(arch=arch, qtype=qtype, seed=7)
    eng = tiny_engine(tmp_path, spec)
    full = eng.forward(TOKENS, 0)
    eng.reset()
    steps = torch.cat([eng.forward([t], i) for i, t in enumerate(TOKENS)])
    torch.testing.assert_close(steps, full, atol=1e-4, rtol=1e-4)
    # prefill in two pieces, the second continuing from the cache
    eng.reset()
    a = eng.forward(TOKENS[:5], 0)
    b = eng.forward(TOKENS[5:], 5)
    torch.testing.assert_close(torch.cat([a, b]), full, atol=1e-4, rtol=1e-4)


def test_forward_overwrites_after_start_pos(tmp_path):
    """forward(tokens, start_pos) replaces what the cache held from start_pos on."""
    eng = tiny_engine(tmp_path, TinySpec(seed=5))
    eng.forward(TOKENS, 0)
    other = eng.forward([8, 8, 8], 4)
    eng.reset()
    want = eng.forward(TOKENS[:4] + [8, 8, 8], 0)[4:]
    torch.testing.assert_close(other, want, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"])
def test_real_model_prefill_equals_cached_decode(name):
    eng = Engine.load(name, ctx=64, progress=False)
    toks = [785, 6722, 315, 9625, 374, 12095] if "qwen" in name else [504, 3575, 282, 4649, 314, 7042]
    full = eng.forward(toks, 0)
    eng.reset()
    steps = torch.cat([eng.forward([t], i) for i, t in enumerate(toks)])
    torch.testing.assert_close(steps, full, atol=2e-3, rtol=1e-3)
    assert torch.isfinite(full).all()
