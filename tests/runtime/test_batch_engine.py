"""The batch engine on the CPU: batched sampling against the single-sequence sampler, and
whole generations through the paged cache against the single-user Engine.

Greedy outputs must not depend on batching: a prompt alone or among others, through chunked
prefill, prefix hits or preemption, gives the tokens the contiguous-cache Engine gives.
"""

from __future__ import annotations

import math

import pytest
import torch

from minfer.runtime.batch_sampling import sample_rows, token_logprobs, uniforms
from minfer.runtime.sampling import SamplingParams, probabilities


def test_uniforms_are_a_function_of_seed_position_and_token():
    seeds = torch.tensor([1, 2, 1, 2**40 + 5])
    pos = torch.tensor([7, 7, 7, 3])
    u = uniforms(seeds, pos, 1000)
    assert torch.equal(u[0], u[2])
    assert not torch.equal(u[0], u[1])
    assert torch.equal(uniforms(seeds[3:], pos[3:], 1000)[0], u[3])   # independent of the other rows
    assert float(u.min()) > 0 and float(u.max()) < 1
    big = uniforms(torch.arange(64), torch.arange(64) * 3, 5000)   # 320k draws: mean 0.5 +- 0.0005
    assert abs(float(big.mean()) - 0.5) < 0.003 and abs(float((big < 0.1).double().mean()) - 0.1) < 0.003


def test_greedy_rows_and_penalties_match_the_single_sampler():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 50, generator=g)
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0, repeat_penalty=1.5,
                                                            presence_penalty=0.5, frequency_penalty=0.2),
              SamplingParams(temperature=0)]
    hist = [[1, 2], [int(logits[1].argmax()), 3, 3], []]
    toks = sample_rows(logits, params, hist, [0, 0, 0], [5, 5, 5])
    for r in range(3):
        want = int(probabilities(logits[r], params[r], hist[r]).argmax())
        assert int(toks[r]) == want


@pytest.mark.parametrize("p", [SamplingParams(temperature=0.7, top_k=4, top_p=0.9, min_p=0.05),
                               SamplingParams(temperature=1.3, top_k=0, top_p=1.0, min_p=0.0),
                               SamplingParams(temperature=1.0, top_k=3, top_p=0.5, min_p=0.2)])
def test_draws_follow_the_single_samplers_distribution(p):
    """Many rows of the same logits with different seeds: the empirical frequencies are those of
    sampling.probabilities (the llama.cpp chain), and filtered tokens never appear."""
    g = torch.Generator().manual_seed(1)
    row = torch.randn(12, generator=g) * 2
    n = 6000
    logits = row.expand(n, -1).contiguous()
    toks = sample_rows(logits, [p] * n, [[]] * n, list(range(n)), [0] * n)
    freq = torch.bincount(toks, minlength=12).double() / n
    want = probabilities(row, p)
    assert set(torch.nonzero(freq).flatten().tolist()) <= set(torch.nonzero(want).flatten().tolist())
    assert float((freq - want).abs().max()) < 0.025
    # the same seeds and positions draw the same tokens again
    again = sample_rows(logits[:50], [p] * 50, [[]] * 50, list(range(50)), [0] * 50)
    assert torch.equal(again, toks[:50])


def test_token_logprobs():
    logits = torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]])
    lp, top = token_logprobs(logits, torch.tensor([2, 1]), [2, 0])
    ref = torch.log_softmax(logits, -1)
    assert math.isclose(lp[0], float(ref[0, 2]), rel_tol=1e-6) and math.isclose(lp[1], float(ref[1, 1]), rel_tol=1e-6)
    assert [i for i, _ in top[0]] == [2, 1] and top[1] == []
