"""`minfer tokenize` and the tokenizer's errors."""

from __future__ import annotations

import json

import gguf
import pytest

from conftest import load_golden
from minfer.cli import main
from minfer.errors import MinferError
from minfer.gguf_file import GGUFFile
from minfer.tokenizer import Tokenizer
from vocab_files import write_vocab_variant

SMOL = "smollm2-135m-instruct"


def _golden_ids(name, text, key="ids"):
    return next(c[key] for c in load_golden(name)["cases"] if c["text"] == text)


def test_cli_ids(capsys):
    assert main(["tokenize", "-m", SMOL, "--ids", "Hello world"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert json.loads(out) == _golden_ids(SMOL, "Hello world")


def test_cli_lines_show_id_and_piece(capsys):
    assert main(["tokenize", "-m", SMOL, "I'm 😀"]) == 0
    lines = capsys.readouterr().out.splitlines()
    ids = _golden_ids(SMOL, "I'm")  # a prefix of the text: same tokens
    assert [int(l.split()[0]) for l in lines[:len(ids)]] == ids
    assert lines[0].split(None, 1)[1] == '"I"'
    assert any("\\x" in l for l in lines)  # the emoji is split into byte pieces


def test_cli_file_keeps_trailing_newline(tmp_path, capsys):
    f = tmp_path / "t.txt"
    text = "def main():\n\tprint('hi')\n\treturn 0\n"
    f.write_text(text, encoding="utf-8")
    assert main(["tokenize", "-m", SMOL, "--ids", "--file", str(f)]) == 0
    assert json.loads(capsys.readouterr().out) == _golden_ids(SMOL, text)


def test_cli_no_special(capsys):
    text = "<|im_start|>user\nHi<|im_end|>\n"
    assert main(["tokenize", "-m", SMOL, "--ids", "--no-special", text]) == 0
    assert json.loads(capsys.readouterr().out) == _golden_ids(SMOL, text, "ids_no_special")


def test_cli_no_bos_on_llama3_vocab(gguf_files, capsys):
    path = str(gguf_files("smollm2-as-llama-bpe").path)
    assert main(["tokenize", "-m", path, "--ids", "Hello"]) == 0
    with_bos = json.loads(capsys.readouterr().out)
    assert with_bos == _golden_ids("smollm2-as-llama-bpe", "Hello")
    assert main(["tokenize", "-m", path, "--ids", "--no-bos", "Hello"]) == 0
    assert json.loads(capsys.readouterr().out) == with_bos[1:]


def test_cli_errors(tmp_path, capsys):
    assert main(["tokenize", "-m", SMOL]) == 1
    assert "no text" in capsys.readouterr().err
    assert main(["tokenize", "-m", SMOL, "--file", str(tmp_path / "missing.txt")]) == 1
    assert "missing.txt" in capsys.readouterr().err
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe\x00")
    assert main(["tokenize", "-m", SMOL, "--file", str(bad)]) == 1
    assert "not UTF-8" in capsys.readouterr().err


def test_unknown_pre_is_refused(gguf_files, tmp_path):
    path = write_vocab_variant(gguf_files(SMOL).metadata, "some-new-pre", tmp_path / "x.gguf")
    with pytest.raises(MinferError, match=r"x\.gguf.*tokenizer\.ggml\.pre is 'some-new-pre'"):
        Tokenizer.from_gguf(GGUFFile(path))


def _tiny(tmp_path, **kv) -> GGUFFile:
    w = gguf.GGUFWriter(str(tmp_path / "tiny.gguf"), "llama")
    for k, v in kv.items():
        if isinstance(v, list):
            w.add_array(k, v)
        else:
            w.add_string(k, v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return GGUFFile(tmp_path / "tiny.gguf")


def test_missing_or_other_tokenizer_models(tmp_path):
    with pytest.raises(MinferError, match=r"tiny\.gguf.*tokenizer\.ggml\.model"):
        Tokenizer.from_gguf(_tiny(tmp_path))
    for model in ("t5", "rwkv", "plamo2"):  # vocab types minfer does not implement
        with pytest.raises(MinferError, match=rf"tiny\.gguf: tokenizer\.ggml\.model is '{model}' "
                                              r"\(tokenizer\.ggml\.pre 'default'\).*does not implement"):
            Tokenizer.from_gguf(_tiny(tmp_path, **{"tokenizer.ggml.model": model,
                                                   "tokenizer.ggml.pre": "default"}))
    with pytest.raises(MinferError, match=r"tiny\.gguf.*tokenizer\.ggml\.pre.*missing"):
        Tokenizer.from_gguf(_tiny(tmp_path, **{"tokenizer.ggml.model": "gpt2",
                                               "tokenizer.ggml.tokens": ["a", "b", "ab"],
                                               "tokenizer.ggml.merges": ["a b"]}))


def test_bad_merge_line(tmp_path):
    f = _tiny(tmp_path, **{"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2",
                           "tokenizer.ggml.tokens": ["a", "b", "ab"],
                           "tokenizer.ggml.merges": ["a b c"]})
    with pytest.raises(MinferError, match=r"merges\[0\]"):
        Tokenizer.from_gguf(f)


def test_decode_out_of_range_id(tokenizers):
    tok = tokenizers(SMOL)
    with pytest.raises(MinferError, match="outside the vocab"):
        tok.decode([tok.n_vocab])
