"""Seeded sampling does not depend on the engine (issue 13: a request's result does not depend on
batching): on the CPU the same prompt, sampling settings and seed give the same token ids
through the single-user Engine (runtime/generate.py: one torch.Generator per request) and
through the BatchEngine -- alone, among sequences with other settings, through preemption and
through held (asynchronous) steps. The reference is Engine.generate, whose draws this file does
not compute itself."""

from __future__ import annotations

import pytest
import torch

from minfer.runtime.batch_engine import BatchEngine
from minfer.runtime.engine import Engine
from minfer.runtime.sampling import SamplingParams

N_NEW = 12

SETTINGS = {
    "defaults": dict(),                                               # temp 0.8, top-k 40, top-p 0.95, min-p 0.05
    "hot_unfiltered": dict(temperature=1.3, top_k=0, top_p=1.0, min_p=0.0),
    "narrow": dict(temperature=0.7, top_k=5, top_p=0.8, min_p=0.1),
    "top_p_only": dict(temperature=1.5, top_k=0, top_p=0.5, min_p=0.0),
    "penalties": dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.3,
                      presence_penalty=0.2, frequency_penalty=0.1, penalty_last_n=16),
}
SEEDS = [0, 1, 12345, 2**64 - 1, -(2**63)]


def _prompts(k, lo=5, hi=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 64, (int(torch.randint(lo, hi, (1,), generator=g)),), generator=g).tolist()
            for _ in range(k)]


def _single(model, prompt, params, n=N_NEW, procs=()):
    return [e.token_id for e in Engine(model, None, 128).generate(prompt, params, n, logits_processors=procs)]


def _bias(v):
    """A logits processor (like server/structured.py LogitBias): token v gets +3."""
    def proc(generated, logits):
        out = logits.clone()
        out[v] += 3.0
        return out
    return proc


@pytest.mark.parametrize("name", list(SETTINGS))
def test_alone_in_the_batch_engine_equals_the_single_engine(tiny, name):
    prompt = _prompts(1, seed=7)[0]
    for seed in SEEDS:
        p = SamplingParams(seed=seed, **SETTINGS[name])
        be = BatchEngine(tiny, n_ctx=128, max_seqs=1, n_blocks=64, block_size=4)
        got = [e.token_id for e in be.generate_many([prompt], p, N_NEW)[0]]
        assert got == _single(tiny, prompt, p), (name, seed)


@pytest.mark.parametrize("async_steps", [False, True])
def test_among_other_sequences_with_preemption_equals_the_single_engine(tiny, async_steps):
    """Ten sequences of mixed settings (greedy, seeded, penalties, a logits processor) in a pool
    too small for all of them: every one gives the single engine's tokens."""
    prompts = _prompts(10, 8, 30, seed=3)
    reqs = []
    for i, prompt in enumerate(prompts):
        name = list(SETTINGS)[i % len(SETTINGS)]
        p = SamplingParams(temperature=0) if i == 9 else SamplingParams(seed=(SEEDS + [7, 8, 9, 10])[i], **SETTINGS[name])
        reqs.append((prompt, p, [_bias(i)] if i in (2, 7) else []))   # stateless: reusable by both engines
    be = BatchEngine(tiny, n_ctx=128, max_seqs=6, n_blocks=1 + 40, block_size=4, token_budget=24,
                     prefix_cache=False, async_steps=async_steps)   # 160 positions for 10 x (8..30 + 12)
    seqs = [be.add(prompt, p, N_NEW, logits_processors=procs) for prompt, p, procs in reqs]
    toks = {s.seq_id: [] for s in seqs}
    while be.has_work:
        for s, ev in be.step():
            assert ev is not None, s.error
            toks[s.seq_id].append(ev.token_id)
    assert be.scheduler.n_preemptions > 0
    if async_steps:
        assert be.stats["held_steps"] > 0
    for s, (prompt, p, procs) in zip(seqs, reqs):
        assert toks[s.seq_id] == _single(tiny, prompt, p, procs=procs), p


def test_the_seed_matters(tiny):
    """The equality above is not that of a sampler that ignores the seed."""
    prompt = _prompts(1, seed=7)[0]
    runs = {tuple(_single(tiny, prompt, SamplingParams(seed=s, **SETTINGS["hot_unfiltered"]))) for s in SEEDS}
    assert len(runs) >= 4


def test_a_row_that_cannot_be_drawn_fails_alone(tiny):
    """A processor that masks every token: the single engine raises for that request; in a batch
    that request ends with its error ('cancel', seq.error) and the others finish as they would."""
    def mask_all(generated, logits):
        return torch.full_like(logits, float("-inf"))

    prompts = _prompts(3, seed=11)
    p = SamplingParams(seed=5, **SETTINGS["hot_unfiltered"])
    with pytest.raises(Exception, match="every token"):
        _single(tiny, prompts[1], p, procs=[mask_all])
    be = BatchEngine(tiny, n_ctx=128, max_seqs=4, n_blocks=64, block_size=4)
    seqs = [be.add(pr, p, N_NEW, logits_processors=[mask_all] if i == 1 else []) for i, pr in enumerate(prompts)]
    toks = {s.seq_id: [] for s in seqs}
    ends = {}
    while be.has_work:
        for s, ev in be.step():
            if ev is None:
                ends[s.seq_id] = s
            else:
                toks[s.seq_id].append(ev.token_id)
    assert list(ends) == [seqs[1].seq_id] and toks[seqs[1].seq_id] == []
    assert seqs[1].finish_reason == "cancel" and "every token" in str(seqs[1].error)
    for i in (0, 2):
        assert toks[seqs[i].seq_id] == _single(tiny, prompts[i], p)
    assert be.blocks.n_used == 0
