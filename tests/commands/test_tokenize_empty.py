"""`minfer tokenize ""`: an empty text printed nothing at all, which read as a hang or a failure."""

from __future__ import annotations

from minfer import cli


def test_an_empty_text_says_it_has_no_tokens(capsys):
    # SmolLM2 adds no BOS (tokenizer.ggml.add_bos_token false), so "" has no token at all
    assert cli.main(["tokenize", "-m", "smollm2-135m-instruct", ""]) == 0
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == "minfer: 0 tokens (the text is empty)", (out, err)
    assert cli.main(["tokenize", "-m", "smollm2-135m-instruct", "--ids", ""]) == 0
    assert capsys.readouterr().out.strip() == "[]"
    assert cli.main(["tokenize", "-m", "smollm2-135m-instruct", "hi"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1      # a text with a token still lists it
