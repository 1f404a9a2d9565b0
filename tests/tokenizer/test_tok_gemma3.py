"""gemma-3-270m's SentencePiece vocab (262,144 tokens, no space prefix, byte fallback).

Reference: goldens/gemma-3-270m-sentencepiece.json.gz, Google's `sentencepiece` on the same
vocab (tools/gen_spm_goldens.py; that construction reproduces llama.cpp's ids on its
llama-spm suite file), with user-defined tokens cut out first as llama.cpp does.
"""

from __future__ import annotations

import pytest
from conftest import load_golden

from minfer.tokenizer import vocab as V

NAME = "gemma-3-270m"


@pytest.fixture(scope="module")
def tok(tokenizers):
    return tokenizers(NAME)


@pytest.fixture(scope="module")
def golden():
    return load_golden(f"{NAME}-sentencepiece")


def test_ids_match_sentencepiece(tok, golden):
    assert tok.kind == "spm" and tok.n_vocab == golden["n_vocab"] == 262144
    assert len(golden["cases"]) > 200
    bad = [c["text"] for c in golden["cases"]
           if tok.encode(c["text"], add_bos=False, parse_special=False) != c["ids_no_special"]]
    assert bad == []


def test_decode_and_stream_give_the_text_back(tok, golden):
    for c in golden["cases"]:
        ids = c["ids_no_special"]
        assert tok.decode(ids) == c["text"]  # no space prefix to strip, no clean-up (SPM)
        dec = tok.stream_decoder()
        chunks = [dec.push(i) for i in ids]
        assert "".join(chunks) + dec.flush() == c["text"]
        if "\ufffd" not in c["text"]:
            assert all("\ufffd" not in ch for ch in chunks)


def test_special_tokens(tok):
    # GGUF: bos 2, eos 1, add_bos_token true, add_space_prefix false
    assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.add_space_prefix) == (2, 1, True, False)
    ids = tok.encode("<start_of_turn>user\nHi<end_of_turn>")
    assert ids[0] == 2 and tok.token_text(ids[1]) == "<start_of_turn>"
    end = ids[-1]
    assert tok.token_text(end) == "<end_of_turn>" and tok.is_eog(end) and tok.is_eog(1)
    # user-defined whitespace runs are matched whole even with parse_special=False
    two = tok.encode("a  b", add_bos=False, parse_special=False)
    assert any(tok.token_text(i) == "  " and tok.token_attr(i) & V.ATTR_USER_DEFINED for i in two)
    assert tok.chat_template is None and tok.chat_format == "gemma"
