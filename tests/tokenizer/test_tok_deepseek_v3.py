"""Pre type "deepseek-v3" (llama.cpp LLAMA_VOCAB_PRE_TYPE_DEEPSEEK3_LLM: DeepSeek-V3, V3.1, R1).

llama-vocab.cpp gives it three regexes (quoted below as they stand there), applied one after
the other, and clean_spaces off; merges are used and BOS comes from the file. Two goldens of
llama.cpp's own answers (tools/gen_token_goldens.py) check minfer:
- goldens/deepseek-llm-as-deepseek-v3.json: deepseek-llm's vocab under this pre (ids, decode,
  pieces, special ids, Unicode sweep), run by test_tok_llama_cpp.py with the other vocabs;
- goldens/pieces-as-deepseek-v3.json: a vocab on which every pre-token is one token
  (vocab_files.write_piece_vocab), so its ids spell llama.cpp's split; here, with each rule
  taken out in turn to show that it is needed."""

from __future__ import annotations

import pytest

from conftest import load_golden
from pre_ablation import golden_misses
from vocab_files import write_piece_vocab

from minfer.tokenizer.pretok import DEEPSEEK_V3_RES, PRE_TYPES

# llama-vocab.cpp, case LLAMA_VOCAB_PRE_TYPE_DEEPSEEK3_LLM (the C++ string literals, unescaped)
DEEPSEEK3 = (
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
)


def test_rules_are_llama_cpps():
    r = PRE_TYPES["deepseek-v3"]
    assert r.regexes == DEEPSEEK3 and DEEPSEEK_V3_RES == DEEPSEEK3
    assert not r.clean_spaces and not r.ignore_merges and not r.add_bos and not r.glued
    assert r.byte_encode and not r.no_default_bos


@pytest.fixture(scope="module")
def pieces(tmp_path_factory):
    from minfer.gguf_file import GGUFFile

    g = load_golden("pieces-as-deepseek-v3")
    path = tmp_path_factory.mktemp("ds3") / "pieces.gguf"
    return GGUFFile(write_piece_vocab([c["text"] for c in g["cases"]], "deepseek-v3", path)), g


def test_split_is_llama_cpps(pieces):
    f, g = pieces
    assert g["pre"] == "deepseek-v3" and len(g["cases"]) > 200
    assert golden_misses(f, "deepseek-v3", g) == []


@pytest.mark.parametrize("regexes, missed", [
    # digits in runs of at most three, before anything else
    (DEEPSEEK3[1:], ["1234", "a1234b5678"]),
    # Han and kana runs stand apart from other letters ("a中b" is three pieces)
    (DEEPSEEK3[::2], ["a中b", " 中文", "㐀㐁中"]),
    # an ASCII punctuation mark leads an ASCII word (".net" is one piece)
    (DEEPSEEK3[:2] + (DEEPSEEK3[2].split("|", 1)[1],), [".net", "(hello)", "$HOME"]),
    # combining marks belong to the word
    (DEEPSEEK3[:2] + (DEEPSEEK3[2].replace("[\\p{L}\\p{M}]+", "\\p{L}+"),), ["e\u0301", "a\u0308b"]),
])
def test_each_regex_rule_is_needed(pieces, regexes, missed):
    f, g = pieces
    bad = golden_misses(f, "deepseek-v3", g, regexes=regexes)
    assert set(missed) <= set(bad)


def test_clean_spaces_off_is_needed(gguf_files):
    """llama.cpp decodes " ' s" as is (clean_spaces = false for deepseek-v3)."""
    g = load_golden("deepseek-llm-as-deepseek-v3")
    bad = golden_misses(gguf_files("deepseek-llm-as-deepseek-v3"), "deepseek-v3", g, clean_spaces=True)
    assert "it ' s" in bad


def test_bos_from_the_file(tokenizers):
    """deepseek-llm's file says add_bos_token = true and BOS 100000: llama.cpp adds it."""
    tok, g = tokenizers("deepseek-llm-as-deepseek-v3"), load_golden("deepseek-llm-as-deepseek-v3")
    assert g["add_bos"] and g["bos"] == 100000 and tok.add_bos and tok.bos_id == 100000
    assert tok.encode("Hello")[0] == 100000
