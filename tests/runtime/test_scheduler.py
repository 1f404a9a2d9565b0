"""Scheduler: admission under a block budget and a token budget, chunked prefill mixed with
decode, preemption of the newest when blocks run out, freeing on finish/cancel.

The model is simulated: after each step every scheduled chunk counts as computed and a
sampling row appends a token (what BatchEngine.step does around the forward)."""

from __future__ import annotations

import random

import pytest

from minfer.runtime.block_manager import BlockManager
from minfer.runtime.sampling import SamplingParams
from minfer.runtime.scheduler import Scheduler
from minfer.runtime.sequence import Sequence, SeqStatus


def _seq(n_prompt, start=0, max_new=100):
    return Sequence(list(range(start, start + n_prompt)), SamplingParams(temperature=0), max_new)


def _advance(sched, step, tok=7):
    for it in step.items:
        it.seq.n_computed += it.n
        sched.blocks.commit(it.seq)
        if it.sample:
            it.seq.tokens.append(tok)


def test_admission_stops_when_blocks_run_out():
    bm = BlockManager(1 + 6, 4)             # 6 usable blocks = 24 positions
    sch = Scheduler(bm, max_seqs=8, token_budget=64)
    seqs = [_seq(10, 100 * i) for i in range(4)]   # 3 blocks each
    for s in seqs:
        sch.add(s)
    step = sch.schedule()
    assert [it.seq for it in step.items] == seqs[:2]
    assert all(it.n == 10 and it.sample for it in step.items)
    assert seqs[2].status is SeqStatus.WAITING and len(sch.waiting) == 2
    assert bm.n_free == 0


def test_token_budget_chunks_a_long_prompt_and_decode_goes_first():
    bm = BlockManager(1 + 64, 4)
    sch = Scheduler(bm, max_seqs=4, token_budget=8)
    a = _seq(3)
    sch.add(a)
    _advance(sch, sch.schedule())           # a prefilled, one token sampled
    b = _seq(20, 500)
    sch.add(b)
    sizes = []
    while b.n_generated == 0:
        step = sch.schedule()
        assert step.items[0].seq is a and step.items[0].n == 1 and step.items[0].is_decode
        assert step.n_tokens <= 8
        sizes.append(step.items[1].n)
        _advance(sch, step)
    assert sizes == [7, 7, 6]               # 20 prompt tokens in budget-sized chunks beside a's decode


def test_max_seqs_limits_running():
    bm = BlockManager(1 + 64, 4)
    sch = Scheduler(bm, max_seqs=2, token_budget=64)
    for i in range(3):
        sch.add(_seq(2, 10 * i))
    step = sch.schedule()
    assert len(step.items) == 2 and len(sch.waiting) == 1


def test_preempts_the_newest_when_blocks_run_out_and_resumes_it():
    bm = BlockManager(1 + 4, 2)             # 8 positions
    sch = Scheduler(bm, max_seqs=4, token_budget=16)
    a, b = _seq(3, 0), _seq(3, 100)
    sch.add(a)
    sch.add(b)
    _advance(sch, sch.schedule(), tok=1)    # both prefilled: 2 blocks each, 4 tokens each
    assert bm.n_free == 0
    step = sch.schedule()                   # both decode at position 3 (still in block 2)
    assert [it.seq for it in step.items] == [a, b]
    _advance(sch, step, tok=1)
    step = sch.schedule()                   # a needs a 3rd block at position 4: b is preempted
    assert [it.seq for it in step.items] == [a]
    assert b.status is SeqStatus.WAITING and b.n_computed == 0 and b.block_table == []
    assert sch.n_preemptions == 1 and sch.waiting[0] is b
    _advance(sch, step, tok=2)
    sch.finish(a, "stop")
    step = sch.schedule()                   # b comes back: its 5 tokens recomputed (none cached:
    assert step.items[0].seq is b           # a's growth evicted b's hashed blocks)
    assert step.items[0].start == b.n_cached and step.items[0].n == 5 - b.n_cached and step.items[0].sample
    bm.check()


@pytest.mark.parametrize("seed", range(4))
def test_random_load_always_progresses_and_frees_everything(seed):
    """Many sequences through a small pool (preemptions certain): every step schedules work,
    block accounting stays consistent, every sequence generates all its tokens, no block leaks."""
    rng = random.Random(seed)
    bm = BlockManager(1 + 12, 4)            # 48 positions
    sch = Scheduler(bm, max_seqs=5, token_budget=12)
    seqs = []
    for i in range(12):
        n = rng.randint(1, 30)
        seqs.append(_seq(n, 1000 * i, max_new=rng.randint(1, 48 - n + 1)))
        sch.add(seqs[-1])
    steps = 0
    while sch.has_work:
        step = sch.schedule()
        assert step.items, "the scheduler stalled"
        assert step.n_tokens <= 12
        _advance(sch, step)
        for it in step.items:
            if it.sample and it.seq.n_generated >= it.seq.max_new_tokens:
                sch.finish(it.seq, "length")
        bm.check()
        steps += 1
        assert steps < 10_000
    assert all(s.n_generated == s.max_new_tokens for s in seqs)
    assert bm.n_used == 0 and sch.n_preemptions > 0


def test_finish_and_cancel_free_blocks_at_once():
    bm = BlockManager(1 + 16, 4)
    sch = Scheduler(bm, max_seqs=4, token_budget=64)
    a, b, c = _seq(9), _seq(5, 100), _seq(5, 200)
    for s in (a, b, c):
        sch.add(s)
    _advance(sch, sch.schedule())
    used = bm.n_used
    sch.finish(b, "cancel")
    assert b.status is SeqStatus.FINISHED and b.finish_reason == "cancel" and b.block_table == []
    assert bm.n_used == used - 2
    w = _seq(4, 300)
    sch.add(w)
    sch.finish(w, "cancel")                 # cancelled while waiting
    assert w not in sch.waiting
    sch.finish(a, "stop")
    sch.finish(c, "length")
    assert bm.n_used == 0 and not sch.has_work
    bm.check()


def test_prefix_hit_on_admission_skips_the_cached_tokens():
    bm = BlockManager(1 + 32, 4)
    sch = Scheduler(bm, max_seqs=4, token_budget=64)
    a = _seq(13)
    sch.add(a)
    _advance(sch, sch.schedule())
    sch.finish(a, "stop")
    b = Sequence(list(range(13)) + [77, 78], SamplingParams(temperature=0), 4)
    sch.add(b)
    step = sch.schedule()
    assert b.n_cached == 12 and step.items[0].start == 12 and step.items[0].n == 3
    assert bm.hits == 12 and bm.lookups == 13 + 15
