"""decode(encode(s)) == s, and the stream decoder never emits a broken UTF-8 character."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from conftest import CATALOG_MODELS, load_golden


def _single_byte_tokens(tok) -> dict[int, int]:
    """byte -> id of a normal token that is exactly that byte, or else its <0xXX> byte token
    (SentencePiece's byte fallback)."""
    single: dict[int, int] = {}
    for i in sorted(range(tok.n_vocab), key=lambda i: tok.token_attr(i) != 4):
        b = tok.piece_bytes(i)
        if len(b) == 1 and tok.token_attr(i) in (4, 32):  # NORMAL, BYTE
            single.setdefault(b[0], i)
    return single


_REPRESENTABLE: dict[int, set[int]] = {}


def _representable(tok) -> set[int]:
    # a vocab without a token for some byte cannot encode text holding that byte: llama.cpp
    # drops it (SmolLM2 lacks 0x04, 0x06, ... and the UTF-8 lead bytes F1-F7, see goldens)
    if id(tok) not in _REPRESENTABLE:
        _REPRESENTABLE[id(tok)] = set(_single_byte_tokens(tok))
    return _REPRESENTABLE[id(tok)]


def test_vocab_byte_coverage(tokenizers):
    assert len(_representable(tokenizers("qwen2.5-coder-0.5b-instruct"))) == 256
    missing = set(range(256)) - _representable(tokenizers("smollm2-135m-instruct"))
    assert {0x04, 0xF1} <= missing and len(missing) == 21


@pytest.mark.parametrize("name", CATALOG_MODELS)
@pytest.mark.parametrize("parse_special", [True, False])
def test_roundtrip_golden_strings(name, parse_special, tokenizers):
    # qwen2 and smollm do not clean up spaces on decode, so the text comes back unchanged
    tok = tokenizers(name)
    n = 0
    for c in load_golden(name)["cases"]:
        if set(c["text"].encode()) <= _representable(tok):
            n += 1
            assert tok.decode(tok.encode(c["text"], add_bos=False, parse_special=parse_special)) == c["text"]
    assert n > 170


_TEXT = st.lists(st.one_of(
    st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=4),
    st.sampled_from([" ", "  ", "\n", "\t", "'s", "'ll", "<|im_start|>", "<|im_end|>", "😀",
                     "👨\u200d👩\u200d👧", "e\u0301", "123", "你好"])), max_size=20).map("".join)


@pytest.mark.parametrize("name", CATALOG_MODELS)
def test_roundtrip_random_text(name, tokenizers):
    tok = tokenizers(name)

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(_TEXT)
    def check(s):
        assume(set(s.encode()) <= _representable(tok))
        assert tok.decode(tok.encode(s, add_bos=False)) == s
        assert tok.decode(tok.encode(s, add_bos=False, parse_special=False)) == s

    check()


def _stream(tok, ids, skip_special=False):
    dec = tok.stream_decoder(skip_special=skip_special)
    chunks = [dec.push(i) for i in ids]
    return chunks, dec.flush()


@pytest.mark.parametrize("name", CATALOG_MODELS)
def test_stream_equals_decode_and_never_breaks_characters(name, tokenizers):
    tok = tokenizers(name)
    for c in load_golden(name)["cases"]:
        chunks, tail = _stream(tok, c["ids"])
        assert "".join(chunks) + tail == c["decode"], c["text"]
        if "\ufffd" not in c["decode"]:
            assert all("\ufffd" not in ch for ch in chunks), c["text"]
            assert tail == ""
        chunks, tail = _stream(tok, c["ids"], skip_special=True)
        assert "".join(chunks) + tail == c["decode_skip_special"], c["text"]


@pytest.mark.parametrize("name", CATALOG_MODELS)
def test_stream_holds_back_emoji_split_across_tokens(name, tokenizers):
    """Some emoji tokenize into tokens that each carry part of one character (llama.cpp's
    own pieces show it); the stream decoder emits nothing until the character is whole."""
    tok, g = tokenizers(name), load_golden(name)
    split_cases = 0
    for c in g["cases"]:
        if not any(ord(ch) > 0xFFFF for ch in c["text"]) or \
                not set(c["text"].encode()) <= _representable(tok):
            continue
        pieces = [bytes.fromhex(g["pieces_hex"][str(i)][0]) for i in c["ids"]]
        broken = []
        for p in pieces:
            try:
                p.decode("utf-8")
                broken.append(False)
            except UnicodeDecodeError:
                broken.append(True)
        if not any(broken):
            continue
        split_cases += 1
        dec = tok.stream_decoder()
        out = ""
        for tid in c["ids"]:
            chunk = dec.push(tid)
            assert "\ufffd" not in chunk
            # what has come out is always a prefix of the text, cut at a character boundary
            out += chunk
            assert c["text"].startswith(out)
        assert out + dec.flush() == c["text"]
    assert split_cases >= 3  # the goldens do contain emoji split across tokens


@pytest.mark.parametrize("name", CATALOG_MODELS)
def test_stream_byte_by_byte(name, tokenizers):
    """'😀' (F0 9F 98 80) fed as four single-byte tokens: three empty pushes, then the emoji."""
    tok = tokenizers(name)
    single = _single_byte_tokens(tok)
    dec = tok.stream_decoder()
    assert [dec.push(single[b]) for b in "😀".encode()] == ["", "", "", "😀"]
    # an incomplete character at the end comes out as U+FFFD on flush, once
    assert dec.push(single[0xE4]) == ""
    assert dec.flush() == "\ufffd"
    assert dec.flush() == ""
    # a stray continuation byte is replaced at once and does not swallow the next character
    assert dec.push(single[0x80]) + dec.push(single[ord("a")]) == "\ufffda"
