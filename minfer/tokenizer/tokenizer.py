"""The tokenizer of a GGUF file, matching llama.cpp's llama_tokenize / llama_detokenize.

Vocab types, by `tokenizer.ggml.model` (llama.cpp src/llama-vocab.cpp, commit 0c1e57098,
vendored in llama-cpp-python 0.3.36; each rule is cited where it is applied):

| model    | type              | minfer               |
|----------|-------------------|----------------------|
| `gpt2`   | byte-level BPE    | bpe.BPEModel + the `tokenizer.ggml.pre` rules of pretok.py |
| `gemma4` | raw-UTF-8 BPE     | bpe.BPEModel (pre 'gemma4': escaped spaces, newline runs) |
| `whitespace` | BPE after a White_Space split | bpe.BPEModel, pre 'whitespace' only (jina-embeddings-v2-base-zh) |
| `llama`  | SentencePiece     | spm.SPMModel (score-ordered merges, byte fallback) |
| `bert`   | WordPiece         | wpm.WPMModel         |
| `t5`     | SentencePiece Unigram (UGM) | ugm.UGMModel (precompiled charsmap, Viterbi over scores) |

Any other model (rwkv, plamo2, ...) or an unknown pre is a MinferError.

Around the model, as llama_vocab::impl::tokenize does for every type:
1. special-token partition (tokenizer_st_partition): the text is cut at every occurrence of
   a control / user-defined / unknown token text, longest texts first; those pieces become
   their ids directly. With parse_special=False, control and unknown tokens are left in the
   text, but user-defined tokens (type 4, e.g. Qwen's <tool_call>) are still matched. A
   token with the RSTRIP / LSTRIP attribute (Phi-3's) eats the whitespace after / before it;
2. SentencePiece: each text fragment is prefixed with a space when add_space_prefix is set
   and the fragment is first or follows a special token, then spaces become U+2581; Unigram
   normalizes each fragment itself (ugm.py: the charsmap, then a U+2581 before its first word
   with add_space_prefix, before every word with remove_extra_whitespaces);
3. BOS / EOS (add_special): SPM, BPE, gemma4 and Unigram as tokenizer.ggml.add_bos_token /
   add_eos_token say (defaults per type: Unigram EOS only; gemma4 always adds BOS); WordPiece
   always wraps the text in BOS ([CLS]) and SEP.

Decoding renders each token as token_to_piece does and, for detokenize, drops one leading
space of the first token when add_space_prefix is set and cleans up spaces before
punctuation for the types that enable clean_spaces.
"""

from __future__ import annotations

import codecs

from minfer.errors import MinferError
from minfer.tokenizer import vocab as V
from minfer.tokenizer.pretok import PRE_TYPES, PreRules

MODELS = ("gpt2", "gemma4", "llama", "bert", "t5", "whitespace")  # tokenizer.ggml.model values minfer implements
_WS = " \t\n\v\f\r"  # C isspace(), what tokenizer_st_partition strips for LSTRIP/RSTRIP


def clean_spaces(b: bytes) -> bytes:
    """clean_up_tokenization_spaces, the three passes of llama-vocab.cpp: detokenize()."""
    if not b:
        return b
    # pass 1: " ?", " !", " .", " ," lose the space
    out = bytearray(b[:1])
    for i in range(1, len(b)):
        if b[i - 1] == 0x20 and b[i] in b"?!.,":
            out.pop()
        out.append(b[i])
    # pass 2: a lone apostrophe between spaces loses both spaces
    # (llama.cpp overwrites the dropped space with NUL in place, so the character after it
    # sees a NUL, not a space, as its predecessor; `m` keeps that)
    m, out = bytearray(out), bytearray(out[:1])
    i = 1
    while i < len(m):
        if m[i] == 0x27 and i + 1 < len(m) and m[i - 1] == 0x20 and m[i + 1] == 0x20:
            out.pop()
            out.append(m[i])
            m[i + 1] = 0
            i += 2
            continue
        out.append(m[i])
        i += 1
    # pass 3: " 's", " 'm", " 're", " 've" lose the space
    b, out = bytes(out), bytearray(out[:1])
    for i in range(1, len(b)):
        if b[i - 1] == 0x20 and b[i] == 0x27 and i + 1 < len(b):
            x1 = b[i + 1]
            if x1 in b"sm" or (i + 2 < len(b) and b[i + 1:i + 3] in (b"re", b"ve")):
                out.pop()
        out.append(b[i])
    return bytes(out)


def _charsmap_bytes(g) -> bytes | None:
    """tokenizer.ggml.precompiled_charsmap as bytes (load(), t5: optional; an array of int8
    or uint8, else "invalid gguf type"); ugm.CharsMap checks its layout."""
    from minfer.tokenizer.ugm import CHARSMAP_KEY

    raw = g.get(CHARSMAP_KEY)
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(type(x) is int and -128 <= x <= 255 for x in raw):
        raise MinferError(f"{g.path}: {CHARSMAP_KEY} is not an array of bytes (int8 or uint8); "
                          "expected SentencePiece's precompiled normalization map")
    return bytes(x & 0xFF for x in raw)


class StreamDecoder:
    """Token ids in, text out, never splitting a UTF-8 character.

    Bytes of an incomplete character (e.g. the first <0xF0> byte token of an emoji) are held
    back until the token that completes it arrives; bytes that can never form a character
    come out as U+FFFD.
    """

    def __init__(self, tok: "Tokenizer", skip_special: bool = False):
        self._tok = tok
        self._skip = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._utf8.decode(self._tok.piece_bytes(token_id, self._skip))

    def flush(self) -> str:
        """What is still held back (an unfinished character becomes U+FFFD); then reset."""
        out = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return out


class Tokenizer:
    """A GGUF vocab: encode/decode as llama.cpp, special ids, chat template."""

    def __init__(self, path: str, kind: str, tokens: list[str], token_types: list[int] | None,
                 meta: dict, chat_template: str | None, *, merges: list[str] | None = None,
                 pre_name: str | None = None, scores: list[float] | None = None,
                 model_name: str = "", arch: str = "", charsmap: bytes | None = None,
                 whitespace_session: bool = False):
        self.path = path
        self.kind = kind  # 'bpe' (gpt2, whitespace), 'gemma4', 'spm' (llama), 'wpm' (bert) or 'ugm' (t5)
        self.pre_name = pre_name
        self._texts = V.token_texts(tokens)
        if kind == "ugm":
            # load(), tokenizer_model "t5": default special ids eos 1, unk 2, pad 0 (no BOS);
            # a key that is missing or out of the vocab keeps the default (vocab.DEFAULT_IDS
            # has no UGM row: the defaults go in here, with no other defaults ("gemma4"'s))
            sp_meta = dict(meta)
            for key, d in (("eos_token_id", 1), ("unknown_token_id", 2), ("padding_token_id", 0)):
                v = meta.get(key)
                if v is None or not 0 <= int(v) < len(self._texts):
                    sp_meta[key] = d
            sp = V.derive_special(self._texts, token_types, sp_meta, "gemma4", model_name, arch)
        else:  # (vocab.derive_special sets the per-name attributes too: <mask>'s LSTRIP, Phi-3's RSTRIP)
            sp = V.derive_special(self._texts, token_types, meta, kind, model_name, arch)
        self._attrs = sp.attrs
        self._ids = sp.ids
        self.eog_ids: set[int] = set(sp.eog)
        self._partition_order = [(i, self._texts[i]) for i in sp.partition_order]
        self.turn_markers: frozenset[int] = sp.turn_markers   # vocab.SpecialIds.turn_markers
        # load(): per-type defaults, then the metadata (add_bos_token, add_eos_token,
        # add_space_prefix) overrides them
        rules: PreRules | None = PRE_TYPES.get(pre_name) if pre_name is not None else None
        if rules is not None and rules.no_default_bos and meta.get("bos_token_id") is None:
            self._ids["bos"] = None
        default_bos = {"spm": True, "wpm": True, "bpe": bool(rules and rules.add_bos),
                       "gemma4": False, "ugm": False}[kind]
        add_bos, add_eos = meta.get("add_bos_token"), meta.get("add_eos_token")
        self.add_bos = default_bos if add_bos is None else bool(add_bos)
        if rules is PRE_TYPES["gemma4"]:
            self.add_bos = True  # "workaround for Gemma 4" (llama.cpp PR 21500)
        # load(): UGM's default is add_eos on (T5 ends its input with </s>), the others off
        self.add_eos = (kind == "ugm") if add_eos is None else bool(add_eos)
        # llama_vocab_get_add_sep: on for WordPiece and the BPE pres jina-v1-en / jina-v2-code /
        # roberta-bpe (pretok.py), tokenizer.ggml.add_sep_token overriding it ("Handle add_bos,
        # add_eos and add_sep"). Encoding never reads it: the rerank pair layout does
        # (runtime/embed.py pair_ids, as llama-server's format_prompt_rerank: the key, else this default).
        add_sep = meta.get("add_sep_token")
        self.add_sep_default = kind == "wpm" or (kind == "bpe" and bool(rules and rules.add_sep))
        self.add_sep = self.add_sep_default if add_sep is None else bool(add_sep)
        prefix = meta.get("add_space_prefix")
        # SPM's default is on (UGM's off); BPE reads the key too (only decoding uses it)
        self.add_space_prefix = (kind == "spm") if prefix is None else bool(prefix)
        # clean_up_tokenization_spaces on decode: BPE per pre rules, WPM on, SPM and UGM off
        self._clean = {"spm": False, "wpm": True, "ugm": False}.get(
            kind, bool(rules and rules.clean_spaces))
        self.chat_template = chat_template
        self._pieces: dict[tuple[int, bool], bytes] = {}
        if kind in ("bpe", "gemma4"):
            from minfer.tokenizer.bpe import BPEModel

            assert rules is not None and merges is not None
            # the 'whitespace' model's session lowercases as normalizer_opts.lowercase says: pre
            # 'whitespace' sets it false, tokenizer.ggml.normalizer.lowercase overrides (load())
            lower = meta.get("normalizer.lowercase")
            self._model = BPEModel(path, self._texts, sp.by_text, merges, rules, whitespace_session,
                                   bool(lower) if whitespace_session and lower is not None else False)
        elif kind == "spm":
            from minfer.tokenizer.spm import SPMModel

            self._model = SPMModel(path, sp.by_text, scores or [0.0] * len(self._texts))
        elif kind == "ugm":
            from minfer.tokenizer.ugm import UGMModel

            assert scores is not None
            self._model = UGMModel(
                path, self._texts, token_types, scores,
                [bool(a & V.ATTR_USER_DEFINED) for a in sp.attrs], self._ids["unk"], charsmap,
                add_space_prefix=self.add_space_prefix,
                # load(): tokenizer.ggml.remove_extra_whitespaces, default off;
                # escape_whitespaces (on) and treat_whitespace_as_suffix (off) are not read
                # from the file for UGM
                remove_extra_whitespaces=bool(meta.get("remove_extra_whitespaces", False)))
        else:
            from minfer.tokenizer.wpm import WPMModel

            lower = meta.get("normalizer.lowercase")
            lower = True if lower is None else bool(lower)
            strip = meta.get("normalizer.strip_accents")
            self._model = WPMModel(path, self._texts, sp.by_text, self._ids["unk"], lower,
                                   lower if strip is None else bool(strip))

    # ---- construction ----
    @classmethod
    def from_gguf(cls, gguf_file) -> "Tokenizer":
        """From a minfer.gguf_file.GGUFFile (tokenizer.ggml.* and tokenizer.chat_template)."""
        from minfer.safe_text import quoted  # values from the file: escaped in messages

        g = gguf_file
        model = g.get("tokenizer.ggml.model")
        if model is None:
            raise MinferError(f"{g.path}: metadata key 'tokenizer.ggml.model' is missing; "
                              "the file carries no tokenizer")
        pre = g.get("tokenizer.ggml.pre")
        if model not in MODELS:
            raise MinferError(
                f"{g.path}: tokenizer.ggml.model is {quoted(model)} (tokenizer.ggml.pre {quoted(pre)}), a "
                f"vocab type minfer does not implement (known: {', '.join(MODELS)}: byte-level "
                "BPE, Gemma 4 BPE, SentencePiece, WordPiece, SentencePiece Unigram, whitespace-split BPE)")
        if model == "t5" and g.get("tokenizer.ggml.scores") is None:
            # llama.cpp scores every token 0 then, which is not the model's tokenization
            raise MinferError(
                f"{g.path}: tokenizer.ggml.model is 't5' (tokenizer.ggml.pre {quoted(pre)}), a "
                "SentencePiece Unigram vocab, but tokenizer.ggml.scores is missing: minfer does not "
                "implement a Unigram vocab without its token scores (one float per token)")
        tokens = g.require("tokenizer.ggml.tokens")
        types = g.get("tokenizer.ggml.token_type")
        if types is not None and len(types) < len(tokens):
            raise MinferError(f"{g.path}: tokenizer.ggml.token_type has {len(types)} entries, "
                              f"expected {len(tokens)} (one per token)")
        meta = {k[len("tokenizer.ggml."):]: v for k, v in g.metadata.items()
                if k.startswith("tokenizer.ggml.") and not isinstance(v, list)}
        for k, v in meta.items():  # the scalar keys read below, typed as llama.cpp reads them
            want = int if k.endswith("_token_id") else bool if k.startswith(("add_", "normalizer.")) \
                or k == "remove_extra_whitespaces" else None
            if want is not None and (type(v) is not want):
                shown = quoted(v) if isinstance(v, str) else repr(v)
                raise MinferError(f"{g.path}: tokenizer.ggml.{k} is {shown}; expected "
                                  f"{'an integer token id' if want is int else 'a bool'}")
        tmpl = g.get("tokenizer.chat_template")
        kw: dict = {"model_name": str(g.get("general.name") or ""),
                    "arch": str(g.get("general.architecture") or "")}
        if (model == "whitespace") != (pre == "whitespace") and model in ("gpt2", "whitespace"):
            # load(): a 'whitespace' model takes the pre chain as 'gpt2' does, its session cutting at
            # White_Space first; minfer implements only the pair llama.cpp's converter writes
            # (_set_vocab_whitespace pins both). Pre 'whitespace' under 'gpt2' hands white space runs to
            # the raw-UTF-8 BPE, where llama.cpp aborts on a space next to another symbol (find_bpe_rank:
            # GGML_ASSERT(token_left.find(' ') == npos))
            raise MinferError(
                f"{g.path}: tokenizer.ggml.model is {quoted(model)} with tokenizer.ggml.pre {quoted(pre)}; "
                "minfer implements the 'whitespace' model and pre together only (what llama.cpp's converter "
                "writes for jina-embeddings-v2-base-zh; llama.cpp itself aborts on pre 'whitespace' under "
                "'gpt2' at a run of white space)")
        if model in ("gpt2", "whitespace"):
            if pre is None:
                raise MinferError(f"{g.path}: metadata key 'tokenizer.ggml.pre' is missing; "
                                  "minfer needs it to choose the pre-tokenizer rules")
            if pre not in PRE_TYPES:
                raise MinferError(
                    f"{g.path}: tokenizer.ggml.pre is {quoted(pre)} (tokenizer.ggml.model 'gpt2'), a "
                    f"pre-tokenizer minfer does not implement (known: "
                    f"{', '.join(sorted(PRE_TYPES))}); refusing to "
                    "guess its splitting rules")
            kind = "bpe"
            # load(): a kimi-k2 file may lack merges (then no pair merges, as llama.cpp's
            # "Kimi-K2 tokenizer detected, skipping BPE merges")
            merges = g.get("tokenizer.ggml.merges") if pre == "kimi-k2" else \
                g.require("tokenizer.ggml.merges")
            kw.update(merges=list(merges or []), pre_name=str(pre), whitespace_session=model == "whitespace")
        elif model == "gemma4":
            # load(): the gemma4 model sets its own pre, whatever the file says
            kind = "gemma4"
            kw.update(merges=list(g.require("tokenizer.ggml.merges")), pre_name="gemma4")
        elif model in ("llama", "t5"):
            kind = "spm" if model == "llama" else "ugm"
            scores = g.get("tokenizer.ggml.scores")
            if scores is not None and len(scores) < len(tokens):
                raise MinferError(f"{g.path}: tokenizer.ggml.scores has {len(scores)} entries, "
                                  f"expected {len(tokens)} (one per token)")
            if scores is not None and not all(isinstance(x, (int, float)) for x in scores):
                raise MinferError(f"{g.path}: tokenizer.ggml.scores holds a non-number; expected "
                                  "one float per token")
            kw.update(scores=[float(s) for s in scores] if scores is not None else None)
            if model == "t5":
                kw.update(charsmap=_charsmap_bytes(g))
        else:
            kind = "wpm"
        return cls(str(g.path), kind, list(tokens), types, meta,
                   tmpl if isinstance(tmpl, str) else None, **kw)

    # ---- properties ----
    @property
    def n_vocab(self) -> int:
        return len(self._texts)

    @property
    def bos_id(self) -> int | None:
        return self._ids["bos"]

    @property
    def eos_id(self) -> int | None:
        return self._ids["eos"]

    @property
    def sep_id(self) -> int | None:
        return self._ids["sep"]

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.eog_ids

    def token_text(self, token_id: int) -> str:
        """The vocab entry as stored in the GGUF (e.g. 'Ġthe', '▁the')."""
        return self._texts[token_id]

    def token_attr(self, token_id: int) -> int:
        """llama.cpp's attribute bits for a token (vocab.ATTR_*)."""
        return self._attrs[token_id]

    @property
    def bos_text(self) -> str:
        return self._texts[self.bos_id] if self.bos_id is not None else ""

    @property
    def eos_text(self) -> str:
        return self._texts[self.eos_id] if self.eos_id is not None else ""

    # ---- encode ----
    def _partition(self, text: str, parse_special: bool, plain: frozenset[int] = frozenset()) -> list[str | int]:
        """Cut text at special-token texts (llama-vocab.cpp: tokenizer_st_partition); the ids
        in `plain` stay text too when not parse_special."""
        frags: list[str | int] = [text] if text else []
        # every fragment is a piece of `text`: a token whose text `text` lacks is skipped in
        # one C-level search (Gemma 3 has 6,414 special tokens)
        present = [(tid, t) for tid, t in self._partition_order if t in text]
        for tid, ttext in present:
            attr = self._attrs[tid]
            if not parse_special and (attr & (V.ATTR_CONTROL | V.ATTR_UNKNOWN) or tid in plain):
                continue
            if not any(isinstance(f, str) and ttext in f for f in frags):
                continue
            out: list[str | int] = []
            for f in frags:
                if isinstance(f, int) or ttext not in f:
                    out.append(f)
                    continue
                parts = f.split(ttext)  # left-to-right, non-overlapping
                for k, part in enumerate(parts):
                    if k:
                        out.append(tid)
                        if attr & V.ATTR_RSTRIP:
                            part = part.lstrip(_WS)
                    if k < len(parts) - 1 and attr & V.ATTR_LSTRIP:
                        part = part.rstrip(_WS)
                    if part:
                        out.append(part)
            frags = out
        return frags

    def encode(self, text: str, add_bos: bool | None = None, parse_special: bool = True) -> list[int]:
        """Token ids of `text`, as llama.cpp's llama_tokenize(add_special, parse_special).

        add_bos None: add BOS (and EOS, or WordPiece's SEP) as the metadata says (llama.cpp's
        add_special=true); True: always start with BOS; False: neither BOS nor EOS.
        """
        return self._encode_frags(self._partition(text, parse_special), add_bos)

    def encode_segments(self, segments: list[tuple[str, bool]], add_bos: bool | None = None) -> list[int]:
        """encode() of the joined texts, where each (text, parse_special) segment decides alone
        whether control-token texts in it become control tokens (the server: a client's
        message content stays text, the chat template's own markers are tokens; harmony's
        user-defined turn markers, `turn_markers`, count as control tokens here). Plain text
        of neighbouring segments is joined before tokenizing, so the ids equal encode(joined)
        whenever no control-token text is in a parse_special=False segment."""
        frags: list[str | int] = []
        for text, special in segments:
            for f in self._partition(text, special, self.turn_markers):
                if isinstance(f, str) and frags and isinstance(frags[-1], str):
                    frags[-1] += f
                else:
                    frags.append(f)
        return self._encode_frags(frags, add_bos)

    def _encode_frags(self, frags: list[str | int], add_bos: bool | None) -> list[int]:
        ids: list[int] = []
        want_bos = (self.add_bos if add_bos is None else add_bos) or \
            (add_bos is None and self.kind == "wpm")  # WPM: BOS whenever add_special
        if want_bos:
            if self.bos_id is None:
                raise MinferError(f"{self.path}: a BOS token was asked for, but the vocab has "
                                  "no tokenizer.ggml.bos_token_id")
            ids.append(self.bos_id)
        if self.kind == "spm":
            ids.extend(self._encode_spm(frags))
        elif self.kind in ("bpe", "gemma4"):
            raw = iter(self._model.encode_batch([f for f in frags if isinstance(f, str)]))
            for f in frags:
                ids.extend((f,) if isinstance(f, int) else next(raw))
        else:
            for f in frags:
                ids.extend((f,) if isinstance(f, int) else self._model.encode(f))
        if add_bos is None:
            if self.kind == "wpm":
                if self.sep_id is None:
                    raise MinferError(f"{self.path}: WordPiece ends a text with the separator "
                                      "token, but the vocab has no tokenizer.ggml.seperator_token_id")
                ids.append(self.sep_id)
            elif self.add_eos and self.eos_id is not None:
                ids.append(self.eos_id)
        return ids

    def _encode_spm(self, frags: list[str | int]) -> list[int]:
        # impl::tokenize, SPM case: "prefix with space if previous is special" -- the first
        # fragment counts as following a special token; spaces -> U+2581 (llama_escape_whitespace)
        out: list[int] = []
        prev_special = True
        for f in frags:
            if isinstance(f, int):
                out.append(f)
                prev_special = True
                continue
            text = " " + f if self.add_space_prefix and prev_special else f
            out.extend(self._model.encode(text.replace(" ", "\u2581")))
            prev_special = False
        return out

    # ---- decode ----
    def piece_bytes(self, token_id: int, skip_special: bool = False) -> bytes:
        """The bytes a token renders to (llama-vocab.cpp: token_to_piece, lstrip=0).

        skip_special=True is llama.cpp's special=false: control and unknown tokens render
        as nothing; user-defined tokens still render as their text.
        """
        key = (token_id, skip_special)
        p = self._pieces.get(key)
        if p is not None:
            return p
        if not 0 <= token_id < len(self._texts):
            raise MinferError(f"{self.path}: token id {token_id} is outside the vocab "
                              f"(0..{len(self._texts) - 1})")
        attr, text = self._attrs[token_id], self._texts[token_id]
        if skip_special and attr & (V.ATTR_UNKNOWN | V.ATTR_CONTROL):
            p = b""
        elif attr & (V.ATTR_UNKNOWN | V.ATTR_CONTROL | V.ATTR_USER_DEFINED):
            p = text.encode("utf-8")
        elif attr & V.ATTR_NORMAL:
            if self.kind == "bpe":
                p = self._model.normal_piece(text)
            else:  # SPM, WPM and gemma4 spell spaces as U+2581 (llama_unescape_whitespace)
                p = text.replace("\u2581", " ").encode("utf-8")
        elif attr & V.ATTR_BYTE:  # "<0xXX>" byte tokens (token_to_byte)
            p = bytes([int(text[3:5], 16)])
        else:  # unused / undefined tokens render as nothing
            p = b""
        self._pieces[key] = p
        return p

    def piece(self, token_id: int, skip_special: bool = False) -> str:
        """One token's text; a partial UTF-8 character shows as backslash escapes."""
        return self.piece_bytes(token_id, skip_special).decode("utf-8", errors="backslashreplace")

    def decode(self, ids, skip_special: bool = False) -> str:
        """Text of token ids, as llama.cpp's llama_detokenize(remove_special=false,
        unparse_special=not skip_special): with tokenizer.ggml.add_space_prefix (SPM's
        default), one leading space dropped from the first token; the clean-up of spaces
        before punctuation for the types that enable it (BPE pre types that do, WordPiece).
        The stream decoder does neither (it is token_to_piece, token by token).
        Invalid UTF-8 becomes U+FFFD."""
        pieces = [self.piece_bytes(int(i), skip_special) for i in ids]
        if pieces and self.add_space_prefix and pieces[0][:1] == b" ":
            pieces[0] = pieces[0][1:]  # detokenize(): token_to_piece(lstrip=add_space_prefix)
        b = b"".join(pieces)
        if self._clean:
            b = clean_spaces(b)
        return b.decode("utf-8", errors="replace")

    def stream_decoder(self, skip_special: bool = False) -> StreamDecoder:
        """An incremental decoder: .push(id) -> str (complete characters only), .flush()."""
        return StreamDecoder(self, skip_special)

    # ---- chat ----
    @property
    def chat_format(self) -> str:
        """'gguf' when the file has a template, else the fallback's name (templates.py)."""
        return "gguf" if self.chat_template else self._fallback()[0]

    def _fallback(self) -> tuple[str, str]:
        if not hasattr(self, "_fallback_tmpl"):
            from minfer.tokenizer.templates import fallback_template

            self._fallback_tmpl = fallback_template({t for _, t in self._partition_order})
        return self._fallback_tmpl

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            **extra) -> str:
        """Render messages with the GGUF's template; a file without one gets its family's
        llama.cpp format, chosen by the turn markers of its vocab (templates.py), or ChatML."""
        from minfer.tokenizer.chat_template import render_chat

        if self.chat_template:
            tmpl, source = self.chat_template, f"{self.path}: tokenizer.chat_template"
        else:
            name, tmpl = self._fallback()
            source = f"minfer's {name} chat format (the GGUF {self.path} has no tokenizer.chat_template)"
        return render_chat(tmpl, messages, add_generation_prompt=add_generation_prompt,
                           bos_token=self.bos_text, eos_token=self.eos_text, source=source, **extra)
