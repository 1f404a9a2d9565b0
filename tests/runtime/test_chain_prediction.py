"""Scheduler.decode_only_next, the held engine's prediction of the synchronous step (runtime/
batch_engine.py `_chain`), against what schedule() really does.

The model is simulated (as in test_scheduler.py): random requests over a few token values (so
prompts and answers share blocks and hit the prefix cache), random lengths, ends and cancels
(cached blocks in varied LRU orders), tight pools (preemption, evictions). Whenever a step is
decode-only (its rows sampled on the device, in the held engine; other running sequences are
prefills stalled for blocks) -- the point where the held engine decides whether to chain -- the
prediction is checked on two copies of the whole state:
- synchronous: the step's tokens appended, the length ends finished, then schedule();
- held: the rows grown now (as _chain does), then the tokens appended, the ends finished, and
  the waiting sequence's failed admission repeated (touch_prefix) when the prediction names it.
When the prediction says "chain", the synchronous step must be exactly those decode rows (no
admission, no prefill chunk, no preemption), and both copies must end with the same pool: the same free blocks in
the same order, the same cached prefixes in the same LRU order, the same block tables. A "no"
may be conservative; the test counts how often it was, and checks that "chain" was said in each
case the prediction has a branch for (a request waiting for blocks, with a cached prefix that
takes every free block, with evictions, beside a stalled prefill; and with blocks freed by
length ends).
"""

from __future__ import annotations

import copy
import random

from minfer.runtime.block_manager import BlockManager
from minfer.runtime.sampling import SamplingParams
from minfer.runtime.scheduler import Scheduler
from minfer.runtime.sequence import Sequence, SeqStatus

N_SIMS = 300


def _pool(sch: Scheduler) -> tuple:
    bm = sch.blocks
    tables = sorted((s.seq_id, tuple(s.block_table)) for s in [*sch.running, *sch.waiting])
    return list(bm._free), list(bm._cached), dict(bm.by_hash), list(bm.ref), tables


def _check_point(sch: Scheduler, held: list[Sequence], g: random.Random, seen: dict) -> bool | None:
    """sch: a decode-only step of the sequences `held` was just launched (their n_computed
    counted, their tokens not yet sampled)."""
    bm = sch.blocks
    rows = [s for s in held if s.n_generated + 1 < s.max_new_tokens]
    if not rows:
        return None
    ending = [s for s in held if s.n_generated + 1 >= s.max_new_tokens]
    grow = [s for s in rows if s.n_computed >= len(s.block_table) * bm.block_size]
    drop = bm.releases(ending)
    freed, n_free, n_fresh = bm.n_released(drop), bm.n_free, bm.n_fresh
    stalled = [s for s in sch.running if s not in rows and s not in ending]
    ok, touch = sch.decode_only_next(rows, ending, len(grow))
    assert (ok, touch) == sch.decode_only_next(rows, ending, len(grow))   # it changes nothing
    toks = {s.seq_id: g.randrange(3) for s in [*rows, *ending]}

    sync = copy.deepcopy(sch)
    by_id = {s.seq_id: s for s in sync.running}
    for s in [*rows, *ending]:
        by_id[s.seq_id].tokens.append(toks[s.seq_id])
        sync.blocks.commit(by_id[s.seq_id])
    for s in ending:
        sync.finish(by_id[s.seq_id], "length")
    pre = sync.n_preemptions
    step = sync.schedule()
    decode_only = (sync.n_preemptions == pre
                   and [(it.seq.seq_id, it.is_decode) for it in step.items] == [(s.seq_id, True) for s in rows])
    if not ok:
        seen["no"] += 1
        seen["no_but_decode_only"] += decode_only
        return False
    assert decode_only, (ok, touch, [(it.seq.seq_id, it.n) for it in step.items])

    held = copy.deepcopy(sch)
    by_id = {s.seq_id: s for s in held.running}
    for s in rows:
        hs = by_id[s.seq_id]
        if hs.n_computed >= len(hs.block_table) * held.blocks.block_size:
            held.blocks.grow(hs, hs.n_computed + 1)
    for s in [*rows, *ending]:
        by_id[s.seq_id].tokens.append(toks[s.seq_id])
        held.blocks.commit(by_id[s.seq_id])
    for s in ending:
        held.finish(by_id[s.seq_id], "length")
    if touch is not None:
        assert held.waiting[0].seq_id == touch.seq_id
        held.blocks.touch_prefix(held.waiting[0])
    held.blocks.check()
    assert _pool(held) == _pool(sync)

    waiting = bool(sch.waiting) and len(rows) + len(stalled) < sch.max_seqs
    seen["yes"] += 1
    seen["yes_waiting"] += waiting
    seen["yes_touch"] += touch is not None
    seen["yes_waiting_evicts"] += waiting and len(grow) > n_fresh
    seen["yes_freed"] += freed > 0
    seen["yes_waiting_free_blocks"] += waiting and n_free - len(grow) + freed > 0
    seen["yes_stalled"] += bool(stalled)
    return True


def _simulate(seed: int, seen: dict) -> None:
    g = random.Random(seed)
    bs = g.choice([2, 4, 8])
    max_seqs = g.randint(1, 6)
    sch = Scheduler(BlockManager(g.randint(4, 16), bs, prefix_cache=g.random() < 0.85), max_seqs,
                    g.choice([max_seqs, g.randint(max_seqs, 24), 256]))
    sch.prefill_first = g.random() < 0.25
    bases = [[g.randrange(3) for _ in range(g.randint(2, 20))] for _ in range(3)]
    params = SamplingParams(temperature=0, seed=1)
    for _call in range(g.randint(20, 80)):
        for _ in range(g.choice([0, 0, 0, 1, 1, 2])):
            base = g.choice(bases)
            prompt = base[:g.randint(1, len(base))] + [g.randrange(3) for _ in range(g.randint(0, 6))]
            prompt = prompt[:max(1, min(len(prompt), sch.blocks.capacity_tokens - 1))]
            room = sch.blocks.capacity_tokens - len(prompt) + 1
            sch.add(Sequence(prompt, params, g.randint(1, min(12, room))))
        if g.random() < 0.08 and (sch.running or sch.waiting):      # a cancel or a stop
            victim = g.choice([*sch.running, *sch.waiting])
            sch.finish(victim, "cancel")
        if not sch.has_work:
            continue
        step = sch.schedule()
        for it in step.items:
            it.seq.n_computed += it.n
            sch.blocks.commit(it.seq)
        if step.items and step.n_decode == len(step.items) and all(it.sample for it in step.items):
            _check_point(sch, [it.seq for it in step.items], g, seen)
        for it in step.items:
            s = it.seq
            if it.sample and s.status is SeqStatus.RUNNING:
                s.tokens.append(g.randrange(3))
                sch.blocks.commit(s)
                if s.n_generated >= s.max_new_tokens:
                    sch.finish(s, "length")
        sch.blocks.check()


def test_chain_prediction_matches_the_synchronous_schedule():
    seen = dict.fromkeys(["yes", "no", "no_but_decode_only", "yes_waiting", "yes_touch", "yes_waiting_evicts",
                          "yes_freed", "yes_waiting_free_blocks", "yes_stalled"], 0)
    for seed in range(N_SIMS):
        try:
            _simulate(seed, seen)
        except AssertionError as e:
            raise AssertionError(f"simulation {seed}: {e}") from e
    print(seen)
    assert all(v > 0 for k, v in seen.items() if k != "no_but_decode_only"), seen


# ---- hand-built pools: the branches random runs rarely reach --------------------------------
# A failed admission leaves the head's cached prefix in one LRU order (deepest block first out),
# and every schedule() that has a free slot makes one, so random runs almost never reach a
# decision with that prefix in another order. These pools are built with BlockManager calls.

A, B = [0, 1], [2, 3]          # two blocks of 2 tokens: the waiting request's cached prefix


def _shallow_first_pool(n_computed: int) -> Scheduler:
    """Cached blocks X1 (tokens A) then X2 (A, B): the shallow one least recently used, as when
    a sequence holding only X1 ended before one that holds X2 over its own copy of A. One
    running sequence holds every other block and decodes (its held step launched,
    n_computed positions counted); the request A + B + [2] waits."""
    bm = BlockManager(1 + 5, 2)
    sch = Scheduler(bm, max_seqs=4, token_budget=64)
    q1, q2 = Sequence(A + [2], None, 4), Sequence(A + B + [2], None, 4)
    for q, n in ((q1, 2), (q2, 4)):
        bm.grow(q, n)
        q.n_computed = n
        bm.commit(q)             # q2's copy of A is not registered: q1's X1 came first
    x1, x2 = q1.block_table[0], q2.block_table[1]
    bm.free(q1)
    bm.free(q2)
    assert list(bm._cached) == [x1, x2] and bm.n_fresh == 3
    r = Sequence([1] * (n_computed - 1), None, 10)
    r.tokens.append(2)           # its held step fed this token
    bm.grow(r, 6)                # every fresh block
    r.n_computed = n_computed
    bm.commit(r)
    r.status = SeqStatus.RUNNING
    sch.running.append(r)
    sch.add(Sequence(A + B + [2], None, 4))
    return sch


def _seen() -> dict:
    return dict.fromkeys(["yes", "no", "no_but_decode_only", "yes_waiting", "yes_touch", "yes_waiting_evicts",
                          "yes_freed", "yes_waiting_free_blocks", "yes_stalled"], 0)


def test_a_failed_admission_is_repeated_after_a_chained_step():
    """Both free blocks are the waiting request's prefix: no admission, so chain; the
    synchronous step's failed attempt turns their LRU order around, and the held engine must
    repeat it (touch_prefix) or a later eviction takes a different block."""
    sch = _shallow_first_pool(5)                    # its next position (5) is in its last block
    seen = _seen()
    assert _check_point(sch, list(sch.running), random.Random(0), seen) is True
    assert seen["yes_touch"] == 1


def test_an_eviction_before_the_admission_is_predicted():
    """The decode row needs a block and none is fresh: growing evicts X1 (least recently used),
    so the waiting request's prefix match stops at once and X2 is a free block for it: the
    synchronous step admits it. The prediction must see the eviction and not chain."""
    sch = _shallow_first_pool(6)                    # position 6 needs a new block
    seen = _seen()
    assert _check_point(sch, list(sch.running), random.Random(0), seen) is False
    assert seen["no_but_decode_only"] == 0


def test_blocks_freed_by_a_length_end_can_be_the_waiting_prefix():
    """The sequence that ends on length in the held step holds X1, X2 (its whole text A + B,
    both blocks full) and nothing else; the waiting request's prompt starts with A + B. Once it
    ends, its two blocks are the only free ones and the request's prefix takes both: no
    admission, so chain (and its attempt repeated)."""
    bm = BlockManager(1 + 5, 2)
    sch = Scheduler(bm, max_seqs=4, token_budget=64)
    ending = Sequence(A + [2], None, 2)
    ending.tokens.append(3)                          # its first token; the held step fed it
    r = Sequence([1] * 4, None, 10)
    r.tokens.append(2)
    for s, n, n_pos in ((ending, 4, 4), (r, 5, 6)):   # r: 3 blocks, its next position (5) in the last
        bm.grow(s, n_pos)
        s.n_computed = n
        bm.commit(s)
        s.status = SeqStatus.RUNNING
        sch.running.append(s)
    assert bm.n_free == 0
    sch.add(Sequence(A + B + [2], None, 4))
    seen = _seen()
    assert _check_point(sch, list(sch.running), random.Random(0), seen) is True
    assert seen["yes_freed"] == 1 and seen["yes_touch"] == 1


def test_a_running_sequence_the_next_step_would_feed_stops_the_chain():
    """Beside the decode row, a running sequence that is not a row and would get tokens in the
    next step: a prefill with room left in its own blocks (no free block needed), or one whose
    recompute is down to its last token (a decode row: it needs a block, so a preemption). No
    free block; the answer is no."""
    for n_prompt, n_gen, n_done in ((5, 0, 3), (4, 1, 4)):
        bm = BlockManager(1 + 4, 2)
        sch = Scheduler(bm, max_seqs=4, token_budget=64)
        r = Sequence([1, 1], None, 10)
        r.tokens.append(2)
        other = Sequence([0] * n_prompt, None, 10)
        other.tokens += [2] * n_gen                  # 5 tokens, 3 or 4 of them computed
        for s, n in ((r, 3), (other, n_done)):
            bm.grow(s, 4)
            s.n_computed = n
            bm.commit(s)
            s.status = SeqStatus.RUNNING
            sch.running.append(s)
        assert bm.n_free == 0
        seen = _seen()
        assert _check_point(sch, [r], random.Random(0), seen) is False
        assert seen["no_but_decode_only"] == 0
