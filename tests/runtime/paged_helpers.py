"""Data and runs shared by the paged decode-attention tests (test_paged_chunked.py, test_paged_window.py):
scattered pages with their queries, a ragged step written into a one-layer PagedKVCache, the interpreted
kernel's load count for one row, and the batch engine's run with each sampled row's logits kept."""

from __future__ import annotations

import torch

from minfer.runtime.paged_kv import PagedKVCache, PagedStep
from minfer.runtime.sampling import SamplingParams
from minfer.runtime.scheduler import StepItem
from minfer.runtime.sequence import Sequence
from ops.kernel_data import interpreted_loads
from runtime.test_paged_kv import _scatter


def paged_data(lens, page, H, hkv, dh=16, seed=0, amp=2.0):
    """Rows of `lens` keys scattered over pages of `page` (test_paged_kv._scatter) and a query per row of amp
    times a standard normal -> q (B, H, dh), k pages, v pages, block table, lengths (int32), [(k, v) per row]."""
    kp, vp, bt, conts = _scatter(lens, page, hkv, dh, n_blocks=sum(-(-n // page) for n in lens) + 4, seed=seed)
    kp, vp = kp.nan_to_num(0.0), vp.nan_to_num(0.0)   # masked loads still read in the interpreter
    q = amp * torch.randn(len(lens), H, dh, generator=torch.Generator().manual_seed(seed + 1))
    return q, kp, vp, bt, torch.tensor(lens, dtype=torch.int32), conts


def kernel_loads(PA, monkeypatch, n, **mask):
    """Loads (tl.load calls, whole tiles) the interpreted kernel issues for one row of n keys (tiles of 4),
    with the mask's keyword (window= or chunk=)."""
    q, kp, vp, bt, cl, _ = paged_data([n], 4, 4, 2, seed=1)
    return interpreted_loads(monkeypatch, lambda: PA.paged_decode_attention(q, kp, vp, bt, cl, n_split=1, block_keys=4,
                                                                            **mask))


def ragged_step(bs, hkv, dh, specs, seed=3, key_round=None):
    """A cache of one layer holding sequences (n_before cached, n new): a decode row for n = 1, a
    chunk else; the step written (PagedStep.build's key_round). -> cache, step's token count,
    [(k, v) of each sequence]."""
    cache = PagedKVCache(1, 40, bs, hkv, dh)
    g = torch.Generator().manual_seed(seed)
    items, full = [], []
    free = list(range(39, 0, -1))
    for n_before, n in specs:
        s = Sequence(list(range(n_before + (n if n > 1 else 0))), SamplingParams(temperature=0), 4)
        if n == 1:
            s.tokens.append(0)
        s.block_table = [free.pop() for _ in range(-(-(n_before + n) // bs))]
        k, v = torch.randn(n_before + n, hkv, dh, generator=g), torch.randn(n_before + n, hkv, dh, generator=g)
        for p in range(n_before):
            slot = s.block_table[p // bs] * bs + p % bs
            cache.k[0, slot], cache.v[0, slot] = k[p], v[p]
        items.append(StepItem(s, n_before, n, True, n == 1))
        full.append((k, v))
    cache.step = PagedStep.build(items, bs, "cpu", key_round=key_round)
    cache.write(0, torch.cat([k[nb:] for (k, _), (nb, _) in zip(full, specs)]),
                torch.cat([v[nb:] for (_, v), (nb, _) in zip(full, specs)]))
    return cache, sum(n for _, n in specs), full


def batched_logits(eng, prompts, n_new, decode_attention=None):
    """The prompts together through the batch engine (blocks of 4, a token budget of 8: the prompts prefill in
    chunks beside decode rows; decode_attention: the cache's decode kernel, None for the CPU torch path), each
    sampled row's logits kept -> (tokens of each prompt, logits (len(prompts), n_new, V))."""
    from minfer.runtime.batch_engine import BatchEngine

    assert eng.model.paged_kv
    be = BatchEngine(eng.model, eng.tokenizer, n_ctx=64, max_seqs=3, n_blocks=48, block_size=4, token_budget=8)
    be.cache.decode_attention = decode_attention
    be.keep_logits = True
    seqs = [be.add(p, SamplingParams(temperature=0), n_new) for p in prompts]
    while be.has_work:
        be.step()
    return ([s.tokens[len(p):] for s, p in zip(seqs, prompts)],
            torch.stack([torch.stack(s.state.logits) for s in seqs]))
