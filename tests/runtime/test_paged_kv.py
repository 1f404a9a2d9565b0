"""The paged KV cache against the contiguous attention of minfer.ops.reference.

Keys/values are scattered over shuffled blocks of one pool; attention read through the block
tables must equal the reference attention over the same keys stored contiguously. The Triton
paged decode kernel runs in Triton's interpreter (fp32/fp16: the interpreter's bf16 tl.dot is
wrong), against the same contiguous reference.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

from minfer.ops import reference
from minfer.runtime.paged_kv import PagedKVCache, PagedStep, paged_attention_ref
from minfer.runtime.scheduler import StepItem
from minfer.runtime.sequence import Sequence
from minfer.runtime.sampling import SamplingParams

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ops"))
from kernel_data import interpreted_modules  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")


def _scatter(lens, bs, hkv, dh, n_blocks, seed=0, dtype=torch.float32):
    """Random contiguous keys/values per sequence, and the same scattered into shuffled pages."""
    g = torch.Generator().manual_seed(seed)
    kp = torch.full((n_blocks, bs, hkv, dh), float("nan"), dtype=dtype)   # unused slots poisoned
    vp = torch.full_like(kp, float("nan"))
    order = (torch.randperm(n_blocks - 1, generator=g) + 1).tolist()       # block 0 reserved
    conts, tables = [], []
    for n in lens:
        k = torch.randn(n, hkv, dh, generator=g).to(dtype)
        v = torch.randn(n, hkv, dh, generator=g).to(dtype)
        nb = -(-n // bs)
        table = [order.pop() for _ in range(nb)]
        for p in range(n):
            kp[table[p // bs], p % bs] = k[p]
            vp[table[p // bs], p % bs] = v[p]
        conts.append((k, v))
        tables.append(table)
    width = max(len(t) for t in tables) + 1
    bt = torch.zeros(len(lens), width, dtype=torch.int32)
    for i, t in enumerate(tables):
        bt[i, :len(t)] = torch.tensor(t)
    return kp, vp, bt, conts


@pytest.mark.parametrize("bs,H,hkv", [(4, 4, 2), (16, 6, 1), (8, 4, 4)])
def test_paged_reference_equals_contiguous(bs, H, hkv):
    lens = [1, 5, bs, 3 * bs + 1, 37]
    dh = 8
    kp, vp, bt, conts = _scatter(lens, bs, hkv, dh, n_blocks=64)
    q = torch.randn(len(lens), H, dh, generator=torch.Generator().manual_seed(1))
    out = paged_attention_ref(q, kp, vp, bt, torch.tensor(lens, dtype=torch.int32))
    for i, (n, (k, v)) in enumerate(zip(lens, conts)):
        ref = reference.attention(q[i:i + 1], k, v, n - 1)     # the last position attends all n keys
        torch.testing.assert_close(out[i:i + 1], ref, rtol=1e-5, atol=1e-5)


def test_cache_attend_mixes_decode_rows_and_prefill_chunks():
    """A ragged step (2 decode rows, a fresh prompt, a chunk after a cached prefix) through
    PagedKVCache.attend equals the reference attention of each sequence on its own."""
    bs, H, hkv, dh = 4, 4, 2, 8
    cache = PagedKVCache(1, 32, bs, hkv, dh)
    g = torch.Generator().manual_seed(3)
    # sequences: (cached length before the step, tokens fed this step, is it decode)
    specs = [(6, 1), (9, 1), (0, 7), (8, 5)]
    seqs, items, full = [], [], []
    free = list(range(31, 0, -1))
    for n_before, n in specs:
        if n == 1:                         # a decode row: the prompt, then one generated token
            s = Sequence(list(range(n_before)), SamplingParams(temperature=0), 4)
            s.tokens.append(0)
        else:
            s = Sequence(list(range(n_before + n)), SamplingParams(temperature=0), 4)
        s.block_table = [free.pop() for _ in range(-(-(n_before + n) // bs))]
        k = torch.randn(n_before + n, hkv, dh, generator=g)
        v = torch.randn(n_before + n, hkv, dh, generator=g)
        for p in range(n_before):       # the cached prefix already in the pool
            slot = s.block_table[p // bs] * bs + p % bs
            cache.k[0, slot], cache.v[0, slot] = k[p], v[p]
        seqs.append(s)
        items.append(StepItem(s, n_before, n, True, n == 1))
        full.append((k, v))
    step = PagedStep.build(items, bs, "cpu")
    assert step.n_decode == 2 and len(step.chunks) == 2
    T = sum(n for _, n in specs)
    q = torch.randn(T, H, dh, generator=g)
    knew = torch.cat([k[nb:] for (k, _), (nb, _) in zip(full, specs)])
    vnew = torch.cat([v[nb:] for (_, v), (nb, _) in zip(full, specs)])
    cache.step = step
    cache.write(0, knew, vnew)
    out = cache.attend(0, q)
    t = 0
    for (nb, n), (k, v) in zip(specs, full):
        ref = reference.attention(q[t:t + n], k, v, nb)
        torch.testing.assert_close(out[t:t + n], ref, rtol=1e-5, atol=1e-5)
        t += n
    assert step.logit_rows.tolist() == [0, 1, 8, 13]


def test_padded_decode_rows_use_block_zero():
    bs = 4
    s = Sequence([1, 2, 3], SamplingParams(temperature=0), 4)
    s.tokens.append(4)
    s.block_table = [5]
    step = PagedStep.build([StepItem(s, 3, 1, True, True)], bs, "cpu", pad_decode_to=4, max_blocks=8)
    assert step.n_decode == 4 and step.block_tables.shape == (4, 8)
    assert step.slots.tolist() == [5 * bs + 3, 0, 0, 0]
    assert step.context_lens.tolist() == [4, 1, 1, 1]
    assert step.logit_rows.tolist() == [0, 1, 2, 3]


@pytest.fixture(scope="module")
def PA():
    for mods in interpreted_modules(["minfer.ops.cuda.paged_attention"]):
        yield mods["paged_attention"]


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.float16, 2e-3)])
# n_split 1: the one-split kernel writes the output itself (no merge); 6: with these lengths
# (each row's keys divided over the splits in-kernel) the short rows leave splits empty
@pytest.mark.parametrize("bs,H,hkv,n_split", [(16, 4, 2, None), (8, 7, 1, 3), (4, 8, 8, 2), (4, 4, 2, 1),
                                              (4, 8, 2, 6)])
@pytest.mark.parametrize("merge_in_kernel", [True, False], ids=["merge_in_kernel", "merge_kernel"])
def test_triton_paged_decode_matches_contiguous(PA, dtype, tol, bs, H, hkv, n_split, merge_in_kernel):
    lens = [1, 9, 2 * bs + 3, 40]
    dh = 16
    kp, vp, bt, conts = _scatter(lens, bs, hkv, dh, n_blocks=48, seed=5, dtype=dtype)
    kp, vp = kp.nan_to_num(0.0), vp.nan_to_num(0.0)   # masked loads still read in the interpreter
    q = torch.randn(len(lens), H, dh, generator=torch.Generator().manual_seed(2)).to(dtype)
    for _ in range(2):      # the in-kernel merge's tickets reset themselves: a second launch is the same
        out = PA.paged_decode_attention(q, kp, vp, bt, torch.tensor(lens, dtype=torch.int32), n_split=n_split,
                                        merge_in_kernel=merge_in_kernel)
        for i, (n, (k, v)) in enumerate(zip(lens, conts)):
            ref = reference.attention(q[i:i + 1].float(), k.float(), v.float(), n - 1)
            torch.testing.assert_close(out[i:i + 1].float(), ref, rtol=tol, atol=tol)
    if merge_in_kernel:
        assert int(PA._COUNTERS[q.device].cnt.abs().sum()) == 0


def test_sliding_window_decode_and_chunk_match_a_masked_reference():
    """window > 0 (gemma3's local layers): decode rows see their last `window` keys, chunk rows
    the keys (p - window, p]; checked against the full reference on the truncated keys."""
    from minfer.runtime.paged_kv import windowed_attention
    bs, H, hkv, dh, w = 4, 4, 2, 8, 5
    lens = [3, 9, 14]
    kp, vp, bt, conts = _scatter(lens, bs, hkv, dh, n_blocks=32, seed=9)
    q = torch.randn(3, H, dh, generator=torch.Generator().manual_seed(4))
    out = paged_attention_ref(q, kp, vp, bt, torch.tensor(lens, dtype=torch.int32), window=w)
    for i, (n, (k, v)) in enumerate(zip(lens, conts)):
        lo = max(0, n - w)
        ref = reference.attention(q[i:i + 1], k[lo:], v[lo:], n - lo - 1)
        torch.testing.assert_close(out[i:i + 1], ref, rtol=1e-5, atol=1e-5)
    k, v = conts[2]
    qc = torch.randn(6, H, dh, generator=torch.Generator().manual_seed(5))
    got = windowed_attention(qc, k, v, 8, w)                  # positions 8..13
    for i in range(6):
        p = 8 + i
        lo = max(0, p - w + 1)
        ref = reference.attention(qc[i:i + 1], k[lo:p + 1], v[lo:p + 1], p - lo)
        torch.testing.assert_close(got[i:i + 1], ref, rtol=1e-5, atol=1e-5)
