"""Attention sinks (gpt-oss: one extra softmax logit per query head, with no value) in the CUDA
backend's attention, run on the CPU by Triton's interpreter (TRITON_INTERPRET=1): the decode
kernel's SINK variant in each of its ways out (one split writing the output, the combine launch,
the preloading variants, V slices, a window that leaves split 0 no key) and the T > 1 torch path
(attention.sinks.torch), against a float64 formula written here; then the gpt-oss fixture's
prefill and host-free decode step through the CUDA backend's code against the CPU reference."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import interpreted_modules, route_to_cuda  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")


def rel(a, b):
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


def formula(q, k, v, start, window, sinks):
    """float64, query by query and head by head: softmax over [scores, sink], the sink's column
    dropped (HF gpt_oss eager_attention_forward; llama.cpp ggml_soft_max_add_sinks)."""
    T, H, D = q.shape
    g = H // k.shape[1]
    out = torch.empty(T, H, v.shape[-1], dtype=torch.float64)
    for t in range(T):
        p = start + t
        lo = max(0, p - window + 1) if window > 0 else 0
        for h in range(H):
            s = (k[lo:p + 1, h // g].double() @ q[t, h].double()) / D ** 0.5
            z = torch.cat((s, sinks[h].double().reshape(1)))
            out[t, h] = torch.softmax(z, 0)[:-1] @ v[lo:p + 1, h // g].double()
    return out


def data(seed, S=60, H=4, Hkv=2, D=32, T=1):
    g = torch.Generator().manual_seed(seed)
    k, v = torch.randn(S, Hkv, D, generator=g), torch.randn(S, Hkv, D, generator=g)
    q = 2 * torch.randn(T, H, D, generator=g)
    sinks = torch.tensor([2.5, -1.0, 0.5, 4.0])[:H]
    return q, k, v, sinks


@pytest.fixture(scope="module")
def A():
    for mods in interpreted_modules(["minfer.ops.cuda.attention"]):
        yield mods["attention"]


@pytest.mark.parametrize("n_keys,window,n_split,kw", [
    (50, 0, 1, {}), (50, 0, 3, {}), (50, 9, 3, {}),          # window 9 of 50 over 3 splits: split 0 has no key
    (7, 0, 1, {}), (50, 0, 3, {"pipe": True, "pre": True}), (50, 9, 1, {"kvpre": True, "pre": True}),
    (40, 0, 2, {"direct": False}), (40, 0, 3, {"split_vs": 2})])
def test_decode_kernel_sinks(A, n_keys, window, n_split, kw):
    q, k, v, sinks = data(n_keys + n_split)
    want = formula(q, k, v, n_keys - 1, window, sinks)
    for nk in (n_keys, torch.tensor([n_keys], dtype=torch.int32)):     # host length, and graph-style
        out = A.decode_attention(q, k, v, nk, window=window, n_split=n_split, sinks=sinks, **kw)
        assert rel(out, want) < 1e-5, (nk, kw)
    off = A.decode_attention(q, k, v, n_keys, window=window, n_split=n_split, **kw)   # the sinks matter here
    assert rel(off, want) > 1e-2


def test_decode_kernel_sinks_v_slices(A):
    """Head dim 64 with one split: the output's dims in two V slices (decode_attn_vsplit)."""
    q, k, v, sinks = data(3, D=64)
    out = A.decode_attention(q, k, v, 30, n_split=1, vsplit=2, sinks=sinks)
    assert rel(out, formula(q, k, v, 29, 0, sinks)) < 1e-5


def test_cuda_attention_sinks_paths(A):
    from minfer.ops import paths

    paths.reset()
    for start, T, window in ((0, 20, 0), (25, 9, 6), (40, 1, 6), (40, 1, 0)):
        q, k, v, sinks = data(T + 100, T=T)
        out = A.attention(q, k, v, start, window=window, sinks=sinks)
        assert rel(out, formula(q, k, v, start, window, sinks)) < 1e-5, (start, T, window)
    counts = paths.snapshot()["counts"]
    assert counts.get("attention.sinks.torch") == 2
    assert counts.get("attention.window.decode") == 1 and counts.get("attention.decode.triton") == 1
    assert not any(p.startswith(("attention.prefill", "attention.window.masked", "attention.softcap")) for p in counts)


def test_gpt_oss_through_cuda_backend_interpreted(monkeypatch):
    """The gpt-oss fixture (tests/data/arch/gpt-oss.gguf) through the CUDA backend's code: the
    prefill (T > 1 sinks path) and the host-free decode step (the SINK kernel, window and full
    layers) against the CPU reference's logits. The MoE runs as ops.moe_ffn's CUDA side too (its
    options are tested on their own in tests/ops/test_gpt_oss_interpreted.py)."""
    from pathlib import Path

    from minfer.gguf_file import GGUFFile
    from minfer.models import Step, load_model
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.runtime.kv_cache import KVCache
    from minfer.switches import Switches

    gguf = Path(__file__).resolve().parents[1] / "data" / "arch" / "gpt-oss.gguf"
    m = load_model(GGUFFile(gguf), progress=False)
    toks = torch.tensor([5, 77, 12, 140, 9, 33, 201, 18, 64, 3, 250, 41, 7, 99, 120, 8, 66, 31, 17, 200])
    ref_cache = KVCache.for_config(m.cfg, 32)
    ref = m.forward(toks, Step.at(0, 20, "cpu"), ref_cache)
    ref_dec = m.forward(torch.tensor([42]), Step.at(20, 1, "cpu"), ref_cache)
    for mods in interpreted_modules(["minfer.ops.cuda.dequant", "minfer.ops.cuda.gemv", "minfer.ops.cuda.qmatmul",
                                     "minfer.ops.cuda.norm_rope_act", "minfer.ops.cuda.embedding",
                                     "minfer.ops.cuda.attention", "minfer.ops.cuda"]):
        C = mods["cuda"]
        route_to_cuda(monkeypatch, C)
        ctx = Context(Switches(), C.Workspace.for_model(m))
        cache = KVCache.for_config(m.cfg, 32)
        paths.reset()
        out = m.forward(toks, Step.at(0, 20, "cpu"), cache, ctx)
        dec = m.forward(torch.tensor([42]), Step(torch.tensor([20]), None, "all"), cache, ctx)
        counts = paths.snapshot()["counts"]
        monkeypatch.undo()
    assert rel(out, ref) < 1e-5 and rel(dec, ref_dec) < 1e-5
    L = m.cfg.n_layers
    assert counts.get("attention.sinks.torch") == L
    assert counts.get("attention.window.decode") == L // 2 and counts.get("attention.decode.triton") == L // 2
