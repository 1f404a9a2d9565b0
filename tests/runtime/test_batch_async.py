"""Held batch steps (BatchEngine.async_steps, runtime/batch_engine.py) on the CPU: the engine
that launches a decode step from the previous step's device tokens before reading them gives
the same tokens, texts, finish reasons, log-probabilities and block accounting as the engine
that reads every step first -- through stops in the middle of a chain, length ends at different
steps, preemption, cancellation, seeded sampling, prefix hits and arrivals during decoding.
The reference for the tokens themselves is the single-user Engine (contiguous cache)."""

from __future__ import annotations

import torch

from minfer.ops import paths
from minfer.runtime.batch_engine import BatchEngine
from minfer.runtime.engine import Engine
from minfer.runtime.sampling import SamplingParams
from runtime.batch_helpers import StreamTok

GREEDY = SamplingParams(temperature=0)


def _prompts(k, lo=3, hi=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 64, (int(torch.randint(lo, hi, (1,), generator=g)),), generator=g).tolist()
            for _ in range(k)]


def _run(be, reqs, arrivals=None, cancel_at=None):
    """reqs: [(prompt, params, max_new, stop)]; arrivals: {step call index: [req indices]} (the
    rest at call 0); cancel_at: (call index, req index). Returns per request the (token, text,
    finish, logprob) tuples, and the sequences."""
    arrivals = arrivals or {0: list(range(len(reqs)))}
    seqs: dict[int, object] = {}
    evs: dict[int, list] = {i: [] for i in range(len(reqs))}
    by_id = {}
    call = 0
    while call == 0 or be.has_work or any(c >= call for c in arrivals):
        for i in arrivals.get(call, []):
            p, sp, n, stop = reqs[i]
            s = be.add(p, sp, n, stop=stop)
            seqs[i] = s
            by_id[s.seq_id] = i
        if cancel_at and cancel_at[0] == call:
            be.cancel(seqs[cancel_at[1]].seq_id)
        for s, ev in be.step():
            evs[by_id[s.seq_id]].append(None if ev is None else
                                        (ev.token_id, ev.text, ev.finish_reason, round(ev.logprob, 4)))
        call += 1
        assert call < 500
    return evs, seqs


def _pair(tiny, tok=None, **kw):
    return [BatchEngine(tiny, tok, async_steps=a, **kw) for a in (False, True)]


def test_greedy_with_stops_and_lengths_equals_the_synchronous_engine(tiny):
    prompts = _prompts(6)
    free = BatchEngine(tiny, n_ctx=128, max_seqs=8, n_blocks=64, block_size=4).generate_many(prompts, GREEDY, 14)
    eog = free[2][5].token_id                       # ends sequence 2 at its 6th token, mid-chain
    stop = f"t{free[4][8].token_id} "               # a stop string inside sequence 4's text
    reqs = [(p, GREEDY, 6 + 2 * i, [stop] if i == 4 else []) for i, p in enumerate(prompts)]
    kw = dict(n_ctx=128, max_seqs=8, n_blocks=64, block_size=4, token_budget=24)
    sync, eng = _pair(tiny, StreamTok([eog]), **kw)
    paths.reset()
    a, _ = _run(sync, reqs)
    assert paths.snapshot()["counts"].get("batch.async_chain", 0) == 0
    b, seqs = _run(eng, reqs)
    counts = paths.snapshot()["counts"]
    assert counts.get("batch.async_chain", 0) > 5 and counts.get("batch.async_step", 0) > 5, counts
    assert a == b
    assert b[2][-1][2] == "stop" and len(b[2]) <= 6
    assert b[4][-1][2] == "stop"
    for i, (p, *_rest) in enumerate(reqs):        # and the tokens are the single-user Engine's
        want = [e.token_id for e in Engine(tiny, None, 128).generate(p, GREEDY, len(b[i]))]
        assert [t for t, *_ in b[i]] == want
    assert eng.blocks.n_used == 0 and not eng.has_work
    eng.blocks.check()


def test_preemption_and_seeded_sampling_equal_the_synchronous_engine(tiny):
    prompts = _prompts(5, 10, 30, seed=1)
    reqs = [(p, SamplingParams(temperature=1.0, top_k=0, top_p=0.9, min_p=0.0, seed=10 + i) if i % 2 else GREEDY,
             16, []) for i, p in enumerate(prompts)]
    kw = dict(n_ctx=128, max_seqs=5, n_blocks=1 + 24, block_size=4, token_budget=32, prefix_cache=False)
    sync, eng = _pair(tiny, **kw)
    a, _ = _run(sync, reqs)
    b, _ = _run(eng, reqs)
    assert sync.scheduler.n_preemptions > 0 and eng.scheduler.n_preemptions > 0
    assert [[t for t, *_ in r] for r in a.values()] == [[t for t, *_ in r] for r in b.values()]
    assert eng.blocks.n_used == 0
    eng.blocks.check()


def test_cancel_during_a_chain_and_arrivals(tiny):
    prompts = _prompts(5, 5, 20, seed=4)
    reqs = [(p, GREEDY, 20, []) for p in prompts]
    arrivals = {0: [0, 1, 2], 7: [3], 12: [4]}      # two arrive while the first three decode
    kw = dict(n_ctx=128, max_seqs=8, n_blocks=64, block_size=4)
    sync, eng = _pair(tiny, **kw)
    a, _ = _run(sync, reqs, arrivals, cancel_at=(9, 1))
    b, seqs = _run(eng, reqs, arrivals, cancel_at=(9, 1))
    assert b[1][-1] is None and seqs[1].finish_reason == "cancel" and seqs[1].block_table == []
    for i in (0, 2, 3, 4):
        assert [t for t, *_ in a[i]] == [t for t, *_ in b[i]] and b[i][-1][2] == "length"
    # the cancelled one stopped early in both, its tokens a prefix of the same answer
    ta, tb = [e[0] for e in a[1][:-1]], [e[0] for e in b[1][:-1]]
    assert ta[:len(tb)] == tb or tb[:len(ta)] == ta
    assert eng.blocks.n_used == 0
    eng.blocks.check()


def test_prefix_blocks_committed_by_chained_rows_are_hits_later(tiny):
    """A chained row's block is hashed only once its token is known: a later request that
    repeats a whole answer finds those blocks."""
    p = _prompts(1, 9, 10, seed=3)[0]
    kw = dict(n_ctx=128, max_seqs=4, n_blocks=64, block_size=4)
    res = []
    for be in _pair(tiny, **kw):
        first = be.generate_many([p], GREEDY, 15)[0]
        again = p + [e.token_id for e in first]
        before = be.stats["prefill_tokens"]
        second = be.generate_many([again + [7]], GREEDY, 4)[0]
        res.append(([e.token_id for e in first], [e.token_id for e in second], be.blocks.hits,
                    be.stats["prefill_tokens"] - before))
        be.blocks.check()
    assert res[0] == res[1]
    assert res[1][2] >= 20          # 9 + 15 = 24 tokens: the first 5 blocks (20) are hits


def test_rows_needing_the_host_run_synchronously_among_held_ones(tiny):
    """A row with a repetition penalty (sampled with its history on the host side) keeps its
    batch synchronous while it runs; the others' answers do not change."""
    prompts = _prompts(3, 5, 15, seed=6)
    pen = SamplingParams(temperature=0, repeat_penalty=1.3)
    reqs = [(prompts[0], GREEDY, 12, []), (prompts[1], pen, 5, []), (prompts[2], GREEDY, 12, [])]
    kw = dict(n_ctx=128, max_seqs=4, n_blocks=64, block_size=4)
    sync, eng = _pair(tiny, **kw)
    paths.reset()
    a, _ = _run(sync, reqs)
    b, _ = _run(eng, reqs)
    assert a == b
    assert paths.snapshot()["counts"].get("batch.async_chain", 0) > 0   # after the penalty row ended


def test_prefill_first_decodes_all_sequences_in_the_same_steps(tiny):
    """The benchmark's phases (Scheduler.prefill_first): no decode row until every prompt has its
    first token, then each step decodes every sequence; the tokens are the default schedule's."""
    prompts = _prompts(6, 20, 40, seed=8)
    kw = dict(n_ctx=128, max_seqs=8, n_blocks=64, block_size=4, token_budget=24, async_steps=True)
    want = BatchEngine(tiny, **kw).generate_many(prompts, GREEDY, 8)
    be = BatchEngine(tiny, **kw)
    be.scheduler.prefill_first = True
    seqs = [be.add(p, GREEDY, 8) for p in prompts]
    rows_per_step = []
    while be.has_work:
        before = be.stats["decode_rows"]
        be.step()
        if be.stats["decode_rows"] > before:
            assert all(s.n_generated >= 1 for s in seqs)       # decoding starts after every prefill
            rows_per_step.append(be.stats["decode_rows"] - before)
    assert rows_per_step == [6] * 7                             # 7 steps of all 6 sequences
    assert [s.tokens[s.n_prompt:] for s in seqs] == [[e.token_id for e in evs] for evs in want]
    assert be.warm_graphs() == 0                                # the CPU has no graphs
