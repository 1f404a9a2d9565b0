"""Pre types "glm4", "glm5", "chatglm-bpe" (llama.cpp LLAMA_VOCAB_PRE_TYPE_CHATGLM4: GLM-4,
GLM-4.5/4.6/4.7, GLM-5). llama-vocab.cpp gives them llama3's regex (quoted below as it stands
there), ignore_merges for glm4/glm5, and no BOS id unless the file names one. So a vocab under
"glm4" must split and encode exactly as under "llama-bpe", whose ids are llama.cpp's own
(goldens/smollm2-as-llama-bpe.json, tools/gen_token_goldens.py), and add no BOS."""

from __future__ import annotations

import pytest

from conftest import load_golden
from vocab_files import write_vocab_variant

from minfer.tokenizer import Tokenizer
from minfer.tokenizer.pretok import LLAMA3_RE, PRE_TYPES

# llama-vocab.cpp, case LLAMA_VOCAB_PRE_TYPE_CHATGLM4 (the C++ string literal, unescaped)
CHATGLM4 = ("(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
            "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


def test_rules_are_llama_cpps():
    assert LLAMA3_RE == CHATGLM4
    for pre in ("glm4", "glm5", "chatglm-bpe"):
        r = PRE_TYPES[pre]
        assert r.regexes == (CHATGLM4,) and r.clean_spaces and not r.add_bos and r.no_default_bos
    assert PRE_TYPES["glm4"].ignore_merges and PRE_TYPES["glm5"].ignore_merges
    assert not PRE_TYPES["chatglm-bpe"].ignore_merges


@pytest.fixture(scope="module")
def variant(gguf_files, tmp_path_factory):
    """SmolLM2's vocab under pre "glm4", once with its BOS id and once without."""
    from minfer.gguf_file import GGUFFile

    base = dict(gguf_files("smollm2-135m-instruct").metadata)
    tmp = tmp_path_factory.mktemp("glm4")
    with_bos = Tokenizer.from_gguf(GGUFFile(write_vocab_variant(base, "glm4", tmp / "a.gguf")))
    return with_bos, base, tmp


def test_encodes_as_llama_cpp_does(variant):
    tok = variant[0]
    g = load_golden("smollm2-as-llama-bpe")
    bad = [c["text"] for c in g["cases"] if tok.encode(c["text"], add_bos=False, parse_special=False) != c["ids_no_special"]]
    assert bad == []
    # parse_special, no BOS: llama-bpe's ids with its BOS dropped
    bos = g["bos"]
    for c in g["cases"]:
        want = c["ids"][1:] if c["ids"][:1] == [bos] else c["ids"]
        assert tok.encode(c["text"]) == want, c["text"]


def test_no_bos_by_default_and_none_without_the_key(variant, monkeypatch):
    tok, base, tmp = variant
    assert tok.add_bos is False and tok.bos_id == int(base["tokenizer.ggml.bos_token_id"])
    import gguf

    from minfer.gguf_file import GGUFFile

    # the same vocab without tokenizer.ggml.bos_token_id: llama.cpp leaves BOS null (a BPE vocab
    # under another pre gets id 11)
    monkeypatch.setattr(gguf.GGUFWriter, "add_bos_token_id", lambda self, i: None)
    no_key = Tokenizer.from_gguf(GGUFFile(write_vocab_variant(base, "glm4", tmp / "b.gguf")))
    other = Tokenizer.from_gguf(GGUFFile(write_vocab_variant(base, "llama-bpe", tmp / "c.gguf")))
    assert no_key.bos_id is None and other.bos_id == 11
