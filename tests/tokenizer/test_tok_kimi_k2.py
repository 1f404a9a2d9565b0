"""Pre type "kimi-k2" (llama.cpp LLAMA_VOCAB_PRE_TYPE_KIMI_K2: Kimi-K2, Moonlight, Kimi-Linear).

llama-vocab.cpp lists only the placeholder "\\p{Han}+", which unicode.cpp hands to a hand-written
splitter (unicode_regex_split_custom_kimi_k2); minfer writes that splitter as one regex
(pretok.KIMI_K2_RE). Its split differs from Kimi's tokenizer.json regex: letter case plays no
part and combining marks are not letters. Goldens of llama.cpp's own answers
(tools/gen_token_goldens.py): goldens/qwen2-as-kimi-k2.json (Qwen2's vocab under this pre, run
by test_tok_llama_cpp.py) and goldens/pieces-as-kimi-k2.json (a vocab on which every pre-token
is one token, vocab_files.write_piece_vocab: its ids spell llama.cpp's split)."""

from __future__ import annotations

import pytest

from conftest import load_golden
from pre_ablation import golden_misses
from vocab_files import write_piece_vocab

from minfer.tokenizer.pretok import HAN, KIMI_K2_RE, PRE_TYPES

CONTRACTIONS = "(?:'[sS]|'[tT]|'[mM]|'[dD]|'[rR][eE]|'[vV][eE]|'[lL][lL])?"
# the regex of Kimi's tokenization_kimi.py (quoted in unicode.cpp), Han taken out of each class
# with Oniguruma's && instead of Java-style [..&&[^\p{Han}]]
CASED = (rf"[{HAN}]+|[^\r\n\p{{L}}\p{{N}}]?[[\p{{Lu}}\p{{Lt}}\p{{Lm}}\p{{Lo}}\p{{M}}]&&[^{HAN}]]*"
         rf"[[\p{{Ll}}\p{{Lm}}\p{{Lo}}\p{{M}}]&&[^{HAN}]]+{CONTRACTIONS}"
         rf"|[^\r\n\p{{L}}\p{{N}}]?[[\p{{Lu}}\p{{Lt}}\p{{Lm}}\p{{Lo}}\p{{M}}]&&[^{HAN}]]+"
         rf"[[\p{{Ll}}\p{{Lm}}\p{{Lo}}\p{{M}}]&&[^{HAN}]]*{CONTRACTIONS}"
         r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def test_rules():
    r = PRE_TYPES["kimi-k2"]
    assert r.regexes == (KIMI_K2_RE,)
    assert not r.clean_spaces and not r.ignore_merges and not r.add_bos and not r.glued
    # unicode_cpt_is_han's ranges
    assert HAN.startswith("\u4e00-\u9fff\u3400-\u4dbf\U00020000-\U0002a6df")


@pytest.fixture(scope="module")
def pieces(tmp_path_factory):
    from minfer.gguf_file import GGUFFile

    g = load_golden("pieces-as-kimi-k2")
    path = tmp_path_factory.mktemp("k2") / "pieces.gguf"
    return GGUFFile(write_piece_vocab([c["text"] for c in g["cases"]], "kimi-k2", path)), g


def test_split_is_llama_cpps(pieces):
    f, g = pieces
    assert g["pre"] == "kimi-k2" and len(g["cases"]) > 200
    assert golden_misses(f, "kimi-k2", g) == []


@pytest.mark.parametrize("regex, missed", [
    # Han is not a letter of a word: "a中b" is three pieces, " 中文" two
    (r"[^\r\n\p{L}\p{N}]?\p{L}+" + KIMI_K2_RE.split("]]+", 1)[1], ["a中b", " 中文", "中文ひらがなカタカナ漢字"]),
    # no case split (Kimi's own regex would cut "Hello" "World")
    (CASED, ["HelloWorld", "camelCaseWord", "ПриветМир"]),
    # combining marks are not letters
    (KIMI_K2_RE.replace(r"[\p{L}&&", r"[[\p{L}\p{M}]&&"), ["e\u0301", "a\u0308b"]),
    # contractions, either case, stay with the word
    (KIMI_K2_RE.replace(CONTRACTIONS, ""), ["I'M WE'LL", "it's"]),
    # digits in runs of at most three
    (KIMI_K2_RE.replace(r"\p{N}{1,3}", r"\p{N}+"), ["1234", "12345"]),
])
def test_each_rule_is_needed(pieces, regex, missed):
    f, g = pieces
    assert KIMI_K2_RE != regex
    bad = golden_misses(f, "kimi-k2", g, regexes=(regex,))
    assert set(missed) <= set(bad)


def test_clean_spaces_off_is_needed(gguf_files):
    g = load_golden("qwen2-as-kimi-k2")
    bad = golden_misses(gguf_files("qwen2-as-kimi-k2"), "kimi-k2", g, clean_spaces=True)
    assert "it ' s" in bad


def test_no_bos_unless_the_file_says_so(tokenizers):
    """Qwen2's file has no add_bos_token: llama.cpp adds none (kimi-k2 does not set add_bos)."""
    tok, g = tokenizers("qwen2-as-kimi-k2"), load_golden("qwen2-as-kimi-k2")
    assert not g["add_bos"] and not tok.add_bos


def test_a_file_without_merges_loads_as_in_llama_cpp(tmp_path):
    """llama.cpp loads a kimi-k2 vocab that has no tokenizer.ggml.merges (no pair is merged);
    any other pre without merges is refused there ("cannot find tokenizer merges") and here."""
    from minfer.errors import MinferError
    from minfer.gguf_file import GGUFFile

    g = load_golden("pieces-as-kimi-k2-no-merges")
    texts = [c["text"] for c in g["cases"]]
    f = GGUFFile(write_piece_vocab(texts, "kimi-k2", tmp_path / "a.gguf", with_merges=False))
    assert "tokenizer.ggml.merges" not in f.metadata
    assert golden_misses(f, "kimi-k2", g) == []
    other = GGUFFile(write_piece_vocab(texts, "deepseek-v3", tmp_path / "b.gguf", with_merges=False))
    with pytest.raises(MinferError, match="tokenizer.ggml.merges"):
        golden_misses(other, "deepseek-v3", g)
