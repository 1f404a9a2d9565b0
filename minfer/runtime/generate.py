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

import operator
from dataclasses import dataclass, field, fields
from typing import Callable, Iterable, Iterator, Protocol, Sequence

import torch

from minfer.errors import MinferError
from minfer.runtime.sampling import SamplingParams, logprobs, make_generator, sample


# ---- argument checks of the public generation calls (Engine.generate/complete/chat) ----------
# A Python caller's wrong type used to surface deep inside (stop=5: "'int' object is not
# iterable"; stop="Paris" was split into the stop strings 'P', 'a', ...; max_tokens=2.5 was
# cut to 2); each is now one MinferError naming the argument and what it takes.

def _shown(v) -> str:
    return f"{type(v).__name__} {v!r}"[:60]


def check_count(name: str, v, allow_none: bool = False) -> int | None:
    """A number of tokens: an int >= 0 (None too when allow_none)."""
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise MinferError(f"{name}: expected an integer >= 0{' or None (no limit)' if allow_none else ''}, "
                          f"got {_shown(v)}")
    return int(v)


def check_stop(stop) -> list[str]:
    """stop: None, one string, or an iterable of strings (as OpenAI's `stop` takes them)."""
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    try:
        stops = list(stop)
    except TypeError:
        raise MinferError(f"stop: expected a string or a list of strings, got {_shown(stop)}") from None
    for i, s in enumerate(stops):
        if not isinstance(s, str):
            raise MinferError(f"stop[{i}]: expected a string, got {_shown(s)}")
    return stops


def check_prompt_ids(ids, name: str = "prompt_ids") -> list[int]:
    """Token ids: a sequence (or 1-D tensor) of ints; text belongs to complete() or chat()."""
    if type(ids) is list and len(ids) == 1 and type(ids[0]) is int:
        return [ids[0]]                   # a decode step's one token (the loop below, ~1 us less)
    if isinstance(ids, torch.Tensor):
        ids = ids.reshape(-1).tolist()
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise MinferError(f"{name}: expected a list of token ids (int), got {_shown(ids)}; "
                          "for text use complete(prompt) or chat(messages)")
    out = []
    for i, t in enumerate(ids):
        try:
            if isinstance(t, bool):
                raise TypeError
            out.append(operator.index(t))     # int, numpy and 0-d torch integers
        except TypeError:
            raise MinferError(f"{name}[{i}]: expected a token id (int), got {_shown(t)}") from None
    return out


def check_params(params) -> SamplingParams:
    if params is None:
        return SamplingParams()
    if not isinstance(params, SamplingParams):
        raise MinferError(f"params: expected a minfer.runtime.sampling.SamplingParams or None, got "
                          f"{type(params).__name__}; with complete()/chat() pass the fields as keywords "
                          "(temperature=0, seed=1)")
    return params


def sampling_from_kwargs(sampling: dict) -> SamplingParams:
    """SamplingParams from complete()/chat() keywords; an unknown one is named with the list."""
    names = [f.name for f in fields(SamplingParams)]
    for k in sampling:
        if k not in names:
            raise MinferError(f"unknown keyword argument {k!r}: sampling keywords are {', '.join(names)}")
    return SamplingParams(**sampling)


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
             logits_processors: Sequence[LogitsProcessor] = (), draw=None) -> Iterator[GenEvent]:
    """Yield up to max_new_tokens GenEvents.

    first_logits (V,): the model's logits after the prompt; step(token) feeds one token and
    returns the next logits (V,). history: the prompt ids (for the penalties). decoder: a
    tokenizer stream decoder (push(id) -> str, flush() -> str) or None (texts are '').
    logits_processors: applied to each step's logits before sampling (see LogitsProcessor); the
    reported logprob stays the model's own, taken before them. draw: None (the host draw:
    sampling.sample with a generator seeded by params.seed) or a callable (logits, history, ahead) ->
    (token, logprob, top_logprobs) that chooses on the logits' device (device_draw.DeviceDraw;
    not with logits_processors; ahead: it may also start the next step, which `step` then
    returns).
    """
    if draw is not None and logits_processors:
        raise MinferError("generate: a device draw does not take logits processors")
    gen = make_generator(params.seed) if draw is None else None
    hist = list(history)
    eog = set(eog_ids)
    matcher = StopMatcher(stop)
    logits = first_logits
    procs = list(logits_processors)
    new: list[int] = []
    for i in range(max_new_tokens):
        if draw is not None:
            # ahead: the draw may launch the next step from the token before it is read back
            # (device_draw.py); never after the last one
            tok, lp, top = draw(logits, hist, ahead=i < max_new_tokens - 1)
        else:
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
