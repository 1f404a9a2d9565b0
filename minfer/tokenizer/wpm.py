"""WordPiece vocab (tokenizer.ggml.model 'bert'), as llama.cpp's llm_tokenizer_wpm_session.

Rules from llama.cpp's src/llama-vocab.cpp (commit 0c1e57098, vendored in llama-cpp-python
0.3.36) and the Unicode tables its scripts/gen-unicode-data.py derives:

- normalize: with strip_accents, each code point becomes the first code point of its NFD
  form (so 'é' -> 'e') and accent marks (category M) are dropped; with lowercase, each code
  point takes its simple lowercase mapping (UnicodeData.txt, one code point);
- split: whitespace (Unicode White_Space) ends a word; NUL, U+FFFD and control characters
  (categories Cc, Cf, Co, Cs) vanish; punctuation (P), ASCII symbols (S below U+007F) and
  CJK ideographs are words of one character;
- each word gets a U+2581 prefix (the GGUF vocab spells BERT's "##" continuations without
  it and word starts with it) and is cut greedily, longest vocab entry first; a word with a
  position no entry matches becomes the unknown token.

`normalizer.lowercase` (default true) and `normalizer.strip_accents` (default: as lowercase)
come from the GGUF (load(): BertNormalizer options). The tables are Python's unicodedata
(Unicode 14 on Python 3.11); llama.cpp's may be newer, which only matters for code points
assigned since.
"""

from __future__ import annotations

import unicodedata

# White_Space (PropList.txt), the set gen-unicode-data.py writes
_WHITESPACE = frozenset([*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
                         0x2028, 0x2029, 0x202F, 0x205F, 0x3000])


def _is_chinese(cp: int) -> bool:
    # llm_tokenizer_wpm_session::is_chinese_char (0x2B920, not 0x2B820, as HF's Rust code)
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B920 <= cp <= 0x2CEAF
            or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def _simple_lower(ch: str) -> str:
    low = ch.lower()
    # str.lower() is the full mapping; its first code point is the simple one (U+0130 'İ'
    # -> 'i' + U+0307 is the one case where they differ in length)
    return low[0] if low else ch


def split_words(text: str, lowercase: bool, strip_accents: bool) -> list[str]:
    """llm_tokenizer_wpm_session::preprocess: normalized words of a text fragment."""
    words: list[str] = []
    cur: list[str] = []
    for ch in text:
        if strip_accents:
            ch = unicodedata.normalize("NFD", ch)[0]
        cp = ord(ch)
        if cp in _WHITESPACE:
            if cur:
                words.append("".join(cur))
                cur = []
            continue
        cat = unicodedata.category(ch)
        if cp == 0 or cp == 0xFFFD or cat in ("Cc", "Cf", "Co", "Cs"):
            continue
        if strip_accents and cat[0] == "M":
            continue
        s = _simple_lower(ch) if lowercase else ch
        if cat[0] == "P" or (cp < 0x7F and cat[0] == "S") or _is_chinese(cp):
            if cur:
                words.append("".join(cur))
                cur = []
            words.append(s)
        else:
            cur.append(s)
    if cur:
        words.append("".join(cur))
    return words


class WPMModel:
    """Text fragment -> ids for one WordPiece vocab."""

    def __init__(self, path: str, texts: list[str], vocab: dict[str, int], unk_id: int | None,
                 lowercase: bool, strip_accents: bool):
        self.path = path
        self._vocab = vocab  # text -> id
        self._max_len = max((len(t) for t in texts), default=1)  # in characters
        self._unk = unk_id
        self.lowercase = lowercase
        self.strip_accents = strip_accents

    def encode(self, text: str) -> list[int]:
        vocab = self._vocab
        out: list[int] = []
        for word in split_words(text, self.lowercase, self.strip_accents):
            w = "\u2581" + word
            n, i, ids = len(w), 0, []
            while i < n:
                for j in range(min(n, i + self._max_len), i, -1):
                    tid = vocab.get(w[i:j])
                    if tid is not None:
                        ids.append(tid)
                        i = j
                        break
                else:  # no entry starts here: the whole word is unknown
                    ids = []
                    break
            if ids:
                out.extend(ids)
            elif self._unk is not None:
                out.append(self._unk)
        return out
