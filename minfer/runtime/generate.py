"""Token generation as a Python generator: sample, stream text, stop.

The CLI, the server and the benchmarks only consume the GenEvents yielded here.
Stop strings: text that could still become a stop string is held back until it either
completes one (then generation ends and the stop string is never emitted) or diverges
(then it is released). EOS/end-of-turn tokens end generation and are not rendered.

Logits processors (e.g. a grammar's token mask, minfer.server.structured) are called on each
step's logits before sampling: `proc(generated, logits) -> logits`, where `generated` is the
list of tokens this generation has produced so far (not the prompt). A processor keeps its own
state (how many of `generated` it has seen), so a batched caller can call it per row the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Protocol, Sequence

import torch

from minfer.runtime.sampling import SamplingParams, logprobs, make_generator, sample


@dataclass
class GenEvent:
    token_id: int
    text: str                      # new text to show after this token ('' while held back)
    logprob: float                 # the model's log-probability of token_id
    top_logprobs: list = field(default_factory=list)  # [(id, logprob)] when asked for
    finish_reason: str | None = None  # None while running; 'stop' or 'length' on the last event


class LogitsProcessor(Protocol):
    def __call__(self, generated: Sequence[int], logits: torch.Tensor) -> torch.Tensor:
        """(V,) logits -> (V,) logits to sample from; `generated`: this generation's tokens so far."""
        ...


def process_logits(processors: Sequence[LogitsProcessor], generated: Sequence[int],
                   logits: torch.Tensor) -> torch.Tensor:
    """Apply each processor in turn (a no-op without processors)."""
    for proc in processors:
        logits = proc(generated, logits)
    return logits


class StopMatcher:
    """Finds stop strings in streamed text, holding back a pending partial match."""

    def __init__(self, stops: Iterable[str] = ()):
        self.stops = [s for s in stops if s]
        self.held = ""

    def push(self, text: str) -> tuple[str, bool]:
        """Add text; return (text safe to emit, whether a stop string was reached)."""
        buf = self.held + text
        if not self.stops:
            self.held = ""
            return buf, False
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.held = ""
            return buf[: min(hits)], True
        # keep the longest suffix of buf that is a proper prefix of some stop string
        keep = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), keep, -1):
                if buf.endswith(s[:n]):
                    keep = n
                    break
        self.held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out


def generate(first_logits: torch.Tensor, step: Callable[[int], torch.Tensor], params: SamplingParams,
             max_new_tokens: int, *, history: Sequence[int] = (), stop: Iterable[str] = (),
             decoder=None, eog_ids: Iterable[int] = (), top_logprobs: int = 0,
             logits_processors: Sequence[LogitsProcessor] = ()) -> Iterator[GenEvent]:
    """Yield up to max_new_tokens GenEvents.

    first_logits (V,): the model's logits after the prompt; step(token) feeds one token and
    returns the next logits (V,). history: the prompt ids (for the penalties). decoder: a
    tokenizer stream decoder (push(id) -> str, flush() -> str) or None (texts are '').
    logits_processors: applied to each step's logits before sampling (see LogitsProcessor); the
    reported logprob stays the model's own, taken before them.
    """
    gen = make_generator(params.seed)
    hist = list(history)
    eog = set(eog_ids)
    matcher = StopMatcher(stop)
    logits = first_logits
    procs = list(logits_processors)
    new: list[int] = []
    for i in range(max_new_tokens):
        tok = sample(process_logits(procs, new, logits) if procs else logits, params, gen, hist)
        lp, top = logprobs(logits, tok, top_logprobs)
        hist.append(tok)
        new.append(tok)
        if tok in eog:
            tail = decoder.flush() if decoder is not None else ""
            text, _ = matcher.push(tail)
            yield GenEvent(tok, text + matcher.flush(), lp, top, "stop")
            return
        piece = decoder.push(tok) if decoder is not None else ""
        text, stopped = matcher.push(piece)
        if stopped:
            yield GenEvent(tok, text, lp, top, "stop")
            return
        if i == max_new_tokens - 1:
            tail, stopped = matcher.push(decoder.flush() if decoder is not None else "")
            text += tail
            if stopped:
                yield GenEvent(tok, text, lp, top, "stop")
                return
            yield GenEvent(tok, text + matcher.flush(), lp, top, "length")
            return
        yield GenEvent(tok, text, lp, top, None)
        logits = step(tok)
