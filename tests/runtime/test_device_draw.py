"""The single engine's device draw (device_draw.DeviceDraw, generate()'s `draw`): on CUDA
generate() chooses the next token where the logits are and reads back only it. Its arithmetic
is the batch engine's vectorized draw, which runs on CPU tensors too, so it is checked here
against the host sampler's distribution and greedy choice."""

from __future__ import annotations

import math

import pytest
import torch

from minfer.errors import MinferError
from minfer.runtime.batch_sampling import draw_seed
from minfer.runtime.device_draw import DeviceDraw
from minfer.runtime.generate import generate
from minfer.runtime.sampling import NonFiniteLogitsError, SamplingParams, logprobs, probabilities


def _steps(n, v=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(v, generator=g) * 3 for _ in range(n + 1)]


def _run(steps, params, draw=None, top=0):
    it = iter(steps[1:])
    return list(generate(steps[0], lambda tok: next(it), params, len(steps) - 1, history=[1, 2, 3],
                         top_logprobs=top, draw=draw))


def test_greedy_device_draw_is_the_host_greedy_with_the_same_logprobs():
    steps = _steps(12)
    p = SamplingParams(temperature=0)
    host = _run(steps, p, top=3)
    dev = _run(steps, p, DeviceDraw(p, top_logprobs=3), top=3)
    assert [e.token_id for e in dev] == [e.token_id for e in host]
    for a, b in zip(dev, host):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-5)
        assert [t for t, _ in a.top_logprobs] == [t for t, _ in b.top_logprobs]


def test_logprob_without_top_is_the_models_own():
    steps = _steps(6, seed=3)
    p = SamplingParams(temperature=0.9, seed=5)
    for ev, logits in zip(_run(steps, p, DeviceDraw(p)), steps):
        assert ev.logprob == pytest.approx(logprobs(logits, ev.token_id)[0], abs=1e-5)
        assert ev.top_logprobs == []


def test_same_seed_same_tokens_other_seed_other_tokens():
    steps = _steps(24, v=256, seed=1)
    p = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=7)
    a = [e.token_id for e in _run(steps, p, DeviceDraw(p))]
    b = [e.token_id for e in _run(steps, p, DeviceDraw(p))]
    q = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=8)
    c = [e.token_id for e in _run(steps, q, DeviceDraw(q))]
    assert a == b and a != c


@pytest.mark.parametrize("kw", [dict(temperature=0.8), dict(temperature=1.0, top_k=3),
                                dict(temperature=0.7, top_p=0.8), dict(temperature=1.2, min_p=0.2)])
def test_draws_follow_the_host_samplers_distribution(kw):
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
    p = SamplingParams(seed=11, **{"top_k": 0, "top_p": 1.0, "min_p": 0.0, **kw})
    want = probabilities(logits, p)
    draw = DeviceDraw(p)
    n = 6000
    counts = torch.zeros(8)
    for pos in range(n):                       # the draw's counter is the history's length
        tok, _, _ = draw(logits, range(pos))
        counts[tok] += 1
    got = counts / n
    assert float((got - want.float()).abs().max()) < 0.025, (got, want)
    assert all(got[i] == 0 for i in range(8) if want[i] == 0)      # filtered tokens never drawn


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_logits_are_the_host_error(bad):
    logits = torch.zeros(16)
    logits[5] = bad
    for p in (SamplingParams(temperature=0), SamplingParams(seed=1)):
        with pytest.raises(NonFiniteLogitsError):
            DeviceDraw(p)(logits, [1])


def test_all_masked_logits_are_an_error():
    with pytest.raises(MinferError, match="-inf"):
        DeviceDraw(SamplingParams(temperature=0))(torch.full((16,), -math.inf), [1])


def test_a_device_draw_takes_no_logits_processors():
    steps = _steps(2)
    p = SamplingParams(temperature=0)
    with pytest.raises(MinferError, match="logits processors"):
        list(generate(steps[0], lambda t: steps[1], p, 2, draw=DeviceDraw(p), logits_processors=[lambda g, x: x]))


def test_draw_seed_keeps_62_bits_and_draws_one_when_none():
    assert draw_seed(5) == 5 and draw_seed(2**63 + 9) == 9
    assert draw_seed(None) != draw_seed(None)
