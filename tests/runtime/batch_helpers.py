"""Helpers shared by the batch-engine tests (test_batch_async.py, test_batch_fuzz.py, test_batch_pressure.py)."""

from __future__ import annotations


class StreamTok:
    """A stand-in tokenizer: token i reads "t<i> "; the ids in `eog` end the turn."""

    def __init__(self, eog=()):
        self.eog_ids = set(eog)

    def stream_decoder(self):
        class D:
            def push(self, i):
                return f"t{i} "

            def flush(self):
                return ""
        return D()


def random_prompt(g, reqs: list, n: int, p_share: float, vocab: int) -> list:
    """n random token ids; with probability p_share (when `reqs` has earlier requests) a prefix of
    an earlier request's prompt followed by random ids (prefix hits). `g`: a random.Random, drawn
    in a fixed order so a seed gives the same scenario."""
    if reqs and g.random() < p_share:
        base = g.choice(reqs)["prompt"]
        k = g.randint(max(1, len(base) // 2), len(base))
        return base[:k] + [g.randrange(vocab) for _ in range(max(0, n - k))]
    return [g.randrange(vocab) for _ in range(n)]
