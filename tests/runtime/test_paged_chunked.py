"""llama4's chunked attention in the paged KV cache (runtime/paged_kv.py attend(chunk=)): a query at
position p sees the keys j with p // chunk * chunk <= j <= p (llama.cpp llama-hparams.cpp
is_masked_swa, LLAMA_SWA_TYPE_CHUNKED). The Triton paged decode kernel's CHUNK variant in Triton's
interpreter and the torch paths (paged_attention_ref, windowed_attention, the prefill pieces of
PagedKVCache.attend) against a float64 formula written here, with rows whose position crosses chunk
boundaries and chunks not aligned to the pages or the key tiles; then the batch engine on the llama4
fixture (chunk 8): 3 concurrent prompts longer than the chunk, chunked prefill at a budget of 8, greedy
equal to single-sequence greedy on the CPU and with the interpreted kernel serving every decode row,
different without the chunked mask."""

from __future__ import annotations

import math

import pytest
import torch

from minfer.ops import paths
from minfer.runtime.paged_kv import paged_attention_ref, windowed_attention
from minfer.runtime.sampling import SamplingParams
from runtime.paged_helpers import batched_logits, kernel_loads, paged_data, ragged_step
from runtime.test_paged_sinks import PA, SINKS  # noqa: F401  (PA: a fixture)

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning",
                                        "ignore:overflow encountered in exp:RuntimeWarning",
                                        "ignore:invalid value encountered in subtract:RuntimeWarning")


def formula(q, k, v, p, chunk, window=0, softcap=0.0, scale=None, sinks=None):
    """float64, head by head: the query q (H, D) at position p over keys/values (>= p + 1, Hkv, D)
    sees keys j with p // chunk * chunk <= j <= p (chunk 0: every j <= p) and, with a window,
    p - j < window; scores scale * q.k (default 1/sqrt(D)), soft-capped, then the softmax (with a
    sink logit per head, its column dropped) -> (H, Dv)."""
    H, D = q.shape
    g = H // k.shape[1]
    lo = p // chunk * chunk if chunk else 0
    if window:
        lo = max(lo, p - window + 1)
    c = 1.0 / math.sqrt(D) if scale is None else scale
    out = torch.empty(H, v.shape[-1], dtype=torch.float64)
    for h in range(H):
        s = (k[lo:p + 1, h // g].double() @ q[h].double()) * c
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        if sinks is not None:
            s = torch.cat((s, sinks[h].double().reshape(1)))
        out[h] = torch.softmax(s, 0)[:p + 1 - lo] @ v[lo:p + 1, h // g].double()
    return out


def _check(out, q, conts, chunk, **kw):
    for i, (k, v) in enumerate(conts):
        torch.testing.assert_close(out[i].double(), formula(q[i], k, v, k.shape[0] - 1, chunk, **kw),
                                   rtol=1e-4, atol=1e-4)


# rows (their last position p = n - 1) at a chunk's first key, mid-chunk and at its last key, in the
# first chunk and several chunks in; chunks of 3, 5 and 6 (aligned to neither the pages of 4 / 8 nor
# the tiles of 4 / 8 / 16: a chunk starts mid-tile and mid-page), 8 and 16 (tile / page edges), 40 and
# 64 (longer than some or all rows: the causal mask alone)
LENS = [1, 5, 9, 17, 24, 25, 33, 41]
CHUNKS = [3, 5, 6, 8, 16, 40, 64]


@pytest.mark.parametrize("page,block_keys,H,hkv,n_split,merge", [(4, 4, 4, 4, 1, True), (4, 8, 8, 4, 3, True),
                                                                 (8, 4, 8, 2, 2, False), (4, 16, 4, 1, 6, True)],
                         ids=["G1-bs4-1split", "G2-bs8-3splits", "G4-page8-2splits-merge_kernel",
                              "G4-bs16-6splits"])
def test_chunk_kernel_matches_formula(PA, page, block_keys, H, hkv, n_split, merge):
    q, kp, vp, bt, cl, conts = paged_data(LENS, page, H, hkv, seed=page + H)
    for chunk in CHUNKS:
        out = PA.paged_decode_attention(q, kp, vp, bt, cl, n_split=n_split, block_keys=block_keys, chunk=chunk,
                                        merge_in_kernel=merge)
        _check(out, q, conts, chunk)
        # the torch reference of the decode rows agrees
        torch.testing.assert_close(paged_attention_ref(q, kp, vp, bt, cl, chunk=chunk), out, rtol=1e-4, atol=1e-4)
    # the rule is needed: without the chunk the rows past the first chunk differ, the others do not
    full = PA.paged_decode_attention(q, kp, vp, bt, cl, n_split=n_split, block_keys=block_keys, merge_in_kernel=merge)
    out = PA.paged_decode_attention(q, kp, vp, bt, cl, n_split=n_split, block_keys=block_keys, chunk=6,
                                    merge_in_kernel=merge)
    for i, n in enumerate(LENS):
        diff = float((full[i] - out[i]).abs().max())
        assert (diff > 1e-2) if n > 6 else (diff < 1e-5), (n, diff)


def test_chunk_is_not_a_window(PA):
    """The first query of a chunk sees one key (a window of the chunk's size would see chunk keys);
    with CHUNK and WINDOW both, the later start wins; CAP, a scale and sinks compose with CHUNK."""
    lens = [17, 24, 25, 30]                               # p = 16 (a chunk's first key at 8), 23, 24, 29
    q, kp, vp, bt, cl, conts = paged_data(lens, 4, 8, 2, seed=3, amp=6.0)
    kw = dict(n_split=2, block_keys=4)
    chunked = PA.paged_decode_attention(q, kp, vp, bt, cl, chunk=8, **kw)
    _check(chunked, q, conts, 8)
    windowed = PA.paged_decode_attention(q, kp, vp, bt, cl, window=8, **kw)
    assert all((chunked[i] - windowed[i]).abs().max() > 1e-2 for i in range(len(lens)) if (lens[i] - 1) % 8 != 7)
    # row 0 at a chunk's first position: the value of that key alone
    torch.testing.assert_close(chunked[0], conts[0][1][16].repeat_interleave(4, 0), rtol=1e-5, atol=1e-5)
    both = PA.paged_decode_attention(q, kp, vp, bt, cl, chunk=8, window=3, **kw)
    _check(both, q, conts, 8, window=3)
    sinks = SINKS[:8]
    out = PA.paged_decode_attention(q, kp, vp, bt, cl, chunk=5, softcap=3.0, scale=0.4, sinks=sinks, **kw)
    _check(out, q, conts, 5, softcap=3.0, scale=0.4, sinks=sinks)
    torch.testing.assert_close(paged_attention_ref(q, kp, vp, bt, cl, 0, 3.0, sinks, 0.4, chunk=5), out,
                               rtol=1e-4, atol=1e-4)


def test_chunk_reads_only_its_own_tiles(PA, monkeypatch):
    """A chunked layer's row reads its own chunk's tiles, not the earlier chunks': rows of 30 and 302
    keys (chunk 8: keys 24..29 / 296..301, two tiles of 4 each) issue the same loads, the full row's
    grow with its length; chunk 6 (not tile-aligned) from key 294 reads its tiles from 292."""
    c30, c302 = kernel_loads(PA, monkeypatch, 30, chunk=8), kernel_loads(PA, monkeypatch, 302, chunk=8)
    assert c30 == c302
    assert kernel_loads(PA, monkeypatch, 302, chunk=0) > 10 * c302
    # 294..297 / 18..21
    assert kernel_loads(PA, monkeypatch, 298, chunk=6) == kernel_loads(PA, monkeypatch, 22, chunk=6)


# ---- the torch paths and PagedKVCache.attend --------------------------------------------------------

def test_windowed_attention_with_chunk_matches_formula():
    """windowed_attention(chunk=) (the prefill path with a window or soft-cap) for queries at positions
    3..20 crossing chunk boundaries (chunk 5), each against the formula; without the chunk it differs."""
    g = torch.Generator().manual_seed(2)
    k, v = torch.randn(21, 2, 8, generator=g), torch.randn(21, 2, 8, generator=g)
    q = 3 * torch.randn(18, 8, 8, generator=g)
    for chunk, kw in ((5, {}), (5, dict(softcap=3.0)), (7, dict(window=4))):
        out = windowed_attention(q, k, v, 3, kw.get("window", 0), kw.get("softcap", 0.0), chunk=chunk)
        for t in range(18):
            torch.testing.assert_close(out[t].double(), formula(q[t], k, v, 3 + t, chunk, **kw), rtol=1e-5, atol=1e-5)
    assert (windowed_attention(q, k, v, 3, 0) - windowed_attention(q, k, v, 3, 0, chunk=5)).abs().max() > 1e-2


# decode rows at a chunk's first position (10 with chunk 5), mid-chunk and at its last; a fresh prompt
# of 13 crossing two boundaries; a chunk from 7 to 18 (after a cached prefix, mid-chunk start) crossing two
SPECS = [(10, 1), (17, 1), (4, 1), (0, 13), (7, 12)]


@pytest.mark.parametrize("kernel", [False, True], ids=["torch", "interpreted_kernel"])
@pytest.mark.parametrize("chunk", [5, 8])
def test_cache_attend_with_chunk(PA, kernel, chunk):
    """A ragged step through PagedKVCache.attend(chunk=) equals the formula token by token, the decode
    rows by paged_attention_ref or (as on CUDA) the interpreted kernel, the prefill chunks cut into
    pieces; each path counted where it ran; without the chunk the output differs."""
    H, hkv, dh = 8, 2, 8
    cache, T, full = ragged_step(4, hkv, dh, SPECS, key_round=8)      # padded keys, as CUDA's 128
    cache.decode_attention = PA.paged_decode_attention if kernel else None
    q = 3 * torch.randn(T, H, dh, generator=torch.Generator().manual_seed(8))
    paths.reset()
    out = cache.attend(0, q, chunk=chunk)
    counts = paths.snapshot()["counts"]
    t = 0
    for (nb, n), (k, v) in zip(SPECS, full):
        for i in range(n):
            torch.testing.assert_close(out[t + i].double(), formula(q[t + i], k, v, nb + i, chunk),
                                       rtol=1e-4, atol=1e-4)
        t += n
    assert counts.get("attention.paged_decode.chunked.triton", 0) == (1 if kernel else 0)
    assert counts.get("attention.paged_decode.chunked.torch", 0) == (0 if kernel else 1)
    assert counts.get("attention.paged_prefill.chunked.pieces", 0) == 2
    assert (out - cache.attend(0, q)).abs().max() > 1e-2


# ---- the batch engine on the llama4 fixture (chunk 8) -----------------------------------------------

N_NEW = 10


@pytest.fixture(scope="module")
def llama4():
    """The llama4 engine with chunk 8 and temperature floor 4 (tests/ops/test_arch_forward_interpreted.py
    SMALL; test_more_archs_b.llama4_local: the fixture's transformers logits were made so), 3 prompts of
    20, 11 and 17 tokens (each longer than the chunk) and their single-sequence greedy answers."""
    from models.test_arch_vs_transformers import engine, ref

    eng = engine("llama4")
    eng.model.chunk, eng.model.temp_floor = 8, 4
    ids = ref("llama4")["ids"].tolist()
    prompts = [ids[:20], ids[3:14], ids[10:27]]
    singles = [[ev.token_id for ev in eng.generate(p, SamplingParams(temperature=0), max_new_tokens=N_NEW)]
               for p in prompts]
    return eng, prompts, singles


def test_batch_engine_llama4_equals_single_greedy(llama4):
    """3 concurrent prompts, chunked prefill: the single-sequence greedy tokens, the chunked layers'
    decode rows by paged_attention_ref(chunk=), their prefill chunks in pieces."""
    eng, prompts, singles = llama4
    paths.reset()
    toks, _ = batched_logits(eng, prompts, N_NEW)
    assert toks == singles
    counts = paths.snapshot()["counts"]
    assert counts.get("attention.paged_decode.chunked.torch", 0) > 0
    assert counts.get("attention.paged_prefill.chunked.pieces", 0) > 0


def test_batch_engine_llama4_needs_the_chunked_mask(llama4, monkeypatch):
    """Without the chunks (the model's chunk past the context: plain causal attention on every layer)
    the batched greedy answers differ from the single-sequence ones (the mask is needed at this size)."""
    eng, prompts, singles = llama4
    monkeypatch.setattr(eng.model, "chunk", 10 ** 6)
    assert batched_logits(eng, prompts, N_NEW)[0] != singles


def test_batch_engine_llama4_with_the_interpreted_chunk_kernel(llama4, PA):
    """Every decode row through the interpreted kernel (the chunked layers' by its CHUNK variant, the
    NoPE layer's plain): greedy equal to single, logits equal to the CPU torch path's; with the
    kernel's chunk dropped they differ."""
    eng, prompts, singles = llama4
    _, ref = batched_logits(eng, prompts, N_NEW)
    paths.reset()
    toks, got = batched_logits(eng, prompts, N_NEW, PA.paged_decode_attention)
    assert toks == singles
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    counts = paths.snapshot()["counts"]
    assert counts.get("attention.paged_decode.chunked.triton", 0) > 0
    assert counts.get("attention.paged_decode.triton", 0) > 0
    assert not [p for p in counts if p.startswith("attention.paged_decode") and p.endswith(".torch")]
    no_chunk = lambda *a, **kw: PA.paged_decode_attention(*a, **{k: x for k, x in kw.items() if k != "chunk"})  # noqa: E731
    assert (batched_logits(eng, prompts, N_NEW, no_chunk)[1] - ref).abs().max() > 1e-2
