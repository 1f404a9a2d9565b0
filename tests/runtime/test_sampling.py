"""Sampling on toy logits: exact probabilities worked out by hand (llama.cpp semantics)."""

from __future__ import annotations

import math

import pytest
import torch

from minfer.runtime.sampling import (SamplingParams, apply_penalties, make_generator, probabilities,
                                     sample)

P = [0.4, 0.3, 0.2, 0.1]
LOGITS = torch.tensor([math.log(p) for p in P])


def probs(**kw):
    base = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    base.update(kw)
    return probabilities(LOGITS, SamplingParams(**base)).tolist()


def close(a, b):
    assert a == pytest.approx(b, abs=1e-6)  # logits are float32


def test_no_filter_is_softmax():
    close(probs(), P)


def test_top_k():
    close(probs(top_k=2), [4 / 7, 3 / 7, 0, 0])
    close(probs(top_k=1), [1, 0, 0, 0])
    close(probs(top_k=4), P)


def test_top_p_keeps_the_token_that_reaches_p():
    close(probs(top_p=0.35), [1, 0, 0, 0])            # 0.4 >= 0.35
    close(probs(top_p=0.6), [4 / 7, 3 / 7, 0, 0])     # 0.4 < 0.6 <= 0.7
    close(probs(top_p=0.75), [4 / 9, 3 / 9, 2 / 9, 0])  # 0.7 < 0.75 <= 0.9
    close(probs(top_p=0.95), P)


def test_min_p_is_relative_to_the_top_token():
    close(probs(min_p=0.3), [4 / 9, 3 / 9, 2 / 9, 0])  # threshold 0.12
    close(probs(min_p=0.6), [4 / 7, 3 / 7, 0, 0])      # threshold 0.24
    close(probs(min_p=1.0), [1, 0, 0, 0])


def test_temperature():
    # p_i^(1/T) / sum_j p_j^(1/T) with T = 2
    r = [math.sqrt(p) for p in P]
    close(probs(temperature=2.0), [x / sum(r) for x in r])
    r = [p ** 2 for p in P]  # T = 0.5
    close(probs(temperature=0.5), [x / sum(r) for x in r])


def test_filters_see_untempered_probabilities():
    # top-p 0.75 keeps 3 tokens of the T=1 distribution, then T=2 reshapes them
    r = [math.sqrt(p) for p in P[:3]]
    close(probs(temperature=2.0, top_p=0.75), [x / sum(r) for x in r] + [0])


def test_top_p_after_top_k_renormalizes():
    # after top-k 2: (4/7, 3/7); 4/7 = 0.571 >= 0.55 -> one token (on the raw 0.4 it would be two)
    close(probs(top_k=2, top_p=0.55), [1, 0, 0, 0])


def test_greedy():
    assert sample(torch.tensor([0.1, 3.0, -1.0, 2.9]), SamplingParams(temperature=0)) == 1
    close(probabilities(LOGITS, SamplingParams(temperature=0)).tolist(), [1, 0, 0, 0])


def test_penalties_llama_cpp_semantics():
    logits = torch.tensor([2.0, -1.0, 0.5, 0.0])
    out = apply_penalties(logits, [0, 0, 1, 3], repeat=2.0, presence=0.25, frequency=0.5)
    # tok0 (2 times, positive): 2/2 - 2*0.5 - 0.25; tok1 (negative): -1*2 - 0.5 - 0.25;
    # tok2 unseen; tok3 (logit 0 counts as <= 0): 0*2 - 0.5 - 0.25
    assert out.tolist() == pytest.approx([-0.25, -2.75, 0.5, -0.75])
    assert logits.tolist() == [2.0, -1.0, 0.5, 0.0]  # pure: input untouched


def test_penalty_window_and_greedy_after_penalty():
    logits = torch.tensor([2.0, 1.9, 0.0])
    p = SamplingParams(temperature=0, repeat_penalty=1.1, penalty_last_n=2)
    assert sample(logits, p, history=[0]) == 1          # 2/1.1 < 1.9
    assert sample(logits, p, history=[0, 2, 2]) == 0    # token 0 is outside the last 2
    p_all = SamplingParams(temperature=0, repeat_penalty=1.1, penalty_last_n=-1)
    assert sample(logits, p_all, history=[0, 2, 2]) == 1


def test_draws_follow_the_distribution():
    p = SamplingParams(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0)
    g = make_generator(123)
    n = 20000
    counts = [0] * 4
    for _ in range(n):
        counts[sample(LOGITS, p, g)] += 1
    assert counts[2] == counts[3] == 0
    assert counts[0] / n == pytest.approx(4 / 7, abs=0.015)


def test_same_seed_same_draws():
    p = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7)
    a = [sample(LOGITS, p, g) for g in [make_generator(7)] for _ in range(50)]
    g = make_generator(7)
    b = [sample(LOGITS, p, g) for _ in range(50)]
    g = make_generator(8)
    c = [sample(LOGITS, p, g) for _ in range(50)]
    assert a == b
    assert a != c


# ---- issue 15: parameters that would make NaN, and NaN logits -----------------------------

from minfer.errors import MinferError  # noqa: E402
from minfer.runtime.sampling import NonFiniteLogitsError  # noqa: E402


@pytest.mark.parametrize("field,value,expect", [
    ("temperature", float("nan"), "finite"), ("temperature", float("inf"), "finite"),
    ("temperature", -0.5, ">= 0"), ("repeat_penalty", 0.0, ">= 1e-06"), ("repeat_penalty", float("nan"), "finite"),
    ("repeat_penalty", -1.0, ">= 1e-06"), ("top_p", 2.0, "0..1"), ("top_p", float("nan"), "finite"),
    ("min_p", -0.1, "0..1"), ("top_k", -5, ">= -1"), ("top_k", 2.5, "integer"),
    ("presence_penalty", float("inf"), "finite"), ("frequency_penalty", float("nan"), "finite"),
    ("penalty_last_n", -2, ">= -1"), ("seed", 2**70, "64 bits"), ("seed", -(2**63) - 1, "64 bits"),
    ("seed", 1.5, "64 bits"), ("temperature", "hot", "finite"),
])
def test_invalid_parameters_are_one_line_errors(field, value, expect):
    with pytest.raises(MinferError) as e:
        SamplingParams(**{field: value})
    msg = str(e.value)
    assert field in msg and expect in msg and "\n" not in msg, msg


@pytest.mark.parametrize("kw", [dict(seed=2**64 - 1), dict(seed=-(2**63)), dict(top_k=-1), dict(top_p=0.0),
                                dict(temperature=0.0), dict(penalty_last_n=-1), dict(repeat_penalty=1e-3)])
def test_edge_values_are_accepted(kw):
    p = SamplingParams(**kw)
    assert sample(LOGITS, p, make_generator(p.seed)) in range(4)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("greedy", [True, False])
def test_non_finite_logits_raise_a_clear_error(bad, greedy):
    x = LOGITS.clone()
    x[2] = bad
    params = SamplingParams(temperature=0.0 if greedy else 1.0)
    with pytest.raises(NonFiniteLogitsError, match="NaN|infinite") as e:
        sample(x, params, make_generator(0))
    assert "model file is probably broken" in str(e.value)


def test_minus_inf_logits_are_masked_tokens_not_errors():
    x = torch.tensor([0.0, -math.inf, 1.0, -math.inf])
    assert sample(x, SamplingParams(temperature=0.0)) == 2
    assert sample(x, SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0), make_generator(1)) in (0, 2)
    with pytest.raises(MinferError, match="every token"):
        sample(torch.full((4,), -math.inf), SamplingParams(temperature=1.0))


def test_tiny_temperature_that_overflows_is_an_error_not_a_crash():
    # (a temperature under GREEDY_BELOW is greedy now: 2e-5 is sampled, and 1e35-sized logits overflow)
    with pytest.raises(MinferError, match="NaN probabilities"):
        sample(LOGITS * 1e35, SamplingParams(temperature=2e-5, top_k=0, top_p=1.0, min_p=0.0), make_generator(0))


def test_a_temperature_under_greedy_below_is_greedy_and_a_tiny_repeat_penalty_is_refused():
    # 1e-300 passed and divided the logits into inf: NaN probabilities after the model's load
    p = SamplingParams(temperature=1e-300, top_k=0, top_p=1.0, min_p=0.0)
    assert p.temperature == 0.0 and p.greedy
    assert sample(LOGITS, p) == int(LOGITS.argmax())
    assert not SamplingParams(temperature=1e-5).greedy
    with pytest.raises(MinferError, match="repeat_penalty"):
        SamplingParams(repeat_penalty=1e-300)
    assert SamplingParams(repeat_penalty=1e-6).repeat_penalty == 1e-6
