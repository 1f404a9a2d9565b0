"""Held batch steps under KV-memory pressure (runtime/batch_engine.py `_chain`,
Scheduler.decode_only_next). A request that waits while a slot is free no longer turns held
steps off by itself: the held engine chains the next decode step when the synchronous engine
would admit nothing in it (no block free once the held step's length ends free theirs and the
request's cached prefix is attached), nor give a chunk to a running prefill stalled for blocks
(a preempted sequence's recompute). The reference is the synchronous engine
(async_steps=False): with no stop and no cancel the held engine must launch the same batches in
the same order (admissions in the same step, the same prefix hits) and give the same tokens,
log-probabilities and kept logits bit for bit. The counts show that chained steps now run while
a request waits for blocks; the engine before this change never chained then
(`chained_waiting` was 0 by construction).
"""

from __future__ import annotations

import random

import pytest

from minfer.runtime.sampling import SamplingParams
from runtime.batch_helpers import random_prompt
from runtime.test_batch_fuzz import VOCAB, _compare, _drive, _layouts, _Logged, _tokens

N_SEEDS = 48
CHUNK = 16
GREEDY = SamplingParams(temperature=0)


def _pressure_scenario(seed: int) -> dict:
    """Requests that do not all fit in the pool: no stop string, no end-of-turn, no cancel, so
    the two engines must launch the same batches. Mostly rows the device samples (greedy,
    seeded sampling); a few penalty rows keep some steps synchronous."""
    g = random.Random(seed)
    bs = g.choice([4, 8, 16])
    max_seqs = g.randint(2, 8)
    reqs = []
    for _ in range(g.randint(4, 12)):
        n = g.randint(2, 40)
        prompt = random_prompt(g, reqs, n, 0.4, VOCAB)       # some share an earlier prompt's prefix
        kind = g.choice(["greedy"] * 9 + ["sample"] * 9 + ["penalty"] * 2)
        if kind == "greedy":
            sp = GREEDY
        elif kind == "sample":
            sp = SamplingParams(temperature=g.choice([0.7, 1.0]), top_k=g.choice([0, 10]), top_p=g.choice([1.0, 0.9]),
                                seed=g.randrange(1 << 30))
        else:
            sp = SamplingParams(temperature=0, repeat_penalty=1.3)
        reqs.append(dict(prompt=prompt, params=sp, max_new=g.randint(4, 40),
                         arrival=0 if g.random() < 0.5 else g.randint(0, 20), stop=[], top=0, procs=[],
                         kind=kind, ignore_eos=False))
    need = -(-max(len(r["prompt"]) + r["max_new"] for r in reqs) // bs)
    n_blocks = 1 + need + g.randint(0, need)    # the longest request fits; a few together do not
    return dict(reqs=reqs, cancel={}, eog=None, keep_logits=g.random() < 0.2, prefill_first=g.random() < 0.2,
                kw=dict(n_ctx=128, max_seqs=max_seqs, n_blocks=n_blocks, block_size=bs,
                        token_budget=g.choice([g.randint(max_seqs, 32), 512]), prefix_cache=g.random() < 0.7))


def _pool(bm) -> tuple:
    return list(bm._free), list(bm._cached), dict(bm.by_hash), list(bm.hash_of)


def _run_pair(tiny, sc: dict) -> tuple:
    """Both engines over one scenario; (sync, held, events a, b, sequences sa, sb)."""
    sync = _Logged(tiny, None, async_steps=False, **sc["kw"])
    held = _Logged(tiny, None, async_steps=True, **sc["kw"])
    a, sa, ka = _drive(sync, sc)
    b, sb, kb = _drive(held, sc)
    assert sync.chained_rows == 0 and sync.stats["held_steps"] == 0
    assert _layouts(sync, sa) == _layouts(held, sb)     # the same batches, in the same order
    _compare(sc, a, b, sa, sb, ka, kb, exact=True)
    for be in (sync, held):
        assert be.blocks.n_used == 0 and not be.has_work and not be.scheduler.running
        be.blocks.check()
    assert sync.blocks.hits == held.blocks.hits and sync.scheduler.n_preemptions == held.scheduler.n_preemptions
    # and the pools end the same: which blocks are free in which order, the cached prefixes in
    # the same LRU order (what later evictions and prefix hits depend on)
    assert _pool(sync.blocks) == _pool(held.blocks)
    return sync, held, a, b, sa, sb


@pytest.mark.parametrize("chunk", range(N_SEEDS // CHUNK))
def test_held_steps_under_kv_pressure_equal_synchronous_steps(tiny, chunk):
    seen = {"steps": 0, "chained_steps": 0, "held_steps": 0, "chained_waiting": 0, "preemptions": 0,
            "prefix_hits": 0}
    for seed in range(5000 + chunk * CHUNK, 5000 + (chunk + 1) * CHUNK):
        sc = _pressure_scenario(seed)
        try:
            held = _run_pair(tiny, sc)[1]
        except AssertionError as e:
            raise AssertionError(f"pressure seed {seed}: {e}") from e
        for k in ("steps", "chained_steps", "held_steps"):
            seen[k] += held.stats[k]
        seen["chained_waiting"] += held.chained_waiting
        seen["preemptions"] += held.scheduler.n_preemptions
        seen["prefix_hits"] += held.blocks.hits
    print(chunk, seen)
    # the chunk exercised what it is for: preemption, prefix hits, and steps chained while a
    # request waited for blocks (never, before the admission was predicted)
    assert all(v > 0 for v in seen.values()), seen


def _plain(prompt, max_new, arrival=0, params=GREEDY):
    return dict(prompt=prompt, params=params, max_new=max_new, arrival=arrival, stop=[], top=0, procs=[],
                kind="greedy", ignore_eos=False)


def test_a_request_waiting_for_blocks_does_not_stop_held_steps(tiny):
    """One sequence holds the whole pool (2 blocks of 16; its 17-token prompt leaves room for 15
    tokens); a second request waits for a block from call 0. The synchronous engine cannot admit
    it until the first ends, so every decode step but the first after the prefill is chained;
    the second is admitted in the same step as by the synchronous engine."""
    g = random.Random(31)
    reqs = [_plain([g.randrange(VOCAB) for _ in range(17)], 12), _plain([g.randrange(VOCAB) for _ in range(20)], 5)]
    sc = dict(reqs=reqs, cancel={}, eog=None, keep_logits=True, prefill_first=False,
              kw=dict(n_ctx=64, max_seqs=4, n_blocks=1 + 2, block_size=16))
    _sync, held, _a, b, _sa, sb = _run_pair(tiny, sc)
    # request 0: a prefill step (its 1st token), then 11 decode steps; the first is held, the
    # 10 others are chained while request 1 waits. Request 1 then decodes 4 steps: 3 chained.
    assert held.chained_waiting == 10 and held.stats["chained_steps"] == 10 + 3, held.stats
    admit = [k for k, lay in enumerate(_layouts(held, sb)) if any(r == 1 and start == 0 for r, start, *_ in lay)]
    assert admit == [12]                # in the step after request 0's last (step 11), as the synchronous engine
    assert [len(_tokens(b[i])) for i in (0, 1)] == [12, 5]


def test_a_cached_prefix_that_takes_every_free_block_keeps_held_steps(tiny):
    """The pool has free blocks, but they are the cached prefix of the waiting request (left by a
    finished one): attaching it leaves no block for the rest of its prompt, so the synchronous
    engine admits nothing while the running sequence decodes, and the held engine chains. Its
    prefix blocks are touched by each failed admission (the most recently used), in both."""
    g = random.Random(32)
    p = [g.randrange(VOCAB) for _ in range(16)]
    reqs = [_plain(p, 1),                                             # 2 full blocks of 8, then cached
            _plain([g.randrange(VOCAB) for _ in range(9)], 7),        # holds the other 2, decodes in them
            _plain(p + [g.randrange(VOCAB) for _ in range(5)], 3, arrival=1)]   # matches both cached blocks
    sc = dict(reqs=reqs, cancel={}, eog=None, keep_logits=False, prefill_first=False,
              kw=dict(n_ctx=64, max_seqs=4, n_blocks=1 + 4, block_size=8))
    sync, held, *_ = _run_pair(tiny, sc)
    # request 1's decode steps 2..6 are chained while request 2 waits (step 1 held)
    assert held.chained_waiting == 5, held.stats
    assert held.blocks.hits >= 16 and held.blocks.hits == sync.blocks.hits   # request 2 found the prefix
