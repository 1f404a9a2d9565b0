"""BPE models of GGUF vocabs: byte-level (tokenizer.ggml.model 'gpt2') and Gemma 4's raw-UTF-8
BPE ('gemma4'), matching llama.cpp's llm_tokenizer_bpe_session (src/llama-vocab.cpp, commit
0c1e57098, vendored in llama-cpp-python 0.3.36).

The merges run on HuggingFace `tokenizers` (its BPE merges the lowest-rank pair first and
the leftmost on ties, as llama.cpp's work queue does); minfer supplies what llama.cpp does
around them:

- byte-level: the pre-tokenizer regexes of `tokenizer.ggml.pre` (minfer.tokenizer.pretok),
  applied in sequence, each keeping unmatched text as its own piece; GPT-2 byte-to-unicode
  mapping; merges by rank (`ignore_merges` for llama3: a whole pre-token found in the vocab
  is taken as one token). A character the vocab lacks is dropped;
- gemma4: spaces escaped to U+2581, the text split only into runs of newlines and runs of
  other characters; a run of newlines that is itself a token is taken whole (llama.cpp PR
  21343); merges on the raw characters; a symbol the vocab lacks becomes its UTF-8 bytes as
  <0xXX> tokens, each dropped if the vocab lacks it. Pre 'whitespace' (byte_encode false too)
  splits with its regex the same way, with no escaping and no whole newline runs;
- tokenizer.ggml.model 'whitespace' (llm_tokenizer_whitespace_session): each text fragment is first
  cut at White_Space code points, which are dropped (and each code point lowercased where
  normalizer.lowercase says), and every remaining segment goes through the BPE above.
"""

from __future__ import annotations

import re

from minfer.errors import MinferError
from minfer.tokenizer.pretok import NEWLINES_RE, PreRules, with_llama_cpp_tables
from minfer.tokenizer.wpm import _WHITESPACE, _simple_lower


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (the byte-level BPE alphabet).

    Printable Latin-1 bytes map to themselves; the other 68 bytes map, in order, to
    U+0100 onwards (openai/gpt-2 encoder.py: bytes_to_unicode; llama.cpp unicode.cpp:
    unicode_byte_to_utf8_map).
    """
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + \
        list(range(0xAE, 0xFF + 1))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


# placeholder vocab entry for characters the vocab lacks; it cannot arise from merges
# because no token contains U+E000 (private use, outside the byte alphabet)
_MISSING_TEXT = "\ue000minfer-missing\ue000"

_BYTE_TO_CHAR = bytes_to_unicode()
_CHAR_TO_BYTE = {c: b for b, c in _BYTE_TO_CHAR.items()}
_NEWLINE_RUNS = re.compile(r"[^\n]+|\n+")


def decode_byte_level(text: str) -> bytes:
    """A byte-level token text back to its bytes (llama-vocab.cpp: llama_decode_text)."""
    out = bytearray()
    for ch in text:
        b = _CHAR_TO_BYTE.get(ch)
        if b is not None:
            out.append(b)
        else:  # llama.cpp renders a character outside the byte map this way
            hexs = "".join(f"{x:02x}" for x in ch.encode("utf-8"))
            out += f"[UNK_BYTE_0x{hexs}{text}]".encode("utf-8")
    return bytes(out)


class BPEModel:
    """Text fragments (special tokens already cut out) -> ids, for one BPE vocab."""

    def __init__(self, path: str, texts: list[str], vocab: dict[str, int], merges: list[str],
                 rules: PreRules, whitespace_session: bool = False, lowercase: bool = False):
        """vocab: text -> id (the last id of a duplicated text, as llama.cpp's token_to_id);
        whitespace_session: tokenizer.ggml.model 'whitespace' (module doc), lowercase its option."""
        self.path = path
        self.rules = rules
        self._ws_session, self._lower = whitespace_session, lowercase
        self._vocab = vocab
        pairs = [tuple(m.split(" ")) for m in merges]
        for k in (k for k, p in enumerate(pairs) if len(p) != 2):
            raise MinferError(f"{path}: tokenizer.ggml.merges[{k}] is {merges[k]!r}; expected "
                              "two symbols separated by one space")
        # A character the vocab lacks (SmolLM2 has no token for byte 0x04 or the UTF-8 lead
        # byte F1, e.g.) stays a symbol of its own in llama.cpp's BPE, so the characters
        # around it never merge across it. HF's BPE would skip it and merge its neighbours;
        # an out-of-vocab placeholder id keeps llama.cpp's result and marks where it was.
        vocab = dict(vocab)
        vocab[_MISSING_TEXT] = self._missing_id = len(texts)
        self._hf = self._build_hf(vocab, pairs)
        if not rules.byte_encode:
            self._byte_ids = [vocab.get(f"<0x{b:02X}>") for b in range(256)]
            # gemma4's newline runs by Python's re (the same pieces); other regexes as below
            from tokenizers import pre_tokenizers

            self._raw_split = None if rules.regexes == (NEWLINES_RE,) else \
                pre_tokenizers.Sequence(self._split_steps())

    def _split_steps(self) -> list:
        """The pre-tokenizer regexes as `tokenizers` Split steps, each in turn; 'isolated' keeps the
        unmatched text as pieces of its own, as llama.cpp's unicode_regex_split does
        ('merged_with_previous' for a glued one: the match joins the text before it)
        (\\p{..} classes cut to llama.cpp's Unicode 15.1 table: pretok.with_llama_cpp_tables)."""
        from tokenizers import Regex, pre_tokenizers

        return [pre_tokenizers.Split(Regex(with_llama_cpp_tables(r)), behavior="merged_with_previous"
                                     if k in self.rules.glued else "isolated")
                for k, r in enumerate(self.rules.regexes)]

    def _build_hf(self, vocab: dict[str, int], pairs: list[tuple[str, str]]):
        from tokenizers import Tokenizer as HFTokenizer, models, pre_tokenizers

        try:
            bpe = models.BPE(vocab=vocab, merges=pairs, ignore_merges=self.rules.ignore_merges,
                             unk_token=_MISSING_TEXT, fuse_unk=False)
        except Exception as e:  # tokenizers raises its own exception type on bad merges
            raise MinferError(f"{self.path}: the GGUF vocab/merges do not form a BPE model: {e}") from e
        hf = HFTokenizer(bpe)
        if self.rules.byte_encode:
            steps = self._split_steps()
            steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
            hf.pre_tokenizer = pre_tokenizers.Sequence(steps)
        # raw UTF-8 (gemma4, whitespace): no pre-tokenizer; _encode_raw hands over one piece at a time
        return hf

    def _segments(self, text: str) -> list[str]:
        """llm_tokenizer_whitespace_session::tokenize: the text cut at White_Space code points
        (unicode_cpt_flags is_whitespace, dropped), each code point lowercased (unicode_tolower,
        UnicodeData's simple mapping) where normalizer_opts.lowercase is on."""
        segs: list[str] = []
        cur: list[str] = []
        for ch in text:
            if ord(ch) in _WHITESPACE:
                if cur:
                    segs.append("".join(cur))
                    cur = []
            else:
                cur.append(_simple_lower(ch) if self._lower else ch)
        if cur:
            segs.append("".join(cur))
        return segs

    def encode_batch(self, frags: list[str]) -> list[list[int]]:
        """Ids of each text fragment (no BOS/EOS)."""
        if self._ws_session:  # each segment through the BPE session, the ids joined per fragment
            groups = [self._segments(f) for f in frags]
            flat = iter(self._encode_pieces([s for g in groups for s in g]))
            return [[i for _ in g for i in next(flat)] for g in groups]
        return self._encode_pieces(frags)

    def _encode_pieces(self, frags: list[str]) -> list[list[int]]:
        if not frags:
            return []
        if self.rules.byte_encode:
            missing = self._missing_id
            return [[i for i in e.ids if i != missing]
                    for e in self._hf.encode_batch(frags, add_special_tokens=False)]
        return [self._encode_raw(f) for f in frags]

    def _encode_raw(self, text: str) -> list[int]:
        """gemma4, whitespace: BPE on raw UTF-8 (byte_encode = false in llama.cpp)."""
        if self.rules.escape_whitespace:
            text = text.replace(" ", "\u2581")  # llama_escape_whitespace
        runs = _NEWLINE_RUNS.findall(text) if self._raw_split is None else \
            [p for p, _ in self._raw_split.pre_tokenize_str(text)]
        out: list[int] = []
        todo: list[tuple[int, str]] = []  # (position in out, run) for the BPE
        for run in runs:
            whole = self._vocab.get(run) if self.rules.whole_newline_runs and run[0] == "\n" else None
            if whole is not None:
                out.append(whole)
            else:
                todo.append((len(out), run))
                out.append(-1)
        if not todo:
            return out
        encs = self._hf.encode_batch([r for _, r in todo], add_special_tokens=False)
        pieces: dict[int, list[int]] = {}
        for (pos, run), e in zip(todo, encs):
            ids: list[int] = []
            for tid, (s, t) in zip(e.ids, e.offsets):
                if tid != self._missing_id:
                    ids.append(tid)
                    continue
                # a symbol the vocab lacks: its bytes as <0xXX> tokens, the missing ones dropped
                for b in run[s:t].encode("utf-8"):
                    if self._byte_ids[b] is not None:
                        ids.append(self._byte_ids[b])
            pieces[pos] = ids
        result: list[int] = []
        for k, tid in enumerate(out):
            result.extend(pieces[k] if tid == -1 else (tid,))
        return result

    def normal_piece(self, text: str) -> bytes:
        """Bytes of a NORMAL token (token_to_piece, BPE case)."""
        if self.rules.escape_whitespace:
            return text.replace("\u2581", " ").encode("utf-8")
        return decode_byte_level(text)
