"""Attention sinks (gpt-oss: one extra softmax logit per query head, with no value) through the
paged KV cache: the Triton paged decode kernel's SINK variant in Triton's interpreter and the
torch paths (paged_attention_ref, windowed_attention, PagedKVCache.attend's chunks) against a
float64 formula / minfer.ops.reference.attention with sinks; then the batch engine on the gpt-oss
fixture: batched greedy (concurrent prompts of different lengths, chunked prefill) identical to
single-sequence greedy, on the CPU and with the interpreted SINK kernel (and its WINDOW + SINK
variant) for the decode rows, and different with the sinks dropped from the paged cache."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from minfer.ops import paths, reference
from minfer.runtime.paged_kv import PagedKVCache, PagedStep, paged_attention_ref, windowed_attention
from minfer.runtime.sampling import SamplingParams
from minfer.runtime.scheduler import StepItem
from minfer.runtime.sequence import Sequence

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ops"))
from kernel_data import interpreted_modules  # noqa: E402
from test_sinks_attention_interpreted import formula  # noqa: E402  (the float64 softmax with sinks)

sys.path.insert(0, os.path.dirname(__file__))
from test_paged_kv import _scatter  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")

SINKS = torch.tensor([2.5, -1.0, 0.5, 4.0, -3.0, 1.5, 0.0, 3.0])


@pytest.fixture(scope="module")
def PA():
    for mods in interpreted_modules(["minfer.ops.cuda.paged_attention"]):
        yield mods["paged_attention"]


# several rows of different lengths (1 key, within a page, over pages, longer than the splits),
# G = H / Hkv of 1, 2 and 4; n_split 1: the one-split store; 3 and 6: split 0 plus splits the
# short rows leave empty, merged in the kernel or by the merge kernel
@pytest.mark.parametrize("bs,H,hkv,n_split", [(4, 4, 2, 1), (4, 8, 2, 3), (8, 4, 4, 2), (4, 8, 2, 6),
                                              (16, 4, 1, None)])
@pytest.mark.parametrize("merge_in_kernel", [True, False], ids=["merge_in_kernel", "merge_kernel"])
def test_triton_paged_decode_sinks_match_formula(PA, bs, H, hkv, n_split, merge_in_kernel):
    lens = [1, 7, 2 * bs + 3, 40]
    dh = 16
    kp, vp, bt, conts = _scatter(lens, bs, hkv, dh, n_blocks=48, seed=11)
    kp, vp = kp.nan_to_num(0.0), vp.nan_to_num(0.0)   # masked loads still read in the interpreter
    q = 2 * torch.randn(len(lens), H, dh, generator=torch.Generator().manual_seed(6))
    sinks = SINKS[:H]
    cl = torch.tensor(lens, dtype=torch.int32)
    out = PA.paged_decode_attention(q, kp, vp, bt, cl, n_split=n_split, merge_in_kernel=merge_in_kernel,
                                    sinks=sinks)
    plain = PA.paged_decode_attention(q, kp, vp, bt, cl, n_split=n_split, merge_in_kernel=merge_in_kernel)
    for i, (n, (k, v)) in enumerate(zip(lens, conts)):
        want = formula(q[i:i + 1], k, v, n - 1, 0, sinks)
        torch.testing.assert_close(out[i:i + 1].double(), want, rtol=1e-4, atol=1e-4)
        assert (plain[i:i + 1].double() - want).abs().max() > 1e-2        # the sink is needed
    # the paged reference with the same sinks agrees
    torch.testing.assert_close(paged_attention_ref(q, kp, vp, bt, cl, sinks=sinks), out, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("window", [0, 5])
def test_torch_paths_with_sinks_match_reference(window):
    """paged_attention_ref (decode rows) and windowed_attention (chunks) with sinks against
    reference.attention with the same sinks; without them the results differ."""
    bs, H, hkv, dh = 4, 8, 2, 8
    lens = [1, 3, 9, 14]
    sinks = SINKS[:H]
    kp, vp, bt, conts = _scatter(lens, bs, hkv, dh, n_blocks=32, seed=9)
    q = 2 * torch.randn(len(lens), H, dh, generator=torch.Generator().manual_seed(4))
    cl = torch.tensor(lens, dtype=torch.int32)
    out = paged_attention_ref(q, kp, vp, bt, cl, window=window, sinks=sinks)
    for i, (n, (k, v)) in enumerate(zip(lens, conts)):
        ref = reference.attention(q[i:i + 1], k, v, n - 1, window, sinks=sinks)
        torch.testing.assert_close(out[i:i + 1], ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out[i:i + 1].double(), formula(q[i:i + 1], k, v, n - 1, window, sinks),
                                   rtol=1e-5, atol=1e-5)
    assert (out - paged_attention_ref(q, kp, vp, bt, cl, window=window)).abs().max() > 1e-2
    k, v = conts[3]
    qc = 2 * torch.randn(6, H, dh, generator=torch.Generator().manual_seed(5))
    got = windowed_attention(qc, k, v, 8, window, sinks=sinks)                   # positions 8..13
    torch.testing.assert_close(got, reference.attention(qc, k, v, 8, window, sinks=sinks), rtol=1e-5, atol=1e-5)
    assert (got - windowed_attention(qc, k, v, 8, window)).abs().max() > 1e-2


@pytest.mark.parametrize("window", [0, 5])
def test_cache_attend_with_sinks_mixes_decode_rows_and_chunks(window):
    """A ragged step (2 decode rows, a fresh prompt, a chunk after a cached prefix) through
    PagedKVCache.attend(..., sinks) equals reference.attention with the sinks, sequence by
    sequence; the torch path is counted where the window sends it there."""
    bs, H, hkv, dh = 4, 4, 2, 8
    sinks = SINKS[:H]
    cache = PagedKVCache(1, 32, bs, hkv, dh)
    g = torch.Generator().manual_seed(3)
    specs = [(6, 1), (9, 1), (0, 7), (8, 5)]
    items, full = [], []
    free = list(range(31, 0, -1))
    for n_before, n in specs:
        s = Sequence(list(range(n_before + (n if n > 1 else 0))), SamplingParams(temperature=0), 4)
        if n == 1:
            s.tokens.append(0)
        s.block_table = [free.pop() for _ in range(-(-(n_before + n) // bs))]
        k = torch.randn(n_before + n, hkv, dh, generator=g)
        v = torch.randn(n_before + n, hkv, dh, generator=g)
        for p in range(n_before):
            slot = s.block_table[p // bs] * bs + p % bs
            cache.k[0, slot], cache.v[0, slot] = k[p], v[p]
        items.append(StepItem(s, n_before, n, True, n == 1))
        full.append((k, v))
    step = PagedStep.build(items, bs, "cpu")
    T = sum(n for _, n in specs)
    q = 2 * torch.randn(T, H, dh, generator=g)
    cache.step = step
    cache.write(0, torch.cat([k[nb:] for (k, _), (nb, _) in zip(full, specs)]),
                torch.cat([v[nb:] for (_, v), (nb, _) in zip(full, specs)]))
    paths.reset()
    out = cache.attend(0, q, window=window, sinks=sinks)
    counts = paths.snapshot()["counts"]
    # the torch paths counted where they run: the decode rows once, each of the 2 chunks once
    assert counts.get("attention.paged_decode.window.sinks.torch", 0) == (1 if window else 0)
    assert counts.get("attention.paged_prefill.window.sinks.torch", 0) == (2 if window else 0)
    t = 0
    for (nb, n), (k, v) in zip(specs, full):
        ref = reference.attention(q[t:t + n], k, v, nb, window, sinks=sinks)
        torch.testing.assert_close(out[t:t + n], ref, rtol=1e-5, atol=1e-5)
        t += n
    assert (out - cache.attend(0, q, window=window)).abs().max() > 1e-2


# ---- the batch engine on the gpt-oss fixture ------------------------------------------------------

PROMPTS = [[5, 77, 12, 140, 9, 33, 201, 18, 64, 3, 250, 41, 7, 99, 120, 8, 66, 31, 17, 200],
           [11, 42, 7], [90, 14, 150, 3, 61, 222, 19, 45, 8, 130, 77]]
N_NEW = 8


@pytest.fixture(scope="module")
def eng():
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from models.test_arch_vs_transformers import engine
    return engine("gpt-oss")


@pytest.fixture(scope="module")
def singles(eng):
    return [[ev.token_id for ev in eng.generate(p, SamplingParams(temperature=0), max_new_tokens=N_NEW)]
            for p in PROMPTS]


def batched(eng, decode_attention=None):
    """The prompts together through a batch engine: blocks of 4 (the window of 8 spans blocks),
    a token budget of 8 (the 20- and 11-token prompts prefill in chunks, next to decode rows)."""
    from minfer.runtime.batch_engine import BatchEngine

    assert eng.model.paged_kv
    be = BatchEngine(eng.model, eng.tokenizer, n_ctx=64, max_seqs=3, n_blocks=48, block_size=4, token_budget=8)
    be.cache.decode_attention = decode_attention
    outs = be.generate_many(PROMPTS, SamplingParams(temperature=0), N_NEW)
    return [[ev.token_id for ev in o] for o in outs]


def test_batch_engine_serves_gpt_oss_as_single_greedy(eng, singles):
    paths.reset()
    assert batched(eng) == singles
    counts = paths.snapshot()["counts"]
    assert counts.get("attention.paged_decode.window.sinks.torch", 0) > 0      # the sliding layers' torch path


def test_batch_engine_needs_the_sinks(eng, singles, monkeypatch):
    """With the paged cache dropping the sinks the batched greedy differs from single greedy."""
    attend = PagedKVCache.attend
    monkeypatch.setattr(PagedKVCache, "attend", lambda self, *a, sinks=None, **kw: attend(self, *a, **kw))
    assert batched(eng) != singles


def test_batch_engine_gpt_oss_with_the_interpreted_sink_kernel(eng, singles, PA):
    """The decode rows through the Triton paged kernel (Triton's interpreter, as the CUDA engine
    sets cache.decode_attention): the full-attention layers' by its SINK variant, the sliding
    layers' by WINDOW + SINK (tests/runtime/test_paged_window.py); the prefill chunks by
    ops.attention with sinks / windowed_attention (the CPU references)."""
    paths.reset()
    assert batched(eng, PA.paged_decode_attention) == singles
    counts = paths.snapshot()["counts"]
    assert counts.get("attention.paged_decode.sinks.triton", 0) > 0
    assert counts.get("attention.paged_decode.window.sinks.triton", 0) > 0
    assert counts.get("attention.paged_decode.triton", 0) == 0
    assert counts.get("attention.paged_decode.window.sinks.torch", 0) == 0
