"""The embedding / reranker models' pre names (minfer/tokenizer/pretok.py, the end of PRE_TYPES) against
llama.cpp's own answers.

- jina-es, jina-de, jina-v2-es, jina-v2-de, modern-bert (GPT-2's rules), jina-v1-en, jina-v2-code, roberta-bpe
  (GPT-2's rules, add_sep on): goldens/pieces-as-<pre>.json on vocab_files.write_piece_vocab with <s>, </s>
  and <mask> control tokens (vocab_files.EMBED_SPECIALS): every text's ids with and without special tokens
  parsed, the decoded text, llama_vocab_get_add_bos / _eos / _sep and <mask>'s attribute bits (LSTRIP for
  jina-v2-de / -es / -code: <mask> eats the white space before it). test_tok_more_pres.py checks the split
  and decode of these too (they are in vocab_files.MORE_PRES);
- whitespace (jina-embeddings-v2-base-zh: tokenizer.ggml.model and pre 'whitespace'): goldens/
  pieces-as-whitespace.json and -lower.json (normalizer.lowercase true) on a raw-UTF-8 piece vocab with
  <0xXX> byte tokens (vocab_files.raw_piece_vocab);
- goldens/embed-pres.json: for each of those names, llama.cpp's add_* flags under five sets of
  tokenizer.ggml.add_*_token keys and the rerank pair layout llama-server's format_prompt_rerank builds from
  them (minfer's runtime/embed.py pair_ids must match); and the per-token attribute chain of load() (<mask>
  by pre, Phi-3's RSTRIP and modern-bert's [MASK] by general.name, one if / else-if chain).
Written by tools/gen_token_goldens.py (module doc: the commands).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import load_golden
from pre_ablation import golden_misses
from vocab_files import EMBED_PRES, PIECE_OPTIONS, _byte_chars, write_piece_vocab, write_pre_variant

LSTRIP_PRES = {"jina-v2-de", "jina-v2-es", "jina-v2-code"}
SEP_PRES = {"jina-v1-en", "jina-v2-code", "roberta-bpe"}
WHITESPACE = ("whitespace", "whitespace-lower")
PAIR_KEYS = ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_sep_token",
             "tokenizer.chat_template.rerank")   # what models/bert.py RankHead.pair_meta holds


@pytest.fixture(scope="module")
def piece_files(tmp_path_factory):
    """golden stem after 'pieces-as-' -> (GGUFFile, golden, pre), built on first use."""
    from minfer.gguf_file import GGUFFile

    tmp, cache = tmp_path_factory.mktemp("embed_pres"), {}

    def get(name: str):
        if name not in cache:
            g = load_golden(f"pieces-as-{name}")
            pre, opts = PIECE_OPTIONS.get(f"pieces-as-{name}", (name, {}))
            path = write_piece_vocab([c["text"] for c in g["cases"]], pre, tmp / f"{name}.gguf", **opts)
            cache[name] = GGUFFile(path), g, pre
        return cache[name]

    return get


def special_misses(tok, g) -> list[str]:
    """Texts whose ids with special tokens parsed (no BOS / EOS) differ from llama.cpp's."""
    return [c["text"] for c in g["cases"] if tok.encode(c["text"], add_bos=False, parse_special=True) != c["ids_special"]]


@pytest.mark.parametrize("name", EMBED_PRES + WHITESPACE)
def test_ids_decode_and_flags_are_llama_cpps(piece_files, name):
    from minfer.tokenizer import Tokenizer

    f, g, pre = piece_files(name)
    assert g["pre"] == pre and len(g["cases"]) > 200
    assert golden_misses(f, pre, g) == []          # ids without special tokens, decoded text
    tok = Tokenizer.from_gguf(f)
    assert special_misses(tok, g) == []
    assert (tok.add_bos, tok.add_eos, tok.add_sep) == (g["add_bos"], g["add_eos"], g["add_sep"])
    # llama.cpp's defaults, as the piece vocabs name no add_* key: SEP only for the three
    assert (g["add_bos"], g["add_eos"], g["add_sep"]) == (False, False, pre in SEP_PRES)


@pytest.mark.parametrize("pre", EMBED_PRES)
def test_mask_lstrip_is_llama_cpps(piece_files, pre):
    from minfer.tokenizer import Tokenizer
    from minfer.tokenizer.vocab import ATTR_CONTROL, ATTR_LSTRIP

    f, g, _ = piece_files(pre)
    tok = Tokenizer.from_gguf(f)
    assert tok.token_attr(g["mask"]) == g["mask_attr"] == ATTR_CONTROL | (ATTR_LSTRIP if pre in LSTRIP_PRES else 0)
    a_mask = next(c for c in g["cases"] if c["text"] == "a <mask>")["ids_special"]
    assert a_mask[-1] == g["mask"] and len(a_mask) == (2 if pre in LSTRIP_PRES else 3)   # "a" (+ " ") <mask>


@pytest.mark.parametrize("pre", ["jina-v2-de", "jina-v2-code", "jina-v1-en", "jina-es"])
def test_mask_rule_is_needed(piece_files, pre):
    """The LSTRIP bit flipped on <mask>: the texts with white space before <mask> then miss llama.cpp."""
    from minfer.tokenizer import Tokenizer
    from minfer.tokenizer.vocab import ATTR_LSTRIP

    f, g, _ = piece_files(pre)
    tok = Tokenizer.from_gguf(f)
    tok._attrs[g["mask"]] ^= ATTR_LSTRIP
    bad = special_misses(tok, g)
    assert {"a <mask>", "a  <mask> b", "a\t\n <mask>", "Paris is the <mask> of France."} <= set(bad)
    # C isspace() only: U+3000, U+00A0 and U+0085 before <mask> stay either way
    assert not {"a\u3000<mask>", "a\u00a0<mask>", "a\u0085<mask>", "<mask>", "a<mask>b"} & set(bad)


def test_rerank_layout_is_llama_servers(tmp_path):
    """embed-pres.json: add_bos / add_eos / add_sep of each name under each key set (the key overriding the
    pre's default) and format_prompt_rerank's ids == minfer's pair_ids on the same file."""
    from minfer.gguf_file import GGUFFile
    from minfer.runtime.embed import pair_ids
    from minfer.tokenizer import Tokenizer

    g = load_golden("embed-pres")
    assert {v["pre"] for v in g["vocabs"]} == set(EMBED_PRES) and len(g["vocabs"]) == 5 * len(EMBED_PRES)
    for k, v in enumerate(g["vocabs"]):
        f = GGUFFile(write_piece_vocab(g["texts"], v["pre"], tmp_path / f"r{k}.gguf", extra_kv=v["keys"]))
        tok = Tokenizer.from_gguf(f)
        want_sep = v["keys"].get("add_sep_token", v["pre"] in SEP_PRES)
        assert (tok.add_bos, tok.add_eos, tok.add_sep) == (v["add_bos"], v["add_eos"], v["add_sep"]) and \
            v["add_sep"] == want_sep, v["keys"]
        head = SimpleNamespace(pair_meta={key: f.metadata.get(key) for key in PAIR_KEYS})
        for p in v["pairs"]:
            assert pair_ids(tok, head, p["query"], p["document"]) == p["ids"], (v["pre"], v["keys"], p)


@pytest.mark.parametrize("pre", sorted(SEP_PRES))
def test_sep_default_is_needed(tmp_path, monkeypatch, pre):
    """With add_sep off in the pre's rules, the layouts whose file names no add_sep_token miss llama-server's."""
    from minfer.gguf_file import GGUFFile
    from minfer.runtime.embed import pair_ids
    from minfer.tokenizer import Tokenizer, pretok

    monkeypatch.setitem(pretok.PRE_TYPES, pre, replace(pretok.PRE_TYPES[pre], add_sep=False))
    g = load_golden("embed-pres")
    missed = []
    for k, v in enumerate(x for x in g["vocabs"] if x["pre"] == pre):
        f = GGUFFile(write_piece_vocab(g["texts"], pre, tmp_path / f"r{k}.gguf", extra_kv=v["keys"]))
        tok = Tokenizer.from_gguf(f)
        head = SimpleNamespace(pair_meta={key: f.metadata.get(key) for key in PAIR_KEYS})
        if any(pair_ids(tok, head, p["query"], p["document"]) != p["ids"] for p in v["pairs"]):
            missed.append(v["keys"])
    assert missed and all("add_sep_token" not in keys for keys in missed)


def test_attribute_chain_is_llama_cpps(tmp_path):
    """<mask> LSTRIP by pre (jina-v2-de / -code), else Phi-3's RSTRIP, else [MASK] LSTRIP for a general.name
    holding 'modern-bert': the specials' bits and the ids with special tokens parsed, as llama.cpp's."""
    from minfer.gguf_file import GGUFFile
    from minfer.tokenizer import Tokenizer

    rules = load_golden("embed-pres")["attr_rules"]
    specials = list(rules[0]["attrs"])
    toks = _byte_chars() + ["ab"] + specials
    meta = {"tokenizer.ggml.tokens": toks, "tokenizer.ggml.token_type": [1] * 257 + [3] * len(specials),
            "tokenizer.ggml.merges": ["a b"]}
    seen = set()
    for k, r in enumerate(rules):
        tok = Tokenizer.from_gguf(GGUFFile(write_pre_variant(meta, r["pre"], tmp_path / f"a{k}.gguf", name=r["name"])))
        assert {t: tok.token_attr(toks.index(t)) for t in specials} == r["attrs"], r
        for c in r["cases"]:
            assert tok.encode(c["text"], add_bos=False) == c["ids"], (r["pre"], r["name"], c["text"])
        seen.update(t for t, a in r["attrs"].items() if a != 8)
    assert seen == {"<mask>", "[MASK]", "</s>"}   # each rule showed


def test_whitespace_lowercase_is_needed(piece_files):
    """normalizer.lowercase: off by the pre's default (llama.cpp: normalizer_opts.lowercase = false), on by the key;
    swapped, each golden misses on upper-case texts."""
    from minfer.tokenizer import Tokenizer

    for name, lower in (("whitespace", False), ("whitespace-lower", True)):
        f, g, _ = piece_files(name)
        tok = Tokenizer.from_gguf(f)
        assert tok._model._lower is lower and special_misses(tok, g) == []
        tok._model._lower = not lower
        bad = special_misses(tok, g)
        assert {"HelloWorld", "İstanbul ẞ", "ABC def GHI"} <= set(bad)


def test_whitespace_session_rules(piece_files):
    """llama.cpp's whitespace session on the golden: White_Space dropped (U+001C-U+001F, U+200B, U+FEFF and
    U+180E are not White_Space and stay in the word), characters the vocab lacks as <0xXX> byte tokens with
    the byte the vocab lacks (0x82) dropped, and a raw "\\x00" token, cut at its NUL by llama.cpp's
    loader, not found."""
    from minfer.tokenizer import Tokenizer

    f, g, _ = piece_files("whitespace")
    tok = Tokenizer.from_gguf(f)
    ids = {c["text"]: c["ids"] for c in g["cases"]}
    byte = {tok.token_text(i): i for i in range(tok.n_vocab) if tok.token_text(i).startswith("<0x")}
    assert len(ids["a\x1cb\x1dc\x1ed\x1ff"]) == 1 and len(ids["a\u200bb\ufeffc\u180ed"]) == 1
    assert ids["a\u1680b\u2007c\u202fd\u205fe"] == [tok.encode(x, add_bos=False)[0] for x in "abcde"]
    assert ids["€5 5€"] == [byte["<0xE2>"], byte["<0xAC>"], *tok.encode("5 5", add_bos=False),
                           byte["<0xE2>"], byte["<0xAC>"]]
    assert ids["\x00"] == [byte["<0x00>"]] and tok.encode("\x00", add_bos=False) == ids["\x00"]


@pytest.mark.parametrize("model, pre, says", [
    ("whitespace", "gpt-2", r"tokenizer\.ggml\.model is 'whitespace' with tokenizer\.ggml\.pre 'gpt-2'"),
    ("gpt2", "whitespace", r"tokenizer\.ggml\.model is 'gpt2' with tokenizer\.ggml\.pre 'whitespace'.*aborts"),
    ("gpt2", "no-such-pre", r"tokenizer\.ggml\.pre is 'no-such-pre'.*does not implement"),
])
def test_refused_pairs_say_so(tmp_path, model, pre, says):
    from minfer.errors import MinferError
    from minfer.gguf_file import GGUFFile
    from minfer.tokenizer import Tokenizer

    path = write_piece_vocab(["ab"], pre, Path(tmp_path) / "v.gguf", model=model)
    with pytest.raises(MinferError, match=r"v\.gguf: " + says):
        Tokenizer.from_gguf(GGUFFile(path))
