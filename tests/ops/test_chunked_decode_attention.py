"""llama4's chunked attention in the contiguous cache's decode kernel (ops/cuda/attention.py
_decode_attn_kernel's CHUNK variant): the row at position p reads the keys from p // chunk * chunk to
p (llama.cpp llama-hparams.cpp is_masked_swa, LLAMA_SWA_TYPE_CHUNKED), the chunk's start computed in
the kernel from the key count (a device tensor under a CUDA graph), the splits dividing only those
keys. Run on the CPU by Triton's interpreter (TRITON_INTERPRET=1; 16-key tiles) against a float64
formula written here: rows at a chunk's first, middle and last key, chunks aligned and not aligned
to the tiles, GQA, one split and several, the preloading / pipelined variants; the chunk needed; the
tiles before the chunk never loaded; the torch paths (ops.attention's T > 1 path on CUDA, the
reference) with chunk=; then llama4's fixture (chunk 8) through the CUDA backend's host-free decode
steps across a chunk boundary against the reference forward."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import interpreted_loads, interpreted_modules, route_to_cuda  # noqa: E402

from minfer.ops import paths, reference  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")
DATA = Path(__file__).resolve().parents[1] / "data" / "arch"


def formula(q, k, v, p, chunk, window=0, softcap=0.0):
    """float64, head by head: the query q (H, D) at position p sees keys j with
    p // chunk * chunk <= j <= p (chunk 0: every j <= p) and, with a window, p - j < window -> (H, D)."""
    H, D = q.shape
    g = H // k.shape[1]
    lo = p // chunk * chunk if chunk else 0
    if window:
        lo = max(lo, p - window + 1)
    out = torch.empty(H, v.shape[-1], dtype=torch.float64)
    for h in range(H):
        s = (k[lo:p + 1, h // g].double() @ q[h].double()) / math.sqrt(D)
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        out[h] = torch.softmax(s, 0) @ v[lo:p + 1, h // g].double()
    return out


def data(seed, S=96, H=8, Hkv=2, D=32, T=1, amp=3.0):
    g = torch.Generator().manual_seed(seed)
    k, v = torch.randn(S, Hkv, D, generator=g), torch.randn(S, Hkv, D, generator=g)
    return amp * torch.randn(T, H, D, generator=g), k, v


@pytest.fixture(scope="module")
def A():
    for mods in interpreted_modules(["minfer.ops.cuda.attention"]):
        yield mods["attention"]


def rows(chunk, last=80):
    """Positions p (the key count p + 1) at a chunk's first key, one mid-chunk and its last key, in the
    first chunk and later ones."""
    ps = set()
    for c0 in range(0, last, chunk):
        ps.update(x for x in (c0, c0 + chunk // 2, c0 + chunk - 1) if x < last)
    return sorted(ps)


# chunks of 5 and 6 (not tile-aligned: a chunk starts mid-tile), 16 (a tile), 24 (one and a half
# tiles), 40 (2.5 tiles); G 4, 1 and 8
@pytest.mark.parametrize("H,Hkv", [(8, 2), (4, 4), (8, 1)], ids=["G4", "G1", "G8"])
@pytest.mark.parametrize("chunk", [5, 6, 16, 24, 40])
def test_chunk_kernel_matches_formula(A, chunk, H, Hkv):
    q, k, v = data(chunk + H, H=H, Hkv=Hkv)
    for p in rows(chunk):
        want = formula(q[0], k, v, p, chunk)
        pos = torch.tensor([p], dtype=torch.int64)           # the graph's form: position + 1 keys
        for kw in ({}, {"n_split": 1}, {"n_split": 3, "direct": False}):
            out = A.decode_attention(q, k, v, pos, n_keys_add=1, chunk=chunk, **kw)
            torch.testing.assert_close(out[0].double(), want, rtol=1e-4, atol=1e-4, msg=str((p, kw)))
        out = A.decode_attention(q, k, v, p + 1, chunk=chunk, n_split=2)     # a host key count
        torch.testing.assert_close(out[0].double(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kw", [{"pre": True}, {"kvpre": True}, {"pipe": True}, {"ahead": True},
                                {"vsplit": 2}, {"split_vs": 2, "n_split": 3}, {"n_split": 6, "direct": False}],
                         ids=["pre", "kvpre", "pipe", "ahead", "vsplit2", "split_vs2", "6splits"])
def test_chunk_in_every_kernel_variant(A, kw):
    """The chunk's start moves the programs' key ranges; the preloading (PRE / KVPRE), pipelined (PIPE),
    lookahead (AHEAD) and V-sliced (VS) loops and empty splits (6 over a chunk of at most 2 tiles) read
    those ranges as they read [0, L)."""
    q, k, v = data(7)
    for chunk in (6, 24):
        for p in (24, 36, 47, 71):
            out = A.decode_attention(q, k, v, torch.tensor([p]), n_keys_add=1, chunk=chunk, **kw)
            torch.testing.assert_close(out[0].double(), formula(q[0], k, v, p, chunk), rtol=1e-4, atol=1e-4,
                                       msg=str((chunk, p)))


def test_chunk_is_needed_and_is_not_a_window(A):
    """Without the chunk the rows past the first chunk differ (the rows inside it do not); a window of
    the chunk's size differs too (the chunk's first query sees one key: that key's value); with a window
    as well the later start wins; soft-capped scores compose."""
    q, k, v = data(3, amp=6.0)
    chunk = 6
    for p in (3, 5, 6, 9, 11, 40, 47):
        pos = torch.tensor([p])
        out = A.decode_attention(q, k, v, pos, n_keys_add=1, chunk=chunk, n_split=2)
        full = A.decode_attention(q, k, v, pos, n_keys_add=1, n_split=2)
        diff = float((out - full).abs().max())
        assert (diff > 1e-2) if p >= chunk else (diff < 1e-5), (p, diff)
        if p >= chunk and p % chunk != chunk - 1:
            win = A.decode_attention(q, k, v, pos, n_keys_add=1, window=chunk, n_split=2)
            assert float((out - win).abs().max()) > 1e-2, p
    first = A.decode_attention(q, k, v, torch.tensor([42]), n_keys_add=1, chunk=chunk)
    torch.testing.assert_close(first[0], v[42].repeat_interleave(4, 0), rtol=1e-5, atol=1e-5)
    both = A.decode_attention(q, k, v, torch.tensor([47]), n_keys_add=1, chunk=24, window=5, n_split=2)
    torch.testing.assert_close(both[0].double(), formula(q[0], k, v, 47, 24, window=5), rtol=1e-4, atol=1e-4)
    capped = A.decode_attention(q, k, v, torch.tensor([45]), n_keys_add=1, chunk=24, softcap=3.0, n_split=2)
    torch.testing.assert_close(capped[0].double(), formula(q[0], k, v, 45, 24, softcap=3.0), rtol=1e-4, atol=1e-4)


def _load_count(A, monkeypatch, p, chunk, S=320):
    """Loads (tl.load calls: q, and K and V per tile) the interpreted kernel issues for a row at p."""
    q, k, v = data(1, S=S, H=4, Hkv=2)
    return interpreted_loads(monkeypatch, lambda: A.decode_attention(q, k, v, torch.tensor([p]), n_keys_add=1, n_split=1,
                                                                     chunk=chunk))


def test_chunk_reads_only_its_own_tiles(A, monkeypatch):
    """The tiles before the chunk's start are not visited: rows at 29 and 301 (chunk 8: keys 24..29 /
    296..301, one 16-key tile each) issue the same loads, chunk 24 from 288 (301) and 24 (29) too (one
    tile), while the whole row's loads grow with its length."""
    c29, c301 = _load_count(A, monkeypatch, 29, 8), _load_count(A, monkeypatch, 301, 8)
    assert c29 == c301
    assert _load_count(A, monkeypatch, 301, 24) == _load_count(A, monkeypatch, 29, 24)
    assert _load_count(A, monkeypatch, 301, 0) > 5 * c301


def test_attention_paths_with_chunk(A):
    """ops/cuda/attention.py attention(chunk=): one token by the kernel (attention.chunked.decode), with a
    host start or the graph's position tensor; T > 1 by the torch path (attention.chunked.torch); the
    reference's attention(chunk=) (decode and masked forms) against the formula as well."""
    chunk = 6
    paths.reset()
    for start, T in ((0, 20), (25, 9), (40, 1), (47, 1), (48, 1)):
        q, k, v = data(start + T, T=T)
        want = torch.stack([formula(q[t], k, v, start + t, chunk) for t in range(T)])
        for s in ((start, torch.tensor([start])) if T == 1 else (start,)):
            out = A.attention(q, k, v, s, chunk=chunk)
            torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-4, msg=str((start, T)))
        torch.testing.assert_close(reference.attention(q, k, v, start, chunk=chunk).double(), want,
                                   rtol=1e-5, atol=1e-5)
    counts = paths.snapshot()["counts"]
    assert counts.get("attention.chunked.decode") == 6 and counts.get("attention.chunked.torch") == 2, counts
    # (a chunk of 6 keys: one split, the kernel writing the output itself, attention.decode.one_split)
    assert counts.get("attention.decode.one_split") == 6, counts
    assert not any(p.startswith(("attention.prefill", "attention.window", "attention.decode.triton"))
                   for p in counts), counts


def test_llama4_decode_steps_through_the_chunk_kernel(monkeypatch):
    """llama4's fixture with chunk 8: the host-free decode steps at positions 10..17 (chunk starts 8 and
    16) through the CUDA backend's code -- the chunked layers by the decode kernel's CHUNK variant, no
    torch mask -- equal the reference forward's; the kernel's chunk is needed (chunk dropped: different)."""
    from minfer.gguf_file import GGUFFile
    from minfer.models import Step, load_model
    from minfer.ops.context import Context
    from minfer.runtime.kv_cache import KVCache
    from minfer.switches import Switches

    mods = interpreted_modules(["minfer.ops.cuda.dequant", "minfer.ops.cuda.gemv", "minfer.ops.cuda.qmatmul",
                                "minfer.ops.cuda.norm_rope_act", "minfer.ops.cuda.embedding",
                                "minfer.ops.cuda.attention", "minfer.ops.cuda.moe_act", "minfer.ops.cuda.moe",
                                "minfer.ops.cuda"])
    C = next(mods)["cuda"]
    try:
        m = load_model(GGUFFile(DATA / "llama4.gguf"), progress=False)
        m.chunk, m.temp_floor = 8, 4
        toks = torch.arange(3, 13) * 7 % 300 + 3
        ref_cache = KVCache.for_config(m.cfg, 32)
        m.forward(toks, Step.at(0, 10, "cpu"), ref_cache)
        cache = KVCache.for_config(m.cfg, 32)
        cache.k.copy_(ref_cache.k)
        cache.v.copy_(ref_cache.v)
        nxt = [7, 41, 99, 5, 250, 17, 63, 8]
        want = [m.forward(torch.tensor([t]), Step.at(10 + i, 1, "cpu"), ref_cache) for i, t in enumerate(nxt)]
        route_to_cuda(monkeypatch, C)
        ctx = Context(Switches(), C.Workspace.for_model(m))
        paths.reset()
        got = [m.forward(torch.tensor([t]), Step(torch.tensor([10 + i]), None, "all"), cache, ctx)
               for i, t in enumerate(nxt)]
        counts = paths.snapshot()["counts"]
        for i, (a, b) in enumerate(zip(got, want)):
            assert float((a - b).norm() / b.norm()) < 1e-5, i
        assert counts.get("attention.chunked.decode", 0) == len(nxt) * sum(m.is_chunked), counts
        assert "attention.chunked.torch" not in counts
        # the kernel without the chunk (causal over the whole cache): the step at 17 differs
        real = C.attention
        monkeypatch.setattr(C, "attention", lambda *a, chunk=0, **kw: real(*a, **kw))
        off = m.forward(torch.tensor([nxt[-1]]), Step(torch.tensor([17]), None, "all"), cache, ctx)
        assert float((off - want[-1]).norm() / want[-1].norm()) > 1e-3
    finally:
        next(mods, None)
