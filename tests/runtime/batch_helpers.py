"""Helpers shared by the batch-engine tests (test_batch_async.py, test_batch_fuzz.py)."""

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
