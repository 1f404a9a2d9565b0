"""minfer's tokenizer against llama.cpp's (goldens written by tools/gen_token_goldens.py).

Each vocab: the two catalog models (pre qwen2, smollm) and SmolLM2's vocab under the
llama3 ('llama-bpe') and GPT-2 ('gpt-2') pre-tokenizers.
"""

from __future__ import annotations

import pytest

from conftest import ALL_VOCABS, load_golden


@pytest.mark.parametrize("name", ALL_VOCABS)
def test_golden_file_is_from_llama_cpp(name):
    g = load_golden(name)
    assert g["llama_cpp"].startswith("ggml-org/llama.cpp@")
    assert len(g["cases"]) > 150


@pytest.mark.parametrize("name", ALL_VOCABS)
def test_encode_matches_llama_cpp(name, tokenizers):
    """llama_tokenize(add_special=true, parse_special=true) == encode(text)."""
    tok, g = tokenizers(name), load_golden(name)
    mismatches = [(c["text"], tok.encode(c["text"]), c["ids"]) for c in g["cases"]
                  if tok.encode(c["text"]) != c["ids"]]
    assert mismatches == []


@pytest.mark.parametrize("name", ALL_VOCABS)
def test_encode_plain_matches_llama_cpp(name, tokenizers):
    """llama_tokenize(add_special=false, parse_special=false) == encode(text, False, False)."""
    tok, g = tokenizers(name), load_golden(name)
    mismatches = [(c["text"], c["ids_no_special"]) for c in g["cases"]
                  if tok.encode(c["text"], add_bos=False, parse_special=False) != c["ids_no_special"]]
    assert mismatches == []


@pytest.mark.parametrize("name", ALL_VOCABS)
def test_decode_matches_llama_detokenize(name, tokenizers):
    tok, g = tokenizers(name), load_golden(name)
    for c in g["cases"]:
        assert tok.decode(c["ids"]) == c["decode"], c["text"]
        assert tok.decode(c["ids"], skip_special=True) == c["decode_skip_special"], c["text"]


@pytest.mark.parametrize("name", ALL_VOCABS)
def test_pieces_match_token_to_piece(name, tokenizers):
    """Per-token bytes: llama_token_to_piece with special=true and special=false."""
    tok, g = tokenizers(name), load_golden(name)
    for k, (with_special, without) in g["pieces_hex"].items():
        assert tok.piece_bytes(int(k)).hex() == with_special, k
        assert tok.piece_bytes(int(k), skip_special=True).hex() == without, k


@pytest.mark.parametrize("name", ALL_VOCABS)
def test_special_ids_and_eog_match(name, tokenizers):
    tok, g = tokenizers(name), load_golden(name)
    assert tok.n_vocab == g["n_vocab"]
    assert tok.bos_id == g["bos"]
    assert tok.eos_id == g["eos"]
    assert tok.add_bos == g["add_bos"]
    assert tok.add_eos == g["add_eos"]
    assert sorted(tok.eog_ids) == g["eog"]
    assert all(tok.is_eog(i) for i in g["eog"])
    assert not tok.is_eog(tok.encode("Hello", add_bos=False)[0])
    attrs = {str(i): tok.token_attr(i) for i in range(tok.n_vocab) if tok.token_attr(i) != 4}
    assert attrs == g["non_normal_attrs"]


def test_known_end_of_turn_tokens(tokenizers):
    """The chat models stop on <|im_end|> (and <|endoftext|>), found by llama.cpp's text rule."""
    for name in ("qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"):
        tok = tokenizers(name)
        im_end = tok.encode("<|im_end|>", add_bos=False)
        endoftext = tok.encode("<|endoftext|>", add_bos=False)
        assert len(im_end) == 1 and tok.is_eog(im_end[0])
        assert len(endoftext) == 1 and tok.is_eog(endoftext[0])
        assert tok.token_text(im_end[0]) == "<|im_end|>"


def test_llama3_variant_adds_bos_and_keeps_whole_words(tokenizers):
    """llama-bpe: BOS by default (llama.cpp's add_bos for LLAMA3); add_bos=False drops it."""
    tok = tokenizers("smollm2-as-llama-bpe")
    ids = tok.encode("Hello")
    assert ids[0] == tok.bos_id
    assert tok.encode("Hello", add_bos=False) == ids[1:]


@pytest.mark.parametrize("name", ALL_VOCABS)
def test_unicode_sweep_matches_llama_cpp(name, tokenizers):
    """Code points from all of Unicode in the contexts the pre-tokenizer regexes tell apart:
    minfer's regex engine (Oniguruma, in `tokenizers`) must classify letters, digits,
    whitespace and the rest as llama.cpp's own Unicode tables do."""
    tok, g = tokenizers(name), load_golden(name)
    assert len(g["sweep"]) == 160
    bad = [c["text"][:12] for c in g["sweep"]
           if tok.encode(c["text"], add_bos=False, parse_special=False) != c["ids"]]
    assert bad == []
