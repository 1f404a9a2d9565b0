"""Pre type "gpt-4o" (llama.cpp LLAMA_VOCAB_PRE_TYPE_GPT4O: gpt-oss, Llama 4; tiktoken's o200k).

References, none of them minfer's code:
- llama.cpp's way of running the pattern, re-done here with Python's `re` (not Oniguruma):
  unicode.cpp unicode_regex_split's "collapsed" path, in which every non-ASCII code point of
  the text becomes one byte naming its category (\\xD1 number, \\xD2 letter, \\xD3 punctuation,
  \\xD4 mark, \\xD5 symbol, \\xD0 other, \\x0B whitespace) and each \\p{X} of the regex the class
  of that byte plus its ASCII members; the regex is llama.cpp's, copied from llama-vocab.cpp;
- tiktoken's o200k pattern as HF `tokenizers` runs it for gpt-oss (tokenizer.json: Split
  isolated + ByteLevel without its own regex): the same splits wherever the text has no
  combining mark (llama.cpp's adaptation drops \\p{M} from words: 5 of the 50 texts);
- a byte-level BPE trained by `tokenizers` on the suite texts: minfer's encode() of a GGUF
  holding that vocab with pre "gpt-4o" equals the `tokenizers` tokenizer built with o200k.
Texts: llama.cpp's tokenizer suite (tests/data/tokenizer/llama_cpp_vocab_texts.json).
"""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path

import numpy as np
import pytest

import gguf
from tokenizers import Regex, Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, trainers

from minfer.gguf_file import GGUFFile
from minfer.tokenizer import Tokenizer

TEXTS = json.loads((Path(__file__).resolve().parents[1] / "data" / "tokenizer" /
                    "llama_cpp_vocab_texts.json").read_text())
# llama-vocab.cpp, case LLAMA_VOCAB_PRE_TYPE_GPT4O, the expression it runs
LLAMA_CPP_GPT4O = (
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")  # noqa: E501
# the original (tokenizer.json of gpt-oss / tiktoken o200k_base), quoted in the same place
O200K = (
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")  # noqa: E501

_CAT_BYTE = {"N": "\xd1", "L": "\xd2", "P": "\xd3", "M": "\xd4", "S": "\xd5"}
_CAT_ASCII = {"N": "0-9", "L": "A-Za-z", "P": "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}", "M": "",
              "S": "\\$\\+<->\\^`\\|~"}


def _collapse_text(text: str) -> str:
    out = []
    for ch in text:
        if ord(ch) < 128:
            out.append(ch)
        elif ch.isspace():   # Unicode White_Space above ASCII
            out.append("\x0b")
        else:
            out.append(_CAT_BYTE.get(unicodedata.category(ch)[0], "\xd0"))
    return "".join(out)


def _collapse_regex(rx: str) -> str:
    out, inside, i = [], False, 0
    while i < len(rx):
        c = rx[i]
        if c == "[" and (i == 0 or rx[i - 1] != "\\"):
            inside = True
        elif c == "]" and inside and rx[i - 1] != "\\":
            inside = False
        m = re.match(r"\\p\{(L|N|P|M|S)[a-z]?\}", rx[i:])
        if m:
            body = _CAT_BYTE[m.group(1)] + _CAT_ASCII[m.group(1)]
            out.append(body if inside else f"[{body}]")
            i += m.end()
            continue
        out.append(c)
        i += 1
    return "".join(out)


def llama_cpp_split(text: str) -> list[str]:
    """Pieces as unicode_regex_split_stl cuts them: matches, and the text between them."""
    rx = re.compile(_collapse_regex(LLAMA_CPP_GPT4O), re.ASCII)
    pieces, at = [], 0
    for m in rx.finditer(_collapse_text(text)):
        if m.start() > at:
            pieces.append(text[at:m.start()])
        if m.end() > m.start():
            pieces.append(text[m.start():m.end()])
        at = m.end()
    if at < len(text):
        pieces.append(text[at:])
    return pieces


_BYTE_LEVEL = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)


def byte_level(pieces: list[str]) -> list[str]:
    return [_BYTE_LEVEL.pre_tokenize_str(p)[0][0] for p in pieces]


def o200k_pre() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(O200K), behavior="isolated"), _BYTE_LEVEL])


# mark-free texts on which o200k's rules show (case changes, contractions kept on the word,
# "/" after punctuation, three-digit groups)
EXTRA = ["HelloWorld's CAPSLock I've don'T STOP'LL", "x = a/b;/\n\n  //c", "12345678 3.14159",
         "ПриветМир ÉcoleNormale", "Hello world, it's 2024!\n\n  def f(x): return x/2", "x" * 3000]

SPECIALS = ["<|endoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>",
            "<|call|>", "<|constrain|>"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 700-token byte-level BPE trained on the suite texts, its GGUF (pre "gpt-4o") and the
    `tokenizers` tokenizer of the same vocab/merges with o200k + ByteLevel."""
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = o200k_pre()
    hf.decoder = decoders.ByteLevel()
    hf.train_from_iterator(TEXTS * 3, trainers.BpeTrainer(
        vocab_size=700, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    model = json.loads(hf.to_str())["model"]
    vocab, merges = model["vocab"], [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    tokens = sorted(vocab, key=vocab.get) + SPECIALS
    assert [vocab[t] for t in tokens[:len(vocab)]] == list(range(len(vocab)))
    path = tmp_path_factory.mktemp("gpt4o") / "gpt4o.gguf"
    w = gguf.GGUFWriter(str(path), "gpt-oss")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-4o")
    w.add_token_list(tokens)
    w.add_token_types([1] * len(vocab) + [3] * len(SPECIALS))
    w.add_token_merges(merges)
    w.add_eos_token_id(tokens.index("<|return|>"))
    w.add_tensor("x", np.zeros(1, np.float32))   # a GGUF with no tensor is still fine, but keep one
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ref = HFTokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges]))
    ref.pre_tokenizer = o200k_pre()
    return Tokenizer.from_gguf(GGUFFile(path)), ref, tokens


def minfer_pieces(tok: Tokenizer, text: str) -> list[str]:
    return [p for p, _ in tok._model._hf.pre_tokenizer.pre_tokenize_str(text)]


def test_pieces_equal_llama_cpps_collapsed_regex(trained):
    tok = trained[0]
    assert len(TEXTS) == 50
    for t in TEXTS + EXTRA:
        assert minfer_pieces(tok, t) == byte_level(llama_cpp_split(t)), repr(t)


def test_pieces_equal_o200k_where_no_combining_mark(trained):
    """llama.cpp's adapted regex (and so minfer) equals tiktoken's o200k on every suite text
    but the five with combining marks (decomposed accents, Khmer vowel signs), where o200k keeps
    a mark inside its word and llama.cpp starts a new piece at it."""
    tok, differ = trained[0], []
    ref = o200k_pre()
    for t in TEXTS + EXTRA[:3] + EXTRA[4:]:
        want = [p for p, _ in ref.pre_tokenize_str(t)]
        if minfer_pieces(tok, t) != want:
            differ.append(t)
    assert all(any(unicodedata.category(c).startswith("M") for c in t) for t in differ)
    assert len(differ) == 5 and "re\u0301sume\u0301" in differ and "e\u0301" in differ
    # and a non-ASCII letter is both cases for llama.cpp: no split at a Cyrillic case change
    assert minfer_pieces(tok, "ПриветМир") == byte_level(["ПриветМир"])
    assert [p for p, _ in ref.pre_tokenize_str("ПриветМир")] == byte_level(["Привет", "Мир"])


def test_encode_equals_tokenizers_bpe(trained):
    tok, ref, _ = trained
    n = 0
    for t in TEXTS + EXTRA[:3] + EXTRA[4:]:
        if any(unicodedata.category(c).startswith("M") for c in t):
            continue
        want = ref.encode(t, add_special_tokens=False).ids
        assert tok.encode(t, add_bos=False, parse_special=False) == want, repr(t)
        n += 1
    assert n == 49   # the 44 suite texts without a combining mark, and 5 more
    assert tok.decode(tok.encode("Hello  world\n\tok", add_bos=False)) == "Hello  world\n\tok"


def test_flags_and_harmony_end_of_generation(trained):
    """pre gpt-4o: no BOS, clean_spaces off (llama-vocab.cpp load()). The EOG set of an
    o200k_harmony vocab: <|return|>, <|call|>, <|endoftext|>; <|end|> is not EOG (it ends the
    analysis message, generation goes on) and becomes user-defined; <|channel|>, <|message|>,
    <|start|>, <|constrain|> are user-defined, so they render (llama-vocab.cpp load(): the EOG
    texts, the gpt-oss hack, the o200k_harmony workaround). HF gpt-oss generation_config's
    eos_token_id [200002, 199999, 200012] names the same three tokens."""
    from minfer.tokenizer.vocab import ATTR_USER_DEFINED

    tok, _, tokens = trained
    assert tok.add_bos is False
    assert {tokens[i] for i in tok.eog_ids} == {"<|return|>", "<|call|>", "<|endoftext|>"}
    for t in ("<|end|>", "<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):
        assert tok.token_attr(tokens.index(t)) == ATTR_USER_DEFINED, t
    ids = tok.encode("<|start|>assistant<|channel|>final<|message|>Hi<|end|>", add_bos=False)
    assert ids[0] == tokens.index("<|start|>") and ids[-1] == tokens.index("<|end|>")
    assert tok.decode(ids, skip_special=True) == "<|start|>assistant<|channel|>final<|message|>Hi<|end|>"
