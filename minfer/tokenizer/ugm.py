"""SentencePiece Unigram vocab (tokenizer.ggml.model 't5', llama.cpp's UGM type).

XLM-RoBERTa-based embedding models (bge-m3, multilingual-e5, nomic-embed-text-v2-moe) and the
T5 family carry this vocab: token texts with log-probability scores, and SentencePiece's
precompiled normalization map. The rules are llama.cpp's (src/llama-vocab.cpp, commit
0c1e57098, vendored in llama-cpp-python 0.3.36): llm_tokenizer_ugm (the tables built once per
vocab) and llm_tokenizer_ugm_session (normalize, normalize_prefix, tokenize); each is cited
where it is applied. In short:

- normalize: the text is rewritten piece by piece, left to right. At each position the
  longest prefix that walks the user-defined tokens' trie is kept as it is; else the longest
  prefix that the charsmap holds becomes its replacement string; else one UTF-8 character is
  kept, or an invalid byte becomes U+FFFD. Spaces of the result become U+2581 (escape
  whitespace); with remove_extra_whitespaces runs of spaces collapse and leading / trailing
  ones go, and add_space_prefix puts one U+2581 before the first word;
- tokenize: a Viterbi pass over the normalized text, one UTF-8 character per step: every
  vocab entry (normal, user-defined and unused tokens) that starts at the step is a
  candidate edge scored by its tokenizer.ggml.scores value (user-defined tokens: 0); a
  character no single entry spells gets the unknown token, scored min(normal scores) - 10;
  the best total wins (sums in double precision, the first of equal sums kept); runs of
  unknown tokens in the result become one.

The precompiled charsmap (SentencePiece's normalizer.precompiled_charsmap, copied into
tokenizer.ggml.precompiled_charsmap by llama.cpp's converter) is: a little-endian uint32 n,
then n bytes of a XOR-compressed compact double array (XCDA: Kanda 2018) whose uint32 nodes
pack BASE (bits 10-30, shifted left by 8 when bit 9 is set), LEAF (bit 8) and LCHECK (bits
0-7, bit 31 kept so that a value node never matches), then NUL-terminated replacement
strings; a leaf's value (bits 0-30 of the node its BASE points to) is the byte offset of its
replacement.

Pure Python: the tables are dicts of token texts and lists, built once (about 0.3 s for
XLM-R's 250,048 tokens); a text costs one dict lookup per position and candidate length (up
to the longest entry that begins with the position's 3 characters), about 5 ms per KB.
"""

from __future__ import annotations

import struct
import sys

from minfer.errors import MinferError
from minfer.tokenizer.spm import UnspellableText

CHARSMAP_KEY = "tokenizer.ggml.precompiled_charsmap"
ESCAPED_SPACE = "\u2581"           # llm_tokenizer_ugm::escaped_space
UNKNOWN_PENALTY = 10.0             # llm_tokenizer_ugm::unknown_token_score_penalty
_FLT_MAX = 3.4028234663852886e38   # llm_tokenizer_ugm: min_score's start value
_NEG = -sys.float_info.max         # tokenize(): -DBL_MAX, below every sum of scores
# unicode.cpp unicode_len_utf8: a UTF-8 sequence's length by its first byte's high nibble
# (a continuation byte counts as 1)
_LEN_BY_NIBBLE = (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)
_REPLACEMENT = "\ufffd".encode("utf-8")
_F32 = struct.Struct("<f")


def _f32(x: float) -> float:
    """x rounded to float32 (llama.cpp computes the unknown score in float)."""
    return _F32.unpack(_F32.pack(x))[0]


def _utf8_char_len(b: bytes, i: int) -> int:
    """Length of the valid UTF-8 character at b[i], or 0 when there is none, as unicode.cpp
    unicode_cpt_from_utf8 judges it (lead-byte pattern and continuation bytes only)."""
    c = b[i]
    if c < 0x80:
        return 1
    if c < 0xC0:
        return 0
    k = 2 if c < 0xE0 else 3 if c < 0xF0 else 4 if c < 0xF8 else 0
    # unicode_cpt_from_utf8 wants offset + k - 1 < size and 10xxxxxx continuation bytes
    if k == 0 or i + k > len(b):
        return 0
    for j in range(i + 1, i + k):
        if b[j] & 0xC0 != 0x80:
            return 0
    return k


class CharsMap:
    """A precompiled_charsmap, checked as llama.cpp's load() checks it (vocab type t5)."""

    def __init__(self, path: str, raw: bytes):
        self.path = path
        # load(): "precompiled_charsmap too small for xcda_blob_size header!"
        if len(raw) < 4:
            raise MinferError(f"{path}: {CHARSMAP_KEY} has {len(raw)} bytes, too few for its 4-byte "
                              "header (the length of its XCDA node array)")
        (blob,) = struct.unpack_from("<I", raw, 0)
        # load(): xcda_blob_size + 4 >= size is "Index out of array bounds in precompiled charsmap!"
        if blob + 4 >= len(raw):
            raise MinferError(f"{path}: {CHARSMAP_KEY} says its XCDA node array has {blob} bytes, but "
                              f"the map has {len(raw)} bytes in all (the 4-byte header, the nodes and "
                              "at least one byte of replacement strings)")
        n = blob // 4  # llm_tokenizer_ugm: xcda_array_size = xcda_blob_size / sizeof(uint32_t)
        self._nodes = list(struct.unpack_from(f"<{n}I", raw, 4))
        self._repl = raw[4 + blob:]  # llm_tokenizer_ugm: prefix_replacements
        self._repl_cache: dict[int, bytes] = {}
        # the root's BASE; the first bytes whose walk goes on (a child of the root, or a node
        # past the array, which the walk reports); the others cannot start a match
        self._root = self._base(0) if n else 0
        self._first = bytes((self._root ^ c) >= n or self._lcheck(self._root ^ c) == c
                            for c in range(256)) if n else bytes(256)

    def _fail(self, what: str) -> MinferError:
        return MinferError(f"{self.path}: {CHARSMAP_KEY} is malformed: {what}")

    def _node(self, i: int) -> int:
        # xcda_array_view::get_node: "Index out of array bounds in XCDA array!"
        if i >= len(self._nodes):
            raise self._fail(f"a walk reaches XCDA node {i}, past its {len(self._nodes)} nodes")
        return self._nodes[i]

    def _base(self, i: int) -> int:
        p = self._node(i)
        return (p >> 10) << ((p & (1 << 9)) >> 6)      # xcda_array_view::get_base

    def _lcheck(self, i: int) -> int:
        return self._node(i) & ((1 << 31) | 0xFF)      # xcda_array_view::get_lcheck

    def longest(self, b: bytes, i: int) -> tuple[int, bytes]:
        """(length, replacement) of the longest prefix of b[i:] the map holds; (0, b'') if
        none (llm_tokenizer_ugm_session::normalize_prefix, the XCDA walk)."""
        if not self._first[b[i]]:
            return 0, b""
        node = self._root
        best_len = best_off = 0
        n = len(b)
        j = i
        while j < n:
            c = b[j]
            if c == 0:  # the walk stops at a NUL byte
                break
            node ^= c
            p = self._node(node)
            if p & ((1 << 31) | 0xFF) != c:   # LCHECK: not a child of the previous node
                break
            leaf = (p >> 8) & 1
            node ^= (p >> 10) << ((p & (1 << 9)) >> 6)
            if leaf:  # its BASE points to the node holding the replacement's offset
                best_len = j - i + 1
                best_off = self._node(node) & ((1 << 31) - 1)   # get_value
            j += 1
        if not best_len:
            return 0, b""
        return best_len, self._replacement(best_off)

    def _replacement(self, off: int) -> bytes:
        r = self._repl_cache.get(off)
        if r is not None:
            return r
        repl = self._repl
        # normalize_prefix: "Index out of array bounds in precompiled charsmap!" and
        # "Unterminated string in precompiled charsmap!"
        if off >= len(repl):
            raise self._fail(f"a replacement offset ({off}) is past its {len(repl)} bytes of strings")
        end = repl.find(b"\0", off)
        if end < 0:
            raise self._fail(f"the replacement string at offset {off} has no terminating NUL")
        r = self._repl_cache[off] = repl[off:end]
        return r


class UGMModel:
    """Text fragment -> ids for one Unigram vocab (llm_tokenizer_ugm + its session)."""

    def __init__(self, path: str, texts: list[str], token_types: list[int] | None,
                 scores: list[float], user_defined: list[bool], unk_id: int | None,
                 charsmap: bytes | None, *, add_space_prefix: bool, remove_extra_whitespaces: bool,
                 escape_whitespaces: bool = True, treat_whitespace_as_suffix: bool = False):
        """texts: the vocab's token texts (empty ones already '[EMPTY_<i>]'); token_types: the
        file's tokenizer.ggml.token_type (None: all normal); user_defined: per id, whether
        the token is user-defined after load() (its score counts as 0); scores: one float
        per token."""
        self.path = path
        self._unk = unk_id
        self.charsmap = CharsMap(path, charsmap) if charsmap is not None else None
        # llm_tokenizer_ugm: normal, user-defined and unused tokens go into the token trie
        # (by the file's token types, as they stand when init_tokenizer runs in load());
        # min_score over the normal ones; user-defined ones also go into the trie that
        # normalize_prefix matches first. A repeated text keeps its last id (the trie's
        # insert overwrites the value).
        n = len(texts)
        types = [1] * n if token_types is None else [int(t) for t in token_types[:n]]
        vocab: dict[str, int] = {}
        ud_texts: list[str] = []
        min_score = _FLT_MAX
        for i, (t, ty) in enumerate(zip(texts, types)):
            if ty == 1:    # NORMAL
                s = scores[i]
                if s < min_score:
                    min_score = s
                vocab[t] = i
            elif ty == 5:  # UNUSED
                vocab[t] = i
            elif ty == 4:  # USER_DEFINED
                vocab[t] = i
                ud_texts.append(t)
        self._vocab = vocab
        self._max_chars = max(map(len, vocab), default=0)
        # what the trie walk gives for free, the end of the candidates: the longest entry that
        # begins with each 3 characters (lengths 1 and 2 are always tried); about 4 lookups a
        # position instead of 16 on XLM-R's vocab
        reach: dict[str, int] = {}
        for t in vocab:
            if len(t) > 2 and len(t) > reach.get(t[:3], 0):
                reach[t[:3]] = len(t)
        self._reach = reach
        self._vocab_bytes: dict[bytes, int] | None = None   # built when a text needs it
        self._max_bytes = 0
        # tokenize(): "we set the user-defined token scores to 0" (is_user_defined at that
        # time, i.e. after load()'s attribute changes)
        self._score = [0.0 if ud else s for s, ud in zip(scores, user_defined)]
        # llm_tokenizer_ugm: unknown_token_score = min_score - unknown_token_score_penalty,
        # in float
        self.unknown_score = _f32(_f32(min_score) - UNKNOWN_PENALTY)
        # the user-defined trie's nodes are the prefixes of its texts (bytes: the trie is)
        self._ud_prefixes = {t.encode("utf-8")[:k] for t in ud_texts
                             for k in range(1, len(t.encode("utf-8")) + 1)}
        self._ud_max = max((len(t.encode("utf-8")) for t in ud_texts), default=0)
        self._ud_first = bytes(bool(bytes([c]) in self._ud_prefixes) for c in range(256))
        # llm_tokenizer_ugm_session::normalize's flags (llama_vocab getters)
        self._space = (ESCAPED_SPACE if escape_whitespaces else " ").encode("utf-8")
        self._prepend = add_space_prefix and not treat_whitespace_as_suffix
        self._append = add_space_prefix and treat_whitespace_as_suffix
        self._merge = remove_extra_whitespaces

    # ---- normalization ----
    def _prefix(self, b: bytes, i: int) -> tuple[bytes, int]:
        """(normalized piece, bytes consumed) at b[i] (normalize_prefix)."""
        # a prefix of the input along the user-defined tokens' trie stays as it is: the
        # trie's get_longest_prefix stops where the walk does, complete token or not
        if self._ud_first[b[i]]:
            k, top = 1, min(len(b) - i, self._ud_max)
            while k < top and b[i:i + k + 1] in self._ud_prefixes:
                k += 1
            return b[i:i + k], k
        if self.charsmap is not None:
            k, repl = self.charsmap.longest(b, i)
            if k:
                return repl, k
        k = _utf8_char_len(b, i)
        if k:
            return b[i:i + k], k
        return _REPLACEMENT, 1  # an invalid byte: U+FFFD, one byte consumed

    def normalize(self, text: str) -> bytes:
        """llm_tokenizer_ugm_session::normalize: the UTF-8 bytes the Viterbi runs over."""
        b = text.encode("utf-8", "surrogatepass")
        out = bytearray()
        space, merge = self._space, self._merge
        prepend_once = self._prepend
        prepended = in_word = False
        i, n = 0, len(b)
        while i < n:
            piece, used = self._prefix(b, i)
            i += used
            if b" " not in piece:
                if piece:
                    if not in_word:
                        in_word = True
                        # a space before each word (merge) or before the first one (prefix)
                        if (prepend_once and not prepended) or merge:
                            out += space
                            prepended = True
                    out += piece
                continue
            for c in piece:  # byte by byte, as normalize() does
                if c != 0x20:
                    if not in_word:
                        in_word = True
                        if (prepend_once and not prepended) or merge:
                            out += space
                            prepended = True
                    out.append(c)
                else:
                    in_word = False
                    if not merge:  # a space of the text stays (escaped); merged: dropped here
                        out += space
        if self._append:
            out += space
        return bytes(out)

    # ---- tokenization ----
    def encode(self, text: str) -> list[int]:
        """Ids of one text fragment (llm_tokenizer_ugm_session::tokenize)."""
        norm = self.normalize(text)
        if not norm:
            return []
        try:  # valid UTF-8 (always, but after a partial user-defined match): by characters
            return self._viterbi(norm.decode("utf-8"))
        except UnicodeDecodeError:
            return self._viterbi(norm)

    def _bytes_vocab(self) -> dict[bytes, int]:
        if self._vocab_bytes is None:
            self._vocab_bytes = {t.encode("utf-8"): i for t, i in self._vocab.items()}
            self._max_bytes = max(map(len, self._vocab_bytes), default=0)
        return self._vocab_bytes

    def _viterbi(self, s) -> list[int]:
        """The best-scoring path over s: a str (one step per character) or, where the
        normalized bytes are not valid UTF-8, bytes (one step per unicode_len_utf8 units)."""
        by_bytes = isinstance(s, bytes)
        if by_bytes:
            get, maxlen = self._bytes_vocab().get, self._max_bytes
        else:
            get, reach = self._vocab.get, self._reach.get
        score, unk_score = self._score, self.unknown_score
        unk = -1 if self._unk is None else self._unk
        n = len(s)
        best = [_NEG] * (n + 1)   # tokenization_results: best score_sum ending here
        tok = [unk] * (n + 1)     # ... its last token
        frm = [0] * (n + 1)       # ... and where that token starts
        best[0] = 0.0
        i = 0
        while i < n:
            if by_bytes:
                u, top = min(_LEN_BY_NIBBLE[s[i] >> 4], n - i), min(n, i + maxlen)
            else:
                u, top = 1, min(n, i + reach(s[i:i + 3], 2))
            cur = best[i]
            single = False
            for end in range(i + 1, top + 1):  # shortest first, as the trie walk
                tid = get(s[i:end])
                if tid is not None:
                    if end - i == u:
                        single = True
                    sc = cur + score[tid]
                    if sc > best[end]:  # a tie keeps the earlier champion
                        best[end], tok[end], frm[end] = sc, tid, i
            if not single:  # no entry spells this character alone: the unknown token
                sc = cur + unk_score
                if sc > best[i + u]:
                    best[i + u], tok[i + u], frm[i + u] = sc, unk, i
            i += u
        # backtrack from the end; consecutive unknown tokens become one
        out: list[int] = []
        pos, prev_unk = n, False
        while True:
            tid = tok[pos]
            if tid == -1:  # llama.cpp would emit LLAMA_TOKEN_NULL here
                ch = s[frm[pos]:pos]
                ch = ch.decode("utf-8", "replace") if isinstance(ch, bytes) else ch
                raise UnspellableText(f"{self.path}: the text holds a character the Unigram vocab "
                                      f"cannot spell ({ch!r}) and the vocab has no unknown token "
                                      "(tokenizer.ggml.unknown_token_id)", ch)
            is_unk = tid == unk
            if not (prev_unk and is_unk):
                out.append(tid)
            if frm[pos] == 0:
                break
            prev_unk = is_unk
            pos = frm[pos]
        out.reverse()
        return out
