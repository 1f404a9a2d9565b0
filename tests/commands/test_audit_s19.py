"""Session 19's audit of the CLI as a demanding new user runs it: what --help promises, what a
piped chat does with a slip of the keyboard."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from helpers_cli import write_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("s19"))


def _help(capsys, command: str) -> str:
    from minfer import cli

    with pytest.raises(SystemExit) as e:
        cli.main([command, "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


def _flag_help(text: str, flag: str) -> str:
    """The help of one flag: its line of options and the indented lines under it, unwrapped."""
    lines = text.splitlines()
    i = next(n for n, line in enumerate(lines) if line.strip().startswith(flag))
    block = [lines[i]]
    for line in lines[i + 1:]:
        if not line.startswith(" " * 10):   # the next option ("  -x ...") or a section
            break
        block.append(line)
    return " ".join(" ".join(block).split())


def test_help_states_the_defaults_the_command_uses(capsys):
    # chat's -n help said "(default 256)" and perplexity's -c "the model's trained length": each
    # showed the shared parent's default, while the command used 512
    from minfer import cli

    for command, flag, dest in (("chat", "-n N, --n-predict N", "max_tokens"),
                                ("perplexity", "-c N, --ctx-size N", "ctx")):
        text = _flag_help(_help(capsys, command), flag)
        used = getattr(cli.build_parser().parse_args([command, "-f", "x"] if command == "perplexity" else [command]),
                       dest)
        assert used == 512
        assert f"default {used}" in text, text
        assert "default 256" not in text and "trained length" not in text, text
    # run keeps the parent's defaults, and says so
    run = _help(capsys, "run")
    assert "(default 256)" in _flag_help(run, "-n N, --n-predict N")
    assert "trained length" in _flag_help(run, "-c N, --ctx-size N")


def test_an_unknown_chat_command_is_not_sent_as_a_message(capsys, monkeypatch, tiny):
    # "/rest" (a typo of /reset) went to the model as a user message and the conversation went on
    from minfer import cli
    from minfer.commands import chat as chat_mod

    sent = []
    real_turn = chat_mod.Chat.turn

    def turn(self, text):
        sent.append(text)
        return real_turn(self, text)

    monkeypatch.setattr(chat_mod.Chat, "turn", turn)
    monkeypatch.setattr("sys.stdin", io.StringIO("/rest\nhi\n/clear\n/usr/bin is a path\n/exit\nnot sent\n"))
    assert cli.main(["chat", "-m", tiny, "--device", "cpu", "-n", "1", "--temp", "0"]) == 0
    err = capsys.readouterr().err
    assert sent == ["hi", "/usr/bin is a path"], sent
    assert "unknown command /rest" in err and "/reset" in err, err
    assert "conversation cleared" in err, err   # /clear is /reset, as in ollama and llama-cli


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")
def test_an_output_that_cannot_be_written_is_one_line_not_a_traceback(tiny):
    # `minfer list > /dev/full` (a full disk) and `minfer tokenize ... >&-` printed tracebacks
    for args in (["list"], ["tokenize", "-m", tiny, "hello"], ["inspect", tiny, "--json"]):
        with open("/dev/full", "w") as full:
            r = subprocess.run([sys.executable, "-m", "minfer", *args], stdout=full, stderr=subprocess.PIPE,
                               text=True, timeout=300)
        assert r.returncode == 1, (args, r.stderr)
        assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr
        assert r.stderr.strip().splitlines() == ["minfer: error: cannot write the output: No space left on device"]
    # stdout closed before the start: the text goes nowhere, as into /dev/null
    r = subprocess.run([sys.executable, "-m", "minfer", "tokenize", "-m", tiny, "hello"], stdout=None,
                       stderr=subprocess.PIPE, text=True, timeout=300, preexec_fn=lambda: os.close(1))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr


def test_serve_help_does_not_promise_repeatable_greedy_answers_on_the_int4_cpu(capsys):
    # "send temperature 0 for greedy, repeatable answers": on the CPU's default int4 matrices the
    # same request twice gave two answers (the second reuses the cached prefix, whose last tokens
    # take the decode kernel, not the bf16 prefill); the help says so and how to repeat exactly
    text = " ".join(_help(capsys, "serve").split())
    assert "repeatable answers" not in text
    assert "MINFER_CPU_QUANT=0" in text and "near-tie" in text


def test_every_seed_flag_states_its_default(capsys):
    for command in ("bench", "synth"):
        assert "(default 0)" in _flag_help(_help(capsys, command), "--seed SEED"), command


def test_run_with_a_temperature_below_float32_is_greedy(capsys, tiny):
    # --temp 1e-300 loaded the model, then failed: "the sampling parameters turned the logits into
    # NaN probabilities"
    from minfer import cli

    argv = ["run", "-m", tiny, "--device", "cpu", "-n", "3", "--raw", "-s", "1", "Hello"]
    assert cli.main([*argv, "--temp", "1e-300"]) == 0, capsys.readouterr().err
    tiny_temp = capsys.readouterr().out
    assert cli.main([*argv, "--temp", "0"]) == 0
    assert capsys.readouterr().out == tiny_temp
