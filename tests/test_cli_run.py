"""`minfer run`, `minfer chat` and `minfer perplexity` end to end on the real models."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import pytest

from minfer.cli import main

pytestmark = pytest.mark.slow
TEXT = Path(__file__).parent / "models" / "data" / "textwrap_py3117.txt"


def test_run_greedy_golden(capsys):
    """The issue's golden: greedy Qwen2.5-Coder-0.5B says Paris (the exact text is llama.cpp's
    greedy output, tests/models/goldens/qwen2.5-coder-0.5b-instruct.json)."""
    rc = main(["run", "-m", "qwen2.5-coder-0.5b-instruct", "--raw", "--temp", "0", "-n", "16",
               "The capital of France is"])
    out, err = capsys.readouterr()
    assert rc == 0
    assert out == " Paris. Paris is located in the northwestern part of France. The capital of\n"
    assert re.search(r"prompt: 5 tokens .* generated: 16 tokens .* tok/s\) \| finish: length", err)


def test_run_default_model_is_qwen(capsys):
    rc = main(["run", "--raw", "--temp", "0", "-n", "2", "The capital of France is"])
    assert rc == 0 and capsys.readouterr().out.startswith(" Paris.")


def test_run_smollm_chat_answers_sensibly(capsys):
    rc = main(["run", "-m", "smollm2-135m-instruct", "--chat", "--temp", "0", "-n", "40",
               "What is the capital of France?"])
    out, err = capsys.readouterr()
    assert rc == 0 and "Paris" in out
    assert "finish: stop" in err   # ended by its end-of-turn token, not by -n


def test_run_stop_string_and_seed(capsys):
    args = ["run", "-m", "smollm2-135m-instruct", "--raw", "--seed", "5", "-n", "24", "Once upon a time"]
    assert main(args) == 0
    a = capsys.readouterr().out
    assert main(args) == 0
    assert capsys.readouterr().out == a          # same seed, same text
    assert main(["run", "-m", "smollm2-135m-instruct", "--raw", "--temp", "0", "-n", "16", "--stop", "France",
                 "The capital of France is Paris. The capital of"]) == 0
    out, err = capsys.readouterr()
    assert "France" not in out and "finish: stop" in err


def test_run_errors(capsys):
    assert main(["run", "-m", "smollm2-135m-instruct", "--raw", "--ctx", "4", "one two three four five six"]) == 1
    err = capsys.readouterr().err
    assert "the prompt has" in err and "context holds 4" in err and "--ctx" in err
    assert "Traceback" not in err
    assert main(["run", "-m", "smollm2-135m-instruct", "--device", "cuda", "hi"]) == 1
    err = capsys.readouterr().err
    assert "cuda" in err.lower() and "Traceback" not in err


def test_chat_multi_turn_piped(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("What is the capital of France?\n/reset\n"
                                                  "What is 2+2?\n/exit\nnever read\n"))
    rc = main(["chat", "-m", "smollm2-135m-instruct", "--temp", "0", "-n", "30"])
    out = capsys.readouterr().out
    assert rc == 0
    replies = [r for r in out.split("\n") if r.strip()]
    assert "Paris" in replies[0]
    assert "4" in out


def test_perplexity_protocol_output(capsys):
    rc = main(["perplexity", "-m", "smollm2-135m-instruct", "-f", str(TEXT), "-c", "128", "--chunks", "2"])
    out = capsys.readouterr().out
    assert rc == 0
    assert re.search(r"\[1\][\d.]+,\[2\][\d.]+,", out)
    m = re.search(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)", out)
    assert m
    # llama.cpp on the same 2 chunks: tests/models/goldens/smollm2-135m-instruct.json
    import json
    g = json.loads((Path(__file__).parent / "models" / "goldens" / "smollm2-135m-instruct.json").read_text())
    assert float(m.group(1)) == pytest.approx(g["ppl"], rel=0.03)
    assert 0 < float(m.group(2)) < float(m.group(1))


def test_chat_remembers_earlier_turns(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("My name is Ada. Reply with one short sentence.\n"
                                                  "What is my name? Answer with just the name.\n"))
    rc = main(["chat", "--temp", "0", "-n", "30"])
    replies = [r for r in capsys.readouterr().out.split("\n") if r.strip()]
    assert rc == 0 and len(replies) == 2
    assert "Ada" in replies[1]


def test_model_named_first_like_ollama(capsys, monkeypatch, tmp_path):
    """`minfer run MODEL PROMPT` and `minfer chat MODEL` (ollama's order) when MODEL is a catalog
    name or a .gguf file; any other first word keeps argparse's error, which says what MODEL may be."""
    rc = main(["run", "smollm2-135m-instruct", "--raw", "--temp", "0", "-n", "16",
               "The capital of France is Paris. The capital of"])
    out = capsys.readouterr().out
    assert rc == 0
    ref = main(["run", "-m", "smollm2-135m-instruct", "--raw", "--temp", "0", "-n", "16",
                "The capital of France is Paris. The capital of"])
    assert ref == 0 and capsys.readouterr().out == out and out.strip()
    with pytest.raises(SystemExit):
        main(["run", "notamodel", "hi"])
    err = capsys.readouterr().err
    assert "unrecognized arguments: hi" in err and "'notamodel' is neither" in err and "minfer list" in err
    with pytest.raises(SystemExit):                    # -m given: a second positional stays an error
        main(["run", "-m", "smollm2-135m-instruct", "smollm2-135m-instruct", "hi"])
    assert "is neither" not in capsys.readouterr().err
    assert main(["tokenize", "smollm2-135m-instruct", "hello"]) == 0
    assert capsys.readouterr().out.strip() == '28120 "hello"'     # as -m smollm2-135m-instruct hello
    fake = tmp_path / "x.gguf"
    fake.write_bytes(b"not a gguf")
    monkeypatch.setattr(sys, "stdin", io.StringIO("hi\n"))
    assert main(["chat", str(fake)]) == 1               # taken as the model: the file's own error
    err = capsys.readouterr().err
    assert "x.gguf" in err and "unrecognized" not in err and "Traceback" not in err
