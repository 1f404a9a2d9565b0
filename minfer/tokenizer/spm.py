"""SentencePiece-style vocab (tokenizer.ggml.model 'llama'): merges by token score.

The rules are llama.cpp's llm_tokenizer_spm_session (src/llama-vocab.cpp, commit 0c1e57098,
vendored in llama-cpp-python 0.3.36), itself a port of SentencePiece's BPE model:

- the fragment (spaces already escaped to U+2581 by the caller) starts as one symbol per
  character;
- every adjacent pair whose joined text is a vocab entry is a candidate, scored by that
  entry's `tokenizer.ggml.scores` value; the best score merges first, the leftmost on a tie;
  after a merge the new symbol's pairs with its neighbours become candidates; a candidate
  whose symbols changed since it was queued is skipped;
- every final symbol that is a vocab entry is its id; any other symbol (a character the
  vocab lacks) becomes one token per UTF-8 byte: `<0xXX>`, or else the one-byte text
  itself (llama_vocab::byte_to_token, SPM case).

Pure Python: one dict lookup per candidate pair and a heap; about 10 µs per character.
"""

from __future__ import annotations

import heapq

from minfer.errors import MinferError


class UnspellableText(MinferError):
    """A character neither the vocab nor its byte tokens can spell; `char` is that character."""

    def __init__(self, message: str, char: str):
        super().__init__(message)
        self.char = char


class SPMModel:
    """Escaped text fragment -> ids for one SentencePiece vocab."""

    def __init__(self, path: str, vocab: dict[str, int], scores: list[float]):
        """vocab: text -> id (a duplicated text maps to its last id, token_to_id[word] = i)."""
        self.path = path
        self._vocab = vocab
        self._scores = scores
        self._byte_ids: list[int | None] = []
        for b in range(256):
            tid = vocab.get(f"<0x{b:02X}>")
            if tid is None and b < 0x80:
                tid = vocab.get(chr(b))
            self._byte_ids.append(tid)

    def encode(self, text: str) -> list[int]:
        n = len(text)
        if n == 0:
            return []
        vocab, scores = self._vocab, self._scores
        sym = list(text)                      # symbol texts; '' once merged into the left
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        # candidates: (-score, left index, right index, joined length); heapq pops the
        # smallest, i.e. the best score and then the leftmost (llm_bigram_spm::comparator)
        heap = []
        for i in range(1, n):
            t = sym[i - 1] + sym[i]
            tid = vocab.get(t)
            if tid is not None:
                heap.append((-scores[tid], i - 1, i, 2))
        heapq.heapify(heap)
        push, pop = heapq.heappush, heapq.heappop
        while heap:
            _, left, right, size = pop(heap)
            a, b = sym[left], sym[right]
            # stale: one side already merged away, or grown since (llama.cpp compares sizes)
            if not a or not b or len(a) + len(b) != size:
                continue
            sym[left] = a + b
            sym[right] = ""
            r = nxt[left] = nxt[right]
            if r >= 0:
                prev[r] = left
            p = prev[left]
            if p >= 0:
                t = sym[p] + sym[left]
                tid = vocab.get(t)
                if tid is not None:
                    push(heap, (-scores[tid], p, left, len(t)))
            if r >= 0:
                t = sym[left] + sym[r]
                tid = vocab.get(t)
                if tid is not None:
                    push(heap, (-scores[tid], left, r, len(t)))
        out: list[int] = []
        i = 0
        while i != -1:
            s = sym[i]
            tid = vocab.get(s)
            if tid is not None:
                out.append(tid)
            else:
                for byte in s.encode("utf-8"):
                    bid = self._byte_ids[byte]
                    if bid is None:
                        raise UnspellableText(f"{self.path}: the text holds a character the vocab "
                                              f"lacks ({s!r}) and the vocab has no byte token "
                                              f"<0x{byte:02X}> to spell it", s)
                    out.append(bid)
            i = nxt[i]
        return out
