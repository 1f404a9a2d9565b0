"""The SentencePiece Unigram tokenizer (tokenizer.ggml.model 't5', llama.cpp's UGM) against
llama.cpp itself.

The vocab is llama.cpp's suite file ggml-vocab-nomic-bert-moe.gguf (XLM-RoBERTa's 250,048
tokens with its nmt_nfkc precompiled charsmap, remove_extra_whitespaces and add_space_prefix
on), fetched by tools/fetch_llama_cpp.py as the suite vocabs are (EXTRA); if it cannot be
fetched these tests fail. goldens/nomic-bert-moe.json holds llama.cpp's answers
(tools/gen_ugm_goldens.py: llama_tokenize with every add_special / parse_special pair,
llama_detokenize, llama_token_to_piece, the attributes and special ids), also for two
variants of the vocab that reach the rules XLM-R's settings do not (spaces kept, no
charsmap, user-defined, unused, control and byte tokens; gen_ugm_goldens.write_variant).
"""

from __future__ import annotations

import importlib.util
import struct
import time
from pathlib import Path

import pytest

from conftest import fetch, load_golden
from minfer.errors import MinferError
from minfer.gguf_file import GGUFFile
from minfer.tokenizer import Tokenizer
from minfer.tokenizer import vocab as V
from minfer.tokenizer.ugm import UNKNOWN_PENALTY

NAME = "nomic-bert-moe"
_TOOL = Path(__file__).resolve().parents[2] / "tools" / "gen_ugm_goldens.py"
_spec = importlib.util.spec_from_file_location("gen_ugm_goldens", _TOOL)
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)

# (golden key, encode arguments): llama_tokenize(add_special, parse_special)
COMBOS = {"ids": dict(add_bos=None, parse_special=True),
          "ids_no_special": dict(add_bos=False, parse_special=False),
          "ids_add_only": dict(add_bos=None, parse_special=False),
          "ids_parse_only": dict(add_bos=False, parse_special=True)}


@pytest.fixture(scope="module")
def golden() -> dict:
    return load_golden(NAME)


@pytest.fixture(scope="module")
def vocab_path() -> Path:
    path = fetch.suite_dir() / f"ggml-vocab-{NAME}.gguf"
    assert path.is_file(), path
    return path


@pytest.fixture(scope="module")
def loaded(vocab_path):
    """(Tokenizer, seconds to read the file and build the tokenizer)."""
    t0 = time.perf_counter()
    tok = Tokenizer.from_gguf(GGUFFile(vocab_path))
    return tok, time.perf_counter() - t0


@pytest.fixture(scope="module")
def tok(loaded):
    return loaded[0]


@pytest.fixture(scope="module")
def variants(vocab_path, tmp_path_factory):
    """variant name -> minfer Tokenizer of gen_ugm_goldens.write_variant's file."""
    base = GGUFFile(vocab_path).metadata
    tmp = tmp_path_factory.mktemp("ugm_variants")
    return {name: Tokenizer.from_gguf(GGUFFile(gen.write_variant(base, name, tmp / f"{name}.gguf")))
            for name in gen.VARIANTS}


def test_golden_covers_the_asked_texts(golden):
    """The golden is llama.cpp's (its command recorded) and holds the texts the rules hinge on."""
    assert golden["command"].endswith("tools/gen_ugm_goldens.py")
    texts = {c["text"] for c in golden["cases"]}
    for t in ("", " ", "  a  ", "a\tb", "a\n\nb", "ＡＢＣａｂｃ１２３", "ﬁne ﬂow ﬀ ﬃ ﬄ ﬅ ﬆ", "你好，世界", "😀",
              "café naïve résumé", "<s>", "</s>", "<mask>", "a <mask> b", "<s>hello</s>"):
        assert t in texts
    assert len(golden["cases"]) > 300 and len(golden["sweep"]) > 50
    assert len(golden["variant_spaces"]) == len(golden["variant_raw"]) > 100


def test_loads_fast_as_a_unigram_vocab(loaded, golden):
    tok, seconds = loaded
    assert tok.kind == "ugm" and tok.n_vocab == golden["n_vocab"] == 250048
    assert seconds < 5.0, f"loading the 250k-token Unigram vocab took {seconds:.2f} s"


def test_special_ids_and_attributes(tok, golden):
    """llama.cpp's ids (the file's), add_bos / add_eos (the file's), EOG set and every
    attribute that is not plain NORMAL (<mask> gets LSTRIP: arch nomic-bert-moe)."""
    assert (tok.bos_id, tok.eos_id, tok.sep_id) == (golden["bos"], golden["eos"], golden["sep"])
    assert (tok.add_bos, tok.add_eos) == (golden["add_bos"], golden["add_eos"])
    assert sorted(tok.eog_ids) == golden["eog"]
    attrs = {str(i): tok.token_attr(i) for i in range(tok.n_vocab) if tok.token_attr(i) != V.ATTR_NORMAL}
    assert attrs == golden["non_normal_attrs"]


@pytest.mark.parametrize("key", list(COMBOS))
def test_ids_match_llama_cpp(tok, golden, key):
    bad = [(c["text"], tok.encode(c["text"], **COMBOS[key]), c[key]) for c in golden["cases"]
           if tok.encode(c["text"], **COMBOS[key]) != c[key]]
    assert bad == []


def test_unicode_sweep_matches_llama_cpp(tok, golden):
    bad = [(c["text"], c["ids"]) for c in golden["sweep"]
           if tok.encode(c["text"], add_bos=False, parse_special=False) != c["ids"]]
    assert bad == []


def test_long_text_ids_and_speed(tok, golden):
    """~6 KB of mixed text: llama.cpp's ids, encoded well under a second."""
    text = golden["long"]["text"]
    assert len(text.encode("utf-8")) > 5000
    t0 = time.perf_counter()
    ids = tok.encode(text)
    seconds = time.perf_counter() - t0
    assert ids == golden["long"]["ids"]
    assert seconds < 1.0, f"encoding {len(text)} characters took {seconds:.2f} s"
    assert tok.decode(ids) == golden["long"]["decode"]


def test_decode_matches_llama_cpp(tok, golden):
    """llama_detokenize(remove_special=false) with and without unparse_special, of the ids with
    and without special tokens; the stream decoder (token_to_piece) gives the same text where
    the first token is BOS (<s> has no space for detokenize to strip)."""
    bad = []
    for c in golden["cases"]:
        got = (tok.decode(c["ids"]), tok.decode(c["ids"], skip_special=True), tok.decode(c["ids_no_special"]))
        want = (c["decode"], c["decode_skip_special"], c["decode_no_special"])
        if got != want:
            bad.append((c["text"], got, want))
        assert c["ids"][0] == tok.bos_id
        dec = tok.stream_decoder()
        assert "".join(dec.push(i) for i in c["ids"]) + dec.flush() == c["decode"]
    assert bad == []


def test_pieces_match_llama_cpp(tok, golden):
    """llama_token_to_piece(special=true / false) of every token used, every non-normal one and
    every 997th."""
    bad = [(i, h) for i, h in golden["pieces_hex"].items()
           if [tok.piece_bytes(int(i)).hex(), tok.piece_bytes(int(i), skip_special=True).hex()] != h]
    assert bad == []


@pytest.mark.parametrize("name", list(gen.VARIANTS))
def test_variant_matches_llama_cpp(variants, golden, name):
    """remove_extra_whitespaces off (each space escaped), add_space_prefix on / off, with and
    without the charsmap; user-defined tokens matched on the raw text (also part way, which
    can leave invalid UTF-8 for the Viterbi), an unused token the unknown penalty decides,
    a control token and byte tokens (their pieces)."""
    tok = variants[name]
    bad = []
    for c in golden[f"variant_{name}"]:
        got = (tok.encode(c["text"]), tok.encode(c["text"], add_bos=False, parse_special=False),
               tok.decode(c["ids"]))
        if got != (c["ids"], c["ids_no_special"], c["decode"]):
            bad.append((c["text"], got, (c["ids"], c["ids_no_special"], c["decode"])))
    assert bad == []
    for i, h in golden[f"variant_{name}_pieces_hex"].items():
        assert [tok.piece_bytes(int(i)).hex(), tok.piece_bytes(int(i), skip_special=True).hex()] == h


def _misses(tok, cases) -> list[str]:
    return [c["text"] for c in cases if tok.encode(c["text"]) != c["ids"]]


def test_each_rule_is_needed(tok, variants, golden, monkeypatch):
    """The goldens tell each rule apart: without the charsmap, with spaces kept (no
    remove_extra_whitespaces), without the unknown token's penalty, or without the partial
    user-defined match of normalize_prefix, llama.cpp's ids are missed."""
    m = tok._model
    monkeypatch.setattr(m, "charsmap", None)
    assert len(_misses(tok, golden["cases"])) > 100
    monkeypatch.undo()
    monkeypatch.setattr(m, "_merge", False)
    assert len(_misses(tok, golden["cases"])) > 100
    monkeypatch.undo()
    assert _misses(tok, golden["cases"]) == []
    v = variants["spaces"]._model
    monkeypatch.setattr(v, "unknown_score", v.unknown_score + UNKNOWN_PENALTY)
    assert "🀄🀄," in _misses(variants["spaces"], golden["variant_spaces"])
    monkeypatch.undo()
    monkeypatch.setattr(v, "_ud_first", bytes(256))
    missed = _misses(variants["spaces"], golden["variant_spaces"])
    assert "è" in missed and "ＡＢ ＡＣ Ａ" in missed
    monkeypatch.undo()
    assert _misses(variants["spaces"], golden["variant_spaces"]) == []


# ---- malformed files ----

def _write(tmp_path, *, scores=True, charsmap: bytes | list | None = None, extra: dict | None = None) -> GGUFFile:
    import gguf

    path = tmp_path / "u.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("t5")
    w.add_tokenizer_pre("default")
    w.add_token_list(["<pad>", "</s>", "<unk>", "\u2581", "x", "y", "a"])
    w.add_token_types([3, 3, 2, 1, 1, 1, 1])
    if scores:
        w.add_token_scores([0.0, 0.0, 0.0, -1.0, -2.0, -2.0, -3.0] if scores is True else scores)
    if isinstance(charsmap, bytes):
        w.add_precompiled_charsmap(charsmap)
    elif charsmap is not None:
        w.add_array("tokenizer.ggml.precompiled_charsmap", charsmap)
    for k, v in (extra or {}).items():
        w.add_string(k, v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return GGUFFile(path)


def _xcda(child_base: int = 5, offset: int = 0, strings: bytes = b"xy\0") -> bytes:
    """A charsmap of 128 XCDA nodes mapping 'a' to the string at `offset` (by the layout of
    llama-vocab.cpp's xcda_array_view): root BASE 0, so 'a' (0x61) is node 97: LCHECK 0x61,
    LEAF, BASE 5 -> node 97 ^ 5 = 100 holds the offset (bit 31 set, as SentencePiece writes
    value nodes, so that it is nobody's child). Every other node is 0: no other child."""
    nodes = [0] * 128
    nodes[97] = (child_base << 10) | (1 << 8) | 0x61
    nodes[97 ^ 5] = (1 << 31) | offset
    return struct.pack("<I", 4 * len(nodes)) + struct.pack(f"<{len(nodes)}I", *nodes) + strings


def test_hand_made_charsmap_replaces(tmp_path):
    """The layout as read: 'a' becomes 'xy'; other text is kept (no space prefix, spaces kept
    and escaped: UGM's defaults)."""
    tok = Tokenizer.from_gguf(_write(tmp_path, charsmap=_xcda()))
    assert tok._model.normalize("a a") == "xy\u2581xy".encode("utf-8")
    assert tok.encode("a", add_bos=False) == [4, 5]   # 'x' 'y'
    assert tok.encode("a") == [4, 5, 1]               # add_eos is UGM's default, </s> its id 1


def test_missing_scores_are_named(tmp_path):
    with pytest.raises(MinferError, match=r"u\.gguf: .*tokenizer\.ggml\.scores is missing"):
        Tokenizer.from_gguf(_write(tmp_path, scores=False))
    with pytest.raises(MinferError, match=r"u\.gguf: tokenizer\.ggml\.scores has 3 entries, expected 7"):
        Tokenizer.from_gguf(_write(tmp_path, scores=[0.0, 0.0, 0.0]))


@pytest.mark.parametrize("charsmap, want", [
    (b"\x01\x00\x00", "has 3 bytes, too few"),
    (struct.pack("<I", 8) + b"\0" * 8, "says its XCDA node array has 8 bytes"),
    (["a", "b", "c", "d", "e"], "not an array of bytes"),
    ([300, 1, 2, 3, 4, 5], "not an array of bytes"),
])
def test_malformed_charsmap_is_named_at_load(tmp_path, charsmap, want):
    with pytest.raises(MinferError, match=rf"u\.gguf: tokenizer\.ggml\.precompiled_charsmap .*{want}"):
        Tokenizer.from_gguf(_write(tmp_path, charsmap=charsmap))


@pytest.mark.parametrize("charsmap, want", [
    (_xcda(child_base=200), "reaches XCDA node 169, past its 128 nodes"),
    (_xcda(offset=10), "replacement offset \\(10\\) is past"),
    (_xcda(strings=b"xy"), "no terminating NUL"),
])
def test_malformed_charsmap_is_named_when_used(tmp_path, charsmap, want):
    """What llama.cpp finds only while normalizing (it throws there) is a MinferError naming
    the field, on the first text that walks into it."""
    tok = Tokenizer.from_gguf(_write(tmp_path, charsmap=charsmap))
    assert tok.encode("x", add_bos=False) == [4]
    with pytest.raises(MinferError, match=rf"u\.gguf: tokenizer\.ggml\.precompiled_charsmap is malformed: .*{want}"):
        tok.encode("a")


def test_mistyped_flag_is_named(tmp_path):
    with pytest.raises(MinferError, match=r"tokenizer\.ggml\.remove_extra_whitespaces is 'yes'; expected a bool"):
        Tokenizer.from_gguf(_write(tmp_path, extra={"tokenizer.ggml.remove_extra_whitespaces": "yes"}))
