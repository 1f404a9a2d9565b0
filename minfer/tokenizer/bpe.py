"""Byte-level BPE tokenizer built from a GGUF vocab (tokenizer.ggml.model == 'gpt2').

The merges run on HuggingFace `tokenizers`; minfer supplies what llama.cpp does around them,
so that token ids match llama.cpp's `llama_tokenize` exactly:

1. special-token partition (llama-vocab.cpp: tokenizer_st_partition): the text is cut at
   every occurrence of a control / user-defined token text, longest texts first; those
   pieces become their ids directly and never reach the BPE. With parse_special=False,
   control tokens are left in the text as plain characters, but user-defined tokens (type 4,
   e.g. Qwen's <tool_call>) are still matched, as llama.cpp (and HF tokenizers) do;
2. the pre-tokenizer regexes of `tokenizer.ggml.pre` (llama-vocab.cpp: llm_tokenizer_bpe
   constructor), applied in sequence, each keeping unmatched text as its own piece;
3. GPT-2 byte-to-unicode mapping, then BPE merges by rank (`ignore_merges` for llama3:
   a whole pre-token found in the vocab is taken as one token).

Decoding renders each token as llama.cpp's token_to_piece does: normal tokens through the
byte-level map, control/user-defined tokens as their text (control tokens dropped when
skip_special=True), unused tokens as nothing.
"""

from __future__ import annotations

import codecs

from minfer.errors import MinferError
from minfer.tokenizer import vocab as V

# ---- pre-tokenizer rules per tokenizer.ggml.pre (llama-vocab.cpp, commit 0c1e57098) ----
# The regexes are llama.cpp's "adapted" forms (case-insensitive contractions spelled out).
_GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_RE = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
              r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_RE = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
             r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


class _Pre:
    def __init__(self, regexes: list[str], ignore_merges: bool = False, clean_spaces: bool = True,
                 add_bos: bool = False):
        self.regexes = regexes
        self.ignore_merges = ignore_merges
        # clean_up_tokenization_spaces in detokenize(): llama.cpp's default for BPE is true,
        # and the pre types below that set `clean_spaces = false` say so
        self.clean_spaces = clean_spaces
        self.add_bos = add_bos  # default before tokenizer.ggml.add_bos_token overrides it


_LLAMA3 = _Pre([_LLAMA3_RE], ignore_merges=True, clean_spaces=True, add_bos=True)
_QWEN2 = _Pre([_QWEN2_RE], clean_spaces=False)
_SMOLLM = _Pre([r"\p{N}", _GPT2_RE], clean_spaces=False)  # case SMOLLM: each digit alone first
_GPT2 = _Pre([_GPT2_RE], clean_spaces=True)

# tokenizer.ggml.pre value -> rules, for the names llama.cpp maps to these four pre types.
# llama.cpp spells GPT-2's pre "gpt-2"; any other name is refused rather than guessed.
PRE_TYPES: dict[str, _Pre] = {
    "llama3": _LLAMA3, "llama-v3": _LLAMA3, "llama-bpe": _LLAMA3, "falcon3": _LLAMA3,
    "qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2,
    "megrez": _Pre([_QWEN2_RE], clean_spaces=True),  # QWEN2 rules, clean_spaces left on
    "smollm": _SMOLLM,
    "gpt-2": _GPT2, "phi-2": _GPT2,
}


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
# because no byte-level token contains U+E000 (private use, outside the byte alphabet)
_MISSING_TEXT = "\ue000minfer-missing\ue000"

_BYTE_TO_CHAR = bytes_to_unicode()
_CHAR_TO_BYTE = {c: b for b, c in _BYTE_TO_CHAR.items()}


def _decode_byte_level(text: str) -> bytes:
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


def _clean_spaces(b: bytes) -> bytes:
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


class StreamDecoder:
    """Token ids in, text out, never splitting a UTF-8 character.

    Bytes of an incomplete character are held back until the token that completes it
    arrives; bytes that can never form a character come out as U+FFFD.
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
    """A GGUF byte-level BPE vocab: encode/decode as llama.cpp, special ids, chat template."""

    def __init__(self, path: str, tokens: list[str], merges: list[str], pre_name: str,
                 token_types: list[int] | None, meta: dict, chat_template: str | None):
        if pre_name not in PRE_TYPES:
            raise MinferError(
                f"{path}: tokenizer.ggml.pre is '{pre_name}', a pre-tokenizer minfer does not "
                f"implement (known: {', '.join(sorted(PRE_TYPES))}); refusing to guess its "
                "splitting rules")
        self.path = path
        self.pre_name = pre_name
        self._pre = PRE_TYPES[pre_name]
        self._texts = V.token_texts(tokens)
        sp = V.derive_special(self._texts, token_types, meta)
        self._attrs = sp.attrs
        self._ids = sp.ids
        self.eog_ids: set[int] = set(sp.eog)
        self._partition_order = [(i, self._texts[i]) for i in sp.partition_order]
        add_bos = meta.get("add_bos_token")
        add_eos = meta.get("add_eos_token")
        self.add_bos = self._pre.add_bos if add_bos is None else bool(add_bos)
        self.add_eos = False if add_eos is None else bool(add_eos)
        # read for every vocab type by llama.cpp; for BPE it only matters when decoding
        self._strip_first_space = bool(meta.get("add_space_prefix", False))
        self.chat_template = chat_template
        self._hf = self._build_hf(path, merges)
        self._pieces: dict[tuple[int, bool], bytes] = {}

    # ---- construction ----
    @classmethod
    def from_gguf(cls, gguf_file) -> "Tokenizer":
        """From a minfer.gguf_file.GGUFFile (tokenizer.ggml.* and tokenizer.chat_template)."""
        g = gguf_file
        model = g.get("tokenizer.ggml.model")
        if model is None:
            raise MinferError(f"{g.path}: metadata key 'tokenizer.ggml.model' is missing; "
                              "the file carries no tokenizer")
        if model != "gpt2":
            raise MinferError(f"{g.path}: tokenizer.ggml.model is '{model}'; minfer implements "
                              "only byte-level BPE ('gpt2')")
        tokens = g.require("tokenizer.ggml.tokens")
        merges = g.require("tokenizer.ggml.merges")
        pre = g.get("tokenizer.ggml.pre")
        if pre is None:
            raise MinferError(f"{g.path}: metadata key 'tokenizer.ggml.pre' is missing; minfer "
                              "needs it to choose the pre-tokenizer rules")
        types = g.get("tokenizer.ggml.token_type")
        if types is not None and len(types) < len(tokens):
            raise MinferError(f"{g.path}: tokenizer.ggml.token_type has {len(types)} entries, "
                              f"expected {len(tokens)} (one per token)")
        meta = {k[len("tokenizer.ggml."):]: v for k, v in g.metadata.items()
                if k.startswith("tokenizer.ggml.") and not isinstance(v, list)}
        tmpl = g.get("tokenizer.chat_template")
        return cls(str(g.path), list(tokens), list(merges), str(pre), types, meta,
                   tmpl if isinstance(tmpl, str) else None)

    def _build_hf(self, path: str, merges: list[str]):
        from tokenizers import Regex, Tokenizer as HFTokenizer, models, pre_tokenizers

        vocab: dict[str, int] = {}
        for i, t in enumerate(self._texts):
            vocab[t] = i  # last id wins for a duplicated text, as in llama.cpp's token_to_id
        pairs = []
        for k, m in enumerate(merges):
            parts = m.split(" ")
            if len(parts) != 2:
                raise MinferError(f"{path}: tokenizer.ggml.merges[{k}] is {m!r}; expected two "
                                  "symbols separated by one space")
            pairs.append((parts[0], parts[1]))
        # A character the vocab lacks (SmolLM2 has no token for byte 0x04 or the UTF-8 lead
        # byte F1, e.g.) stays a symbol of its own in llama.cpp's BPE, so the bytes around it
        # never merge across it, and is then dropped (llm_tokenizer_bpe_session::tokenize:
        # text_to_token fails for its bytes). HF's BPE would skip it and merge its neighbours;
        # an out-of-vocab placeholder id, filtered from the output, keeps llama.cpp's result.
        vocab[_MISSING_TEXT] = self._missing_id = len(self._texts)
        try:
            bpe = models.BPE(vocab=vocab, merges=pairs, ignore_merges=self._pre.ignore_merges,
                             unk_token=_MISSING_TEXT, fuse_unk=False)
        except Exception as e:  # tokenizers raises its own exception type on bad merges
            raise MinferError(f"{path}: the GGUF vocab/merges do not form a BPE model: {e}") from e
        hf = HFTokenizer(bpe)
        # each regex in turn; 'isolated' keeps the unmatched text as pieces of its own, as
        # llama.cpp's unicode_regex_split does
        steps = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in self._pre.regexes]
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
        hf.pre_tokenizer = pre_tokenizers.Sequence(steps)
        return hf

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

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.eog_ids

    def token_text(self, token_id: int) -> str:
        """The vocab entry as stored in the GGUF (byte-level characters, e.g. 'Ġthe')."""
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
    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Cut text at special-token texts (llama-vocab.cpp: tokenizer_st_partition)."""
        frags: list[str | int] = [text] if text else []
        for tid, ttext in self._partition_order:
            if not parse_special and self._attrs[tid] & (V.ATTR_CONTROL | V.ATTR_UNKNOWN):
                continue
            if not any(isinstance(f, str) and ttext in f for f in frags):
                continue
            out: list[str | int] = []
            for f in frags:
                if isinstance(f, int) or ttext not in f:
                    out.append(f)
                    continue
                for k, part in enumerate(f.split(ttext)):  # left-to-right, non-overlapping
                    if k:
                        out.append(tid)
                    if part:
                        out.append(part)
            frags = out
        return frags

    def encode(self, text: str, add_bos: bool | None = None, parse_special: bool = True) -> list[int]:
        """Token ids of `text`, as llama.cpp's llama_tokenize(add_special, parse_special).

        add_bos None: add BOS (and EOS) as the metadata says (tokenizer.ggml.add_bos_token /
        add_eos_token; llama.cpp's add_special=true); True: always start with BOS;
        False: neither BOS nor EOS.
        """
        return self._encode_frags(self._partition(text, parse_special), add_bos)

    def encode_segments(self, segments: list[tuple[str, bool]], add_bos: bool | None = None) -> list[int]:
        """encode() of the joined texts, where each (text, parse_special) segment decides alone
        whether control-token texts in it become control tokens (the server: a client's
        message content stays text, the chat template's own markers are tokens). Plain text
        of neighbouring segments is joined before the BPE, so the ids equal encode(joined)
        whenever no control-token text is in a parse_special=False segment."""
        frags: list[str | int] = []
        for text, special in segments:
            for f in self._partition(text, special):
                if isinstance(f, str) and frags and isinstance(frags[-1], str):
                    frags[-1] += f
                else:
                    frags.append(f)
        return self._encode_frags(frags, add_bos)

    def _encode_frags(self, frags: list[str | int], add_bos: bool | None) -> list[int]:
        raw = [f for f in frags if isinstance(f, str)]
        encoded = iter(self._hf.encode_batch(raw, add_special_tokens=False)) if raw else iter(())
        ids: list[int] = []
        want_bos = self.add_bos if add_bos is None else add_bos
        if want_bos:
            if self.bos_id is None:
                raise MinferError(f"{self.path}: a BOS token was asked for, but the vocab has "
                                  "no tokenizer.ggml.bos_token_id")
            ids.append(self.bos_id)
        missing = self._missing_id
        for f in frags:
            if isinstance(f, int):
                ids.append(f)
            else:
                ids.extend(i for i in next(encoded).ids if i != missing)
        if add_bos is None and self.add_eos and self.eos_id is not None:
            ids.append(self.eos_id)
        return ids

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
            p = _decode_byte_level(text)
        elif attr & V.ATTR_BYTE:  # "<0xXX>" byte tokens (token_to_byte, BPE case)
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
        unparse_special=not skip_special), including its clean-up of spaces before
        punctuation for the pre types that enable it (not qwen2 or smollm) and, when
        tokenizer.ggml.add_space_prefix is set, one leading space dropped from the first
        token. The stream decoder does neither (it is token_to_piece, token by token).
        Invalid UTF-8 becomes U+FFFD."""
        pieces = [self.piece_bytes(int(i), skip_special) for i in ids]
        if pieces and self._strip_first_space and pieces[0][:1] == b" ":
            pieces[0] = pieces[0][1:]  # detokenize(): token_to_piece(lstrip=add_space_prefix)
        b = b"".join(pieces)
        if self._pre.clean_spaces:
            b = _clean_spaces(b)
        return b.decode("utf-8", errors="replace")

    def stream_decoder(self, skip_special: bool = False) -> StreamDecoder:
        """An incremental decoder: .push(id) -> str (complete characters only), .flush()."""
        return StreamDecoder(self, skip_special)

    # ---- chat ----
    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            **extra) -> str:
        """Render messages with the GGUF's template (ChatML when the file has none)."""
        from minfer.tokenizer.chat_template import CHATML_TEMPLATE, render_chat

        return render_chat(self.chat_template or CHATML_TEMPLATE, messages,
                           add_generation_prompt=add_generation_prompt,
                           bos_token=self.bos_text, eos_token=self.eos_text,
                           source=f"{self.path}: tokenizer.chat_template", **extra)
