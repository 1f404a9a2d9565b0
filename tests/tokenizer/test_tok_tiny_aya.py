"""Pre types "tiny_aya", "cohere2moe" (llama.cpp LLAMA_VOCAB_PRE_TYPE_TINY_AYA: Tiny Aya).

Two steps in llama-vocab.cpp. The first, "\\d{1,3}(?=(?:\\d{3})*\\b)", is not run as a regex:
unicode.cpp hands it to the AFMoE digit splitter, which groups each run of \\p{N} by three from
the right and glues the text before a run to the run's first group (minfer: a regex with HF's
merged_with_previous behaviour). The second is o200k's word regex on llama.cpp's collapsed text,
where every \\p{L?} class means "any letter", so case changes do not split. Goldens of llama.cpp's
own answers (tools/gen_token_goldens.py): goldens/command-r-as-tiny_aya.json (Cohere's vocab
under this pre, run by test_tok_llama_cpp.py) and goldens/pieces-as-tiny_aya.json (a vocab on
which every pre-token is one token, vocab_files.write_piece_vocab: its ids spell the split)."""

from __future__ import annotations

import pytest

from conftest import load_golden
from pre_ablation import golden_misses
from vocab_files import write_piece_vocab

from minfer.tokenizer.pretok import PRE_TYPES, TINY_AYA_DIGITS_RE, TINY_AYA_RE

# llama-vocab.cpp, case LLAMA_VOCAB_PRE_TYPE_TINY_AYA, second regex (C++ literal, unescaped)
TINY_AYA_2 = (
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


def test_rules():
    for pre in ("tiny_aya", "cohere2moe"):
        r = PRE_TYPES[pre]
        assert r.regexes == (TINY_AYA_DIGITS_RE, TINY_AYA_RE) and r.glued == (0,)
        assert not r.clean_spaces and not r.ignore_merges and not r.add_bos


def test_word_regex_is_llama_cpps_after_its_collapse(pieces):
    """llama.cpp's collapse maps \\p{Lu}, \\p{Ll}, \\p{Lt}, \\p{Lm}, \\p{Lo} to one letter class;
    with that done its regex splits every golden text as TINY_AYA_RE does."""
    from tokenizers import Regex, pre_tokenizers

    collapsed = TINY_AYA_2
    for c in ("Lu", "Ll", "Lt", "Lm", "Lo"):
        collapsed = collapsed.replace(f"\\p{{{c}}}", "\\p{L}")
    a = pre_tokenizers.Split(Regex(collapsed), behavior="isolated")
    b = pre_tokenizers.Split(Regex(TINY_AYA_RE), behavior="isolated")
    for c in pieces[1]["cases"]:
        assert a.pre_tokenize_str(c["text"]) == b.pre_tokenize_str(c["text"]), c["text"]


@pytest.fixture(scope="module")
def pieces(tmp_path_factory):
    from minfer.gguf_file import GGUFFile

    g = load_golden("pieces-as-tiny_aya")
    path = tmp_path_factory.mktemp("aya") / "pieces.gguf"
    return GGUFFile(write_piece_vocab([c["text"] for c in g["cases"]], "tiny_aya", path)), g


def test_split_is_llama_cpps(pieces):
    f, g = pieces
    assert g["pre"] == "tiny_aya" and len(g["cases"]) > 200
    assert golden_misses(f, "tiny_aya", g) == []


@pytest.mark.parametrize("changes, missed", [
    # the text before a digit run joins its first group: "x  1234" -> "x  1" "234" first
    ({"glued": ()}, ["x  1234", "abc  12345 def"]),
    # digits grouped by three from the right
    ({"regexes": (r"\p{N}{1,3}", TINY_AYA_RE)}, ["1234", "1234567"]),
    # all of \p{N}, not just ASCII digits
    ({"regexes": (TINY_AYA_DIGITS_RE.replace(r"\p{N}", "[0-9]"), TINY_AYA_RE)}, ["٣٤٥٦٧", "²³⁴⁵"]),
    # no case split: the regex as o200k reads it would cut "Hello" "World"
    ({"regexes": (TINY_AYA_DIGITS_RE, TINY_AYA_2)}, ["HelloWorld", "camelCaseWord", "ПриветМир"]),
    # combining marks belong to the word
    ({"regexes": (TINY_AYA_DIGITS_RE, TINY_AYA_RE.replace(r"[\p{L}\p{M}]+", r"\p{L}+"))},
     ["e\u0301", "a\u0308b"]),
])
def test_each_rule_is_needed(pieces, changes, missed):
    f, g = pieces
    bad = golden_misses(f, "tiny_aya", g, **changes)
    assert set(missed) <= set(bad)


def test_clean_spaces_off_is_needed(gguf_files):
    g = load_golden("command-r-as-tiny_aya")
    bad = golden_misses(gguf_files("command-r-as-tiny_aya"), "tiny_aya", g, clean_spaces=True)
    assert "it ' s" in bad


def test_llama_cpps_unicode_table_is_needed(gguf_files, monkeypatch):
    """llama.cpp's table (Unicode 15.1) has no category for U+13460-U+143FA (Egyptian
    hieroglyphs, Unicode 16); Oniguruma calls them letters. Cutting the \\p{..} classes down to
    llama.cpp's table (pretok.with_llama_cpp_tables) is what gets the sweep text at U+14000
    right: Cohere's vocab merges a byte of U+1400F with the "a" after it."""
    import minfer.tokenizer.bpe as bpe

    g = load_golden("command-r-as-tiny_aya")
    monkeypatch.setattr(bpe, "with_llama_cpp_tables", lambda r: r)
    bad = golden_misses(gguf_files("command-r-as-tiny_aya"), "tiny_aya", g)
    assert [t[:2] for t in bad] == [" \U00014000"]
