"""The pre names minfer/tokenizer/pretok.py took over from the rest of llama.cpp's load() chain.

Each name has a golden of llama.cpp's own split (goldens/pieces-as-<pre>.json, written by
tools/gen_token_goldens.py on vocab_files.write_piece_vocab, where every pre-token is one token,
so the ids spell the pieces, and decode shows clean_spaces): minfer must give the same ids and
the same decoded text for every text. Tekken, the one of them that real models of supported
architectures use most (Mistral NeMo, Mistral Small 3.x, Ministral 3, Devstral), also runs on a
real tiktoken-style vocab (goldens/llama-bpe-as-tekken.json, in test_tok_llama_cpp.py with the
other vocabs) and its rules and flags are each shown needed here.

The embedding / reranker models' names (jina-es, jina-de, jina-v2-es, jina-v2-de, modern-bert, jina-v1-en,
jina-v2-code, roberta-bpe: vocab_files.EMBED_PRES; and whitespace, under tokenizer.ggml.model 'whitespace') are
in MORE_PRES too; their goldens add <mask> texts (gen_token_goldens.MASK_CASES / WHITESPACE_CASES), the ids with
special tokens parsed and add_sep / <mask>'s attribute, checked in test_tok_embed_pres.py.

jais-2, granite-embed-multi-97m, youtu, afmoe, superbpe and sarvam-moe (MORE_PRES too) have texts of their own
in their goldens (gen_token_goldens.PRE_OWN_CASES) and each of their rules and flags that the golden can show is
shown needed (test_each_later_rule_is_needed); sarvam-moe's piece vocab is raw UTF-8 with escaped spaces
(vocab_files.SPM_BPE_PRES).

Names of the chain that minfer still refuses (a clear error naming the file and the value):
any name not in pretok.PRE_TYPES, and pre 'whitespace' under
tokenizer.ggml.model 'gpt2' (llama.cpp aborts there on a run of white space; the model 'whitespace' with
another pre is refused too) (chameleon joined the list above in 2026-12's thirty-seventh session, its golden
with texts for its sentinel / image-token regexes: gen_token_goldens.PRE_OWN_CASES).
"""

from __future__ import annotations

import pytest

from conftest import load_golden
from pre_ablation import golden_misses
from vocab_files import MORE_PRES, write_piece_vocab

from minfer.tokenizer.pretok import GPT4O_RE, LLAMA3_RE, PRE_TYPES, TEKKEN_RE

# llama-vocab.cpp, case LLAMA_VOCAB_PRE_TYPE_TEKKEN (the C++ string literal, unescaped)
TEKKEN = ("[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?"
          "((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*"
          "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


@pytest.fixture(scope="module")
def piece_files(tmp_path_factory):
    """pre -> (GGUFFile of its piece vocab, golden), built on first use."""
    from minfer.gguf_file import GGUFFile

    tmp, cache = tmp_path_factory.mktemp("more_pres"), {}

    def get(pre: str):
        if pre not in cache:
            g = load_golden(f"pieces-as-{pre}")
            path = write_piece_vocab([c["text"] for c in g["cases"]], pre, tmp / f"{pre}.gguf")
            cache[pre] = GGUFFile(path), g
        return cache[pre]

    return get


@pytest.mark.parametrize("pre", MORE_PRES)
def test_split_and_decode_are_llama_cpps(piece_files, pre):
    f, g = piece_files(pre)
    assert g["pre"] == pre and len(g["cases"]) > 200
    assert golden_misses(f, pre, g) == []


@pytest.mark.parametrize("pre", MORE_PRES)
def test_bos_default_is_llama_cpps(piece_files, pre):
    """The piece vocab names no add_bos_token: llama.cpp's per-pre default decides."""
    from minfer.tokenizer import Tokenizer

    f, g = piece_files(pre)
    assert Tokenizer.from_gguf(f).add_bos == g["add_bos"]


def test_tekken_rules_are_llama_cpps():
    r = PRE_TYPES["tekken"]
    assert r.regexes == (TEKKEN,) and TEKKEN_RE == TEKKEN
    assert not r.clean_spaces and r.ignore_merges and r.add_bos and r.byte_encode


@pytest.mark.parametrize("regex, missed", [
    # digits one by one (llama3 and gpt-4o keep runs of three)
    (TEKKEN.replace("|\\p{N}|", "|\\p{N}{1,3}|"), ["1234", "a1234b5678"]),
    # a case change starts a new piece, as in gpt-4o's regex (llama3's does not split there)
    (LLAMA3_RE, ["HelloWorld"]),
    # no contractions: the apostrophe goes with the letters after it (gpt-4o's keeps "'s")
    (GPT4O_RE.replace("\\p{N}{1,3}", "\\p{N}"), ["it's"]),
])
def test_each_tekken_rule_is_needed(piece_files, regex, missed):
    f, g = piece_files("tekken")
    bad = golden_misses(f, "tekken", g, regexes=(regex,))
    assert set(missed) <= set(bad)


@pytest.mark.parametrize("flag", ["ignore_merges", "clean_spaces"])
def test_tekken_flags_are_needed(gguf_files, flag):
    """On the real vocab: merging a pre-token found whole in the vocab, or cleaning spaces on
    decode, gives other answers than llama.cpp's."""
    g = load_golden("llama-bpe-as-tekken")
    rules = PRE_TYPES["tekken"]
    bad = golden_misses(gguf_files("llama-bpe-as-tekken"), "tekken", g, **{flag: not getattr(rules, flag)})
    assert bad


def test_refused_names_say_so(tmp_path):
    from minfer.errors import MinferError
    from minfer.gguf_file import GGUFFile
    from minfer.tokenizer import Tokenizer

    path = write_piece_vocab(["ab"], "no-such-pre", tmp_path / "nopre.gguf")
    with pytest.raises(MinferError, match=r"nopre\.gguf.*tokenizer\.ggml\.pre.*no-such-pre"):
        Tokenizer.from_gguf(GGUFFile(path))


# The later names' rules (pretok.py: JAIS2_RE, GRANITE_EMB_MULTI_RE, YOUTU_RES, AFMOE_RES, sarvam-moe,
# SUPERBPE_RES), each shown
# needed on its golden: the texts llama.cpp splits otherwise when that one rule is changed
_R = PRE_TYPES


@pytest.mark.parametrize("pre, changes, missed", [
    # jais-2: the cascading white space (llama3's "\s+(?!\S)|\s+" takes a run whole)
    ("jais-2", {"regexes": (LLAMA3_RE,)}, ["a    b", "x" + " " * 40, "1 2  3   4    5"]),
    ("jais-2", {"clean_spaces": False}, ["it ' s", " .net"]),
    # granite-embed-multi-97m: \p{M} in the lookaheads (gpt-4o's regex cuts a word at a combining mark)
    ("granite-embed-multi-97m", {"regexes": (GPT4O_RE,)}, ["re\u0301sume\u0301 Cafe\u0301", "नमस्ते दुनिया"]),
    ("granite-embed-multi-97m", {"clean_spaces": True}, ["it ' s", " .net"]),
    # youtu: the Hangul / CJK punctuation / Bopomofo / Han runs first, and single digits
    ("youtu", {"regexes": _R["youtu"].regexes[1:]}, ["你好，世界！…“引号”", "中文abc한국어"]),
    ("youtu", {"regexes": (_R["youtu"].regexes[0], _R["youtu"].regexes[1].replace("|\\p{N}|", "|\\p{N}{1,3}|"))},
     ["a1234 ６７"]),
    ("youtu", {"clean_spaces": True}, ["it ' s", " .net"]),
    # afmoe: digits in threes from the right glued to the text before them, then the script-block runs
    ("afmoe", {"glued": ()}, ["x  1234", "abc  12345 def"]),
    ("afmoe", {"regexes": _R["afmoe"].regexes[1:], "glued": ()}, ["1234567", "ab12345cd", "١٢٣٤٥"]),
    ("afmoe", {"regexes": _R["afmoe"].regexes[::2], "glued": (0,)}, ["ภาษาไทย๑๒๓๔", "한국어 테스트", "\uac00\uf900x"]),
    ("afmoe", {"clean_spaces": True}, ["it ' s", " .net"]),
    # sarvam-moe: spaces escaped to U+2581 (else byte tokens), raw UTF-8 (not GPT-2's byte mapping), and
    # no clean_spaces on decode
    ("sarvam-moe", {"escape_whitespace": False}, ["a b\n\nc d", "x \u2581 y"]),
    ("sarvam-moe", {"byte_encode": True}, ["e\u0301 😀", "x \u2581 y"]),
    ("sarvam-moe", {"clean_spaces": True}, ["it ' s . net ,x"]),
    # superbpe: the cut before each group of three ASCII digits ending a run, after the digit runs are apart
    ("superbpe", {"regexes": _R["superbpe"].regexes[:1]}, ["1234567", "12 345 6789"]),
    ("superbpe", {"regexes": _R["superbpe"].regexes[1:]}, ["x1234y"]),
    ("superbpe", {"clean_spaces": True}, ["it ' s"]),
])
def test_each_later_rule_is_needed(piece_files, pre, changes, missed):
    f, g = piece_files(pre)
    bad = golden_misses(f, pre, g, **changes)
    assert set(missed) <= set(bad), bad[:10]
