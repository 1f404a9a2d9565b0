"""generate() with a device draw that launches the next step ahead (device_draw.DeviceDraw with
`feed`): the same tokens, logprobs and texts as one step at a time; the step launched after the
last consumed token is never added to the engine's tokens; nothing is launched after the last
allowed token. A fake engine computes each step's logits from (token, position), so a step fed
the wrong token or at the wrong position changes the answer."""

from __future__ import annotations

import pytest
import torch

from minfer.runtime.device_draw import DeviceDraw
from minfer.runtime.generate import generate
from minfer.runtime.sampling import SamplingParams

V = 97


def _logits(tok: int, pos: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(tok * 1009 + pos)
    return torch.randn(V, generator=g) * 2


class FakeEngine:
    def __init__(self, prompt):
        self.tokens = list(prompt)         # what the cache holds (the engine's `tokens`)
        self.fed = []                      # (token, position) of every step launched

    def step(self, draw):
        def step(tok):
            if draw is not None and draw.pending is not None:
                logits, draw.pending = draw.pending, None
                assert self.fed[-1] == (tok, len(self.tokens))     # launched from this very token
                self.tokens.append(tok)
                return logits
            self.fed.append((tok, len(self.tokens)))
            out = _logits(tok, len(self.tokens))
            self.tokens.append(tok)
            return out
        return step

    def feed(self, tok_dev):
        t = int(tok_dev.reshape(-1)[0])
        self.fed.append((t, len(self.tokens)))
        return _logits(t, len(self.tokens))


def _run(params, n, ahead, eog=(), top=0):
    prompt = [5, 6, 7]
    eng = FakeEngine(prompt)
    draw = DeviceDraw(params, top, eng.feed if ahead else None)
    evs = list(generate(_logits(7, 2), eng.step(draw), params, n, history=prompt, eog_ids=eog,
                        top_logprobs=top, draw=draw))
    return evs, eng, draw


@pytest.mark.parametrize("params", [SamplingParams(temperature=0), SamplingParams(seed=3),
                                    SamplingParams(temperature=1.3, top_k=0, top_p=0.9, min_p=0.0, seed=9)])
@pytest.mark.parametrize("top", [0, 2])
def test_ahead_gives_the_same_answer(params, top):
    a, ea, _ = _run(params, 20, ahead=False, top=top)
    b, eb, _ = _run(params, 20, ahead=True, top=top)
    assert [(e.token_id, e.logprob, e.top_logprobs, e.finish_reason) for e in a] == \
           [(e.token_id, e.logprob, e.top_logprobs, e.finish_reason) for e in b]
    assert ea.tokens == eb.tokens == [5, 6, 7] + [e.token_id for e in a][:-1]   # the last token is never fed
    assert eb.fed == ea.fed                        # no step launched after the last allowed token


def test_a_step_launched_ahead_of_the_end_of_turn_is_not_kept():
    p = SamplingParams(temperature=0)
    free, _, _ = _run(p, 12, ahead=False)
    eog = free[4].token_id                        # the 5th greedy token ends the turn
    first = next(i for i, e in enumerate(free) if e.token_id == eog)
    evs, eng, draw = _run(p, 12, ahead=True, eog=[eog])
    assert len(evs) == first + 1 and evs[-1].finish_reason == "stop"
    assert eng.tokens == [5, 6, 7] + [e.token_id for e in evs][:-1]     # the speculative step is not in it
    assert eng.fed[-1] == (eog, len(eng.tokens))                        # it was launched, from the last token
    assert draw.pending is not None                                      # and left unconsumed
