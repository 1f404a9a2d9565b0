"""ops/cuda/draw.py's two kernels in Triton's interpreter against the torch draw they replace
(batch_sampling.sample_rows and chosen_logprobs, on the CPU): the same token, the same logprob to
float32 rounding, the NaN / +inf flags; and which requests the fused draw takes."""

from __future__ import annotations

import math

import pytest
import torch

from minfer.runtime.batch_sampling import _row_keys, chosen_logprobs, draw_seed, sample_rows
from minfer.runtime.sampling import SamplingParams


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _fused(p, x, seed, pos, ch=256):
    from minfer.ops.cuda import draw

    out, tok = draw.FusedDraw(p, "cpu", ch=ch)(x, *_row_keys(seed, pos))
    return out, tok


def _torch(p, x, seed, pos):
    ref = sample_rows(x[None], [p], [[]], [seed], [pos])
    return int(ref[0]), float(chosen_logprobs(x[None], ref)[0])


CASES = [
    SamplingParams(temperature=0),
    SamplingParams(seed=5),                                                   # the defaults: top-k 40
    SamplingParams(seed=6, top_k=100, top_p=0.5, min_p=0.0, temperature=1.3),
    SamplingParams(seed=7, top_k=1),
    SamplingParams(seed=8, top_k=128, top_p=1.0, min_p=0.3, temperature=0.2),
]


@pytest.mark.parametrize("p", CASES, ids=["greedy", "default", "top_p", "top_k1", "min_p"])
def test_the_same_draw_as_the_torch_path(p):
    g = torch.Generator().manual_seed(1)
    for trial, v in enumerate((1000, 777)):
        x = torch.randn(v, generator=g) * 3
        if trial == 1:
            x[::5] = x[3]               # ties everywhere: the order keys break them by id
        seed, pos = draw_seed(p.seed if p.seed is not None else 0), 40 + trial
        out, tok = _fused(p, x, seed, pos)
        t, lp = _torch(p, x, seed, pos)
        assert int(out[0]) == t == int(tok[0])
        assert abs(float(out[1]) - lp) < 1e-5
        assert out[2:].tolist() == [0.0, 0.0]


def test_a_vocabulary_smaller_than_top_k():
    p = SamplingParams(seed=3, top_k=40, top_p=1.0, min_p=0.0)
    x = torch.randn(30, generator=torch.Generator().manual_seed(2))
    out, _ = _fused(p, x, draw_seed(3), 9)
    assert int(out[0]) == _torch(p, x, draw_seed(3), 9)[0]


@pytest.mark.parametrize("bad,flag", [(math.nan, 2), (math.inf, 3)])
def test_non_finite_logits_raise_their_flag(bad, flag):
    x = torch.randn(600, generator=torch.Generator().manual_seed(4))
    x[517] = bad
    for p in (SamplingParams(temperature=0), SamplingParams(seed=1)):
        out, _ = _fused(p, x, 1, 3)
        assert out[flag] == 1.0 and out[5 - flag] == 0.0


def test_all_minus_inf_gives_no_finite_logprob():
    x = torch.full((600,), -math.inf)
    out, _ = _fused(SamplingParams(temperature=0), x, 1, 3)
    assert not math.isfinite(float(out[1]))


def test_which_requests_it_takes():
    from minfer.ops.cuda import draw

    assert draw.applies(SamplingParams(), 0) is None
    assert draw.applies(SamplingParams(temperature=0, top_k=0), 0) is None          # greedy: top_k unused
    assert "top_logprobs" in draw.applies(SamplingParams(), 2)
    assert "top_k 0" in draw.applies(SamplingParams(top_k=0), 0)
    assert "top_k 129" in draw.applies(SamplingParams(top_k=129), 0)
    assert "penalties" in draw.applies(SamplingParams(repeat_penalty=1.1), 0)
