"""Soft-capped attention scores (gemma2: s -> cap * tanh(s / cap) before the mask and softmax).

The torch reference against a float64 formula written here (one query head at a time), then the
CUDA backend's code on the CPU by Triton's interpreter (TRITON_INTERPRET=1): the decode kernel's
CAP variant and the T > 1 torch path (attention.softcap.torch), and the paged cache's torch
references. q is scaled up so that the cap changes the result (checked)."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import interpreted_modules, route_to_cuda  # noqa: E402

from minfer.ops import reference  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")
CAP = 3.0


def rel(a, b):
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


def formula(q, k, v, start, window, cap):
    """float64, query by query and head by head: HF gemma2 eager_attention_forward's order
    (scale, cap, mask, softmax), llama.cpp's mask (j <= p, and p - j < W with a window)."""
    T, H, D = q.shape
    g = H // k.shape[1]
    out = torch.empty(T, H, D, dtype=torch.float64)
    for t in range(T):
        p = start + t
        lo = max(0, p - window + 1) if window > 0 else 0
        for h in range(H):
            s = (k[lo:p + 1, h // g].double() @ q[t, h].double()) / D ** 0.5
            if cap:
                s = cap * torch.tanh(s / cap)
            out[t, h] = torch.softmax(s, 0) @ v[lo:p + 1, h // g].double()
    return out


def data(seed, S=60, H=4, Hkv=2, D=32, T=1):
    g = torch.Generator().manual_seed(seed)
    k, v = torch.randn(S, Hkv, D, generator=g), torch.randn(S, Hkv, D, generator=g)
    return 4 * torch.randn(T, H, D, generator=g), k, v


@pytest.mark.parametrize("start,T,window", [(0, 20, 0), (0, 20, 6), (25, 9, 0), (25, 9, 6), (40, 1, 0), (40, 1, 6)])
def test_reference_softcap_matches_formula(start, T, window):
    q, k, v = data(start + T, T=T)
    want = formula(q, k, v, start, window, CAP)
    assert rel(reference.attention(q, k, v, start, window, softcap=CAP), want) < 1e-6
    # the cap bites on these scores
    assert rel(reference.attention(q, k, v, start, window), want) > 1e-2


def test_paged_references_softcap():
    from minfer.runtime.paged_kv import paged_attention_ref, windowed_attention

    q, k, v = data(5, T=7)
    for window in (0, 5):
        assert rel(windowed_attention(q, k[:30], v[:30], 23, window, CAP), formula(q, k, v, 23, window, CAP)) < 1e-6
    # one decode row per sequence through a block table: blocks of 8, keys 0..n-1 of two rows
    bs, n = 8, (30, 15)
    kp, vp = k[:48].reshape(6, bs, 2, 32), v[:48].reshape(6, bs, 2, 32)
    tables = torch.tensor([[0, 1, 2, 3], [4, 5, 0, 0]], dtype=torch.int32)
    qd = q[:2]
    for window in (0, 5):
        out = paged_attention_ref(qd, kp, vp, tables, torch.tensor(n, dtype=torch.int32), window, CAP)
        kk = [k[:32], k[32:48]]
        vv = [v[:32], v[32:48]]
        for b in range(2):
            want = formula(qd[b:b + 1], kk[b], vv[b], n[b] - 1, window, CAP)
            assert rel(out[b:b + 1], want) < 1e-6


@pytest.fixture(scope="module")
def A():
    for mods in interpreted_modules(["minfer.ops.cuda.attention"]):
        yield mods["attention"]


@pytest.mark.parametrize("n_keys,window", [(50, 0), (50, 9), (7, 0)])
def test_decode_kernel_softcap_interpreted(A, n_keys, window):
    q, k, v = data(n_keys)
    want = formula(q, k, v, n_keys - 1, window, CAP)
    for nk in (n_keys, torch.tensor([n_keys], dtype=torch.int32)):     # host length, and graph-style
        out = A.decode_attention(q, k, v, nk, window=window, softcap=CAP, n_split=3)
        assert rel(out, want) < 1e-5
    # softcap off: the same kernel as before (no cap), which differs here
    off = A.decode_attention(q, k, v, n_keys, window=window, n_split=3)
    assert rel(off, formula(q, k, v, n_keys - 1, window, 0)) < 1e-5 and rel(off, want) > 1e-2


def test_cuda_attention_softcap_paths_interpreted(A):
    from minfer.ops import paths

    paths.reset()
    for start, T, window in ((0, 20, 0), (25, 9, 6), (40, 1, 6), (40, 1, 0)):
        q, k, v = data(T + 100, T=T)
        out = A.attention(q, k, v, start, window=window, softcap=CAP)
        assert rel(out, formula(q, k, v, start, window, CAP)) < 1e-5, (start, T, window)
    counts = paths.snapshot()["counts"]
    assert counts.get("attention.softcap.torch") == 2
    assert counts.get("attention.softcap.window.decode") == 1 and counts.get("attention.softcap.decode") == 1
    assert not any(p.startswith(("attention.prefill", "attention.window")) for p in counts), counts


def test_softcap_torch_path_chunks_rows(A, monkeypatch):
    """The T > 1 path splits the query rows to bound the written-out scores; the chunks join up."""
    q, k, v = data(9, T=30)
    monkeypatch.setattr(A, "SOFTCAP_SCORE_BYTES", 4 * 4 * 30 * 7)   # 7 rows at S = 30
    out = A.attention(q, k, v, 0, window=5, softcap=CAP)
    assert rel(out, formula(q, k, v, 0, 5, CAP)) < 1e-5


def test_gemma2_decode_step_through_cuda_backend_interpreted(monkeypatch):
    """The gemma2 fixture's host-free decode step (a CUDA graph's Step) through the CUDA
    backend's code in the interpreter, over the reference's prefilled cache, against the
    reference: the soft-capped decode kernel on local (window) and global layers."""
    from pathlib import Path

    from minfer.gguf_file import GGUFFile
    from minfer.models import Step, load_model
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.runtime.kv_cache import KVCache
    from minfer.switches import Switches


    mods = ["minfer.ops.cuda.dequant", "minfer.ops.cuda.gemv", "minfer.ops.cuda.qmatmul",
            "minfer.ops.cuda.norm_rope_act", "minfer.ops.cuda.embedding", "minfer.ops.cuda.attention",
            "minfer.ops.cuda"]
    gen = interpreted_modules(mods)
    C = next(gen)["cuda"]
    try:
        m = load_model(GGUFFile(Path(__file__).resolve().parents[1] / "data" / "arch" / "gemma2.gguf"),
                       progress=False)
        toks = torch.arange(3, 15) * 7 % 300 + 3                     # 12 tokens (> the window of 8)
        T = len(toks)
        cache = KVCache.for_config(m.cfg, 32)
        m.forward(toks, Step.at(0, T, "cpu"), cache)
        k0, v0 = cache.k.clone(), cache.v.clone()
        ref = m.forward(torch.tensor([7]), Step.at(T, 1, "cpu"), cache)
        cache.k.copy_(k0)
        cache.v.copy_(v0)
        route_to_cuda(monkeypatch, C)
        ctx = Context(Switches(), C.Workspace.for_model(m))
        paths.reset()
        out = m.forward(torch.tensor([7]), Step(torch.tensor([T]), None, "all"), cache, ctx)
        assert float((out - ref).norm() / ref.norm()) < 1e-5
        counts = paths.snapshot()["counts"]
        assert counts.get("attention.softcap.window.decode") == 2 and counts.get("attention.softcap.decode") == 2, counts
    finally:
        monkeypatch.undo()
        for _ in gen:
            pass
