"""The MLA latent decode attention (minfer/ops/cuda/attention_mla.py) in Triton's interpreter, on CPU
tensors, against softmax(scale q K^T) V written out here in float64: K rows of R + Dr dims (one KV
head), V = K[:, :R] (a view, as deepseek2's cache holds it), H query heads of R + Dr dims.
Head counts 16 (V2-Lite) and 128 (V3) at the real widths 512 + 64, key counts 1, 37, 300, 1000, one
split (the direct store) and several (the merge launch), the host-free key count of a CUDA-graph
step over a cache whose later rows hold garbage; the dispatch of ops/cuda/attention.py (counted
attention.mla.decode.triton, no fallback; refusals counted and served by the torch path); and the
deepseek2 fixtures' decode step through the CUDA backend's code with this kernel.
float32 tensors (the interpreter's bf16 dot is not the GPU's; tests/gpu/test_attention_mla_gpu.py
checks bf16 on the device)."""

from __future__ import annotations

import importlib
import math
import os
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
sys.path.insert(0, os.path.dirname(__file__))

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")

R, DR = 512, 64
DATA = Path(__file__).resolve().parents[1] / "data" / "arch"


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    """attention_mla builds its kernels for the mode TRITON_INTERPRET says at the call."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def want(q, k, dv, n, scale):
    """softmax(scale q . K[:n]^T) K[:n, :dv] in float64 -> (1, H, dv)."""
    s = torch.einsum("hd,sd->hs", q[0].double(), k[:n, 0].double()) * scale
    return (torch.softmax(s, dim=-1) @ k[:n, 0, :dv].double())[None]


def case(h, n, rows=None, seed=0, r=R, dr=DR):
    g = torch.Generator().manual_seed(seed * 1000 + h + n)
    k = torch.randn(rows or n, 1, r + dr, generator=g)
    q = torch.randn(1, h, r + dr, generator=g)
    return q, k, 0.5 / math.sqrt(r + dr)


# (H, keys, splits): None = mla_decode's own choice (with the interpreter's 16-key tiles: one split up to 32
# keys, then cdiv(n, 32) up to 264 / head blocks)
CASES = [(16, 1, None), (16, 37, None), (16, 37, 1), (16, 300, None), (16, 300, 1), (16, 300, 7),
         (16, 1000, None), (16, 1000, 3), (128, 1, None), (128, 37, None), (128, 300, 2), (128, 1000, 5)]


@pytest.mark.parametrize("h,n,splits", CASES)
def test_mla_decode_matches_reference(h, n, splits):
    from minfer.ops.cuda.attention_mla import mla_decode

    q, k, scale = case(h, n)
    got = mla_decode(q, k, R, n - 1, scale, n_keys_add=1, n_split=splits)
    assert got.shape == (1, h, R) and got.dtype == q.dtype
    assert (got.double() - want(q, k, R, n, scale)).abs().max() < 1e-5


@pytest.mark.parametrize("n", [1, 20, 37, 100])
def test_mla_decode_device_key_count_ignores_later_rows(n):
    """A graph step: the count a (1,) tensor, the grid sized for the cache's 128 rows (8 splits of
    16 keys, most empty at short counts), rows past the count garbage."""
    from minfer.ops.cuda.attention_mla import mla_decode

    q, k, scale = case(16, n, rows=128, seed=1)
    k[n:] = 1e4
    got = mla_decode(q, k, R, torch.tensor([n - 1]), scale, n_keys_add=1, n_split=8)
    assert (got.double() - want(q, k, R, n, scale)).abs().max() < 1e-5


@pytest.mark.parametrize("r,dr,h", [(32, 8, 4), (48, 24, 5)])
def test_mla_decode_small_and_unpadded_widths(r, dr, h):
    """The deepseek2 fixtures' widths (kv_lora 32, rope 8, 4 heads) and widths that are no powers of
    two (masked tiles)."""
    from minfer.ops.cuda.attention_mla import mla_decode

    for n, splits in ((9, None), (70, 3)):
        q, k, scale = case(h, n, rows=80, r=r, dr=dr)
        got = mla_decode(q, k, r, n - 1, scale, n_keys_add=1, n_split=splits)
        assert (got.double() - want(q, k, r, n, scale)).abs().max() < 1e-5


def _attention():
    return importlib.import_module("minfer.ops.cuda.attention")   # (minfer.ops.cuda.attention is also a function)


@pytest.mark.parametrize("graph", [False, True])
def test_dispatch_counts_the_kernel(graph):
    from minfer.ops import paths

    q, k, scale = case(16, 50, rows=64, seed=2)
    v = k[..., :R]
    paths.reset()
    start = 49
    got = _attention().attention(q, k, v, torch.tensor([start]) if graph else start, scale=scale)
    assert (got.double() - want(q, k, R, 50, scale)).abs().max() < 1e-5
    snap = paths.snapshot()
    assert snap["counts"] == {"attention.mla.decode.triton": 1}
    assert not snap["fallbacks"] and not snap["switched_off"]


def test_dispatch_refusals_fall_back_counted():
    """What the kernel does not take reaches the torch path (attention.mla.torch) with a counted
    fallback: a window, a soft-cap, a V that is not K's first dims; switched off: counted so; T > 1:
    the torch path, no fallback."""
    from minfer.ops import paths
    from minfer.ops.context import Context

    A = _attention()
    q, k, scale = case(16, 40, seed=3)
    v = k[..., :R]
    for kw, v_in in (({"window": 8}, v), ({"softcap": 30.0}, v), ({}, v.clone())):
        paths.reset()
        A.attention(q, k, v_in, 39, scale=scale, **kw)
        snap = paths.snapshot()
        assert snap["counts"] == {"attention.mla.torch": 1}, kw
        assert len(snap["fallbacks"]) == 1 and next(iter(snap["fallbacks"])).startswith("attention.mla.decode.triton")
    paths.reset()
    got = A.attention(q, k, v, 39, Context().with_switches(decode_attention=False), scale=scale)
    assert (got.double() - want(q, k, R, 40, scale)).abs().max() < 1e-5
    assert paths.snapshot()["counts"] == {"attention.mla.torch": 1} and paths.snapshot()["switched_off"]
    paths.reset()
    qq = torch.randn(3, 16, R + DR)
    A.attention(qq, k, v, 37, scale=scale)
    snap = paths.snapshot()
    assert snap["counts"] == {"attention.mla.torch": 1} and not snap["fallbacks"]


@pytest.mark.parametrize("name", ["deepseek2", "deepseek3"])
def test_fixture_decode_step_through_the_kernel(monkeypatch, name):
    """The committed deepseek2 / deepseek3 fixtures (tests/data/arch): one host-free decode step
    (start a device tensor, as the decode graph's) through the CUDA backend's code over the
    reference's prefilled cache, against the reference forward; the attention by this kernel in
    every layer, no fallback of it."""
    from kernel_data import interpreted_modules, route_to_cuda

    from minfer.gguf_file import GGUFFile
    from minfer.models import Step, load_model
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.runtime.kv_cache import KVCache
    from minfer.switches import Switches

    mods = interpreted_modules(["minfer.ops.cuda.dequant", "minfer.ops.cuda.gemv", "minfer.ops.cuda.qmatmul",
                                "minfer.ops.cuda.norm_rope_act", "minfer.ops.cuda.embedding",
                                "minfer.ops.cuda.attention", "minfer.ops.cuda.moe", "minfer.ops.cuda"])
    C = next(mods)["cuda"]
    try:
        m = load_model(GGUFFile(DATA / f"{name}.gguf"), progress=False)
        toks = torch.arange(3, 13) * 7 % 300 + 3
        T = len(toks)
        ref_cache = KVCache.for_config(m.cfg, 64)
        m.forward(toks, Step.at(0, T, "cpu"), ref_cache)
        cache = KVCache.for_config(m.cfg, 64)
        cache.k.copy_(ref_cache.k)
        ref = m.forward(torch.tensor([7]), Step.at(T, 1, "cpu"), ref_cache)
        route_to_cuda(monkeypatch, C)
        paths.reset()
        ctx = Context(Switches(), C.Workspace.for_model(m))
        got = m.forward(torch.tensor([7]), Step(torch.tensor([T]), None, "all"), cache, ctx)
        assert float((got - ref).norm() / ref.norm()) < 1e-5
        snap = paths.snapshot()
        assert snap["counts"].get("attention.mla.decode.triton") == m.cfg.n_layers
        assert "attention.mla.torch" not in snap["counts"]
        assert not any(f.startswith("attention.") for f in snap["fallbacks"]), snap["fallbacks"]
    finally:
        next(mods, None)
