"""A demanding new user's first hour with the command line (audit of 2026-12-07): what was wrong,
each pinned.

- `minfer tokenize -m M -` tokenized the text "-"; a lone '-' is standard input (the usual
  convention, and `minfer run -`'s), as `-f -` was. `minfer tokenize MODEL -` and
  `minfer run MODEL -` (the model named first) were refused: "unrecognized arguments: -".
- `minfer chat -p ""` (an unset shell variable) began the chat without a word; it is an error
  naming the flag (an empty line typed at the prompt is skipped, not sent).
- `minfer synth` planned its tensors twice (the free-space check, then the write); once now.
- `minfer synth ""` said ": a directory"; OUT under a file said "File exists"; a write that
  failed part way (a full disk, Ctrl-C) left the part written, and the folders made for it.
- `minfer bench --out ""` said ": a directory"; `--out run.md` wrote the JSON there and then the
  summary over it; --out under a file said "File exists"; a failed write left part of the record.
- usage lines shouted the flags' names as metavars ([--repeat-penalty REPEAT_PENALTY], -r REPETITIONS).
- an empty -f (run, tokenize, perplexity) or -j (run) named no flag: ": cannot read ...", ".: a
  directory".
- a flag of another command (`minfer tokenize --device cpu hi`) read "unrecognized arguments:
  --device hi", as if misspelt; it says which commands take it.
- `minfer bench --seed -1` was a traceback (numpy's ValueError) after the load; --seed with --plot
  was dropped without a word.
"""

from __future__ import annotations

import io
import json

import pytest

from helpers_cli import one_error_line, write_tiny_model
from minfer import cli


class _Stdin:
    """Standard input holding `data`, a terminal or a pipe."""

    def __init__(self, data: bytes, tty: bool = False):
        self.buffer, self._tty = io.BytesIO(data), tty

    def isatty(self) -> bool:
        return self._tty


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("s35"))


@pytest.mark.parametrize("form", ["-m", "first"])
def test_tokenize_a_lone_dash_reads_stdin(capsys, monkeypatch, tiny, form):
    # `-m M -` printed the one token of "-"; `M -` was "unrecognized arguments: -"
    argv = ["tokenize", "-m", tiny, "--ids", "--no-bos", "-"] if form == "-m" else \
        ["tokenize", tiny, "-", "--ids", "--no-bos"]
    monkeypatch.setattr("sys.stdin", _Stdin(b"hello"))
    assert cli.main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    assert cli.main(["tokenize", "-m", tiny, "--ids", "--no-bos", "hello"]) == 0
    assert got == json.loads(capsys.readouterr().out) and len(got) > 1, got


def test_run_model_first_then_a_dash_reads_stdin(capsys, monkeypatch, tiny):
    # `minfer run MODEL -` was "unrecognized arguments: -"
    monkeypatch.setattr("sys.stdin", _Stdin(b"hi"))
    assert cli.main(["run", tiny, "-", "--device", "cpu", "--temp", "0", "-n", "1"]) == 0
    assert "prompt:" in capsys.readouterr().err


def test_tokenize_help_says_a_dash_is_stdin(capsys):
    with pytest.raises(SystemExit):
        cli.main(["tokenize", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "a lone '-' reads standard input" in out, out


@pytest.mark.parametrize("text,got", [("", "no text"), ("  \t", "only white space")])
def test_chat_an_empty_first_message_is_an_error(capsys, monkeypatch, tiny, text, got):
    # was dropped without a word (an unset shell variable: -p "$Q"): the chat began with no message
    monkeypatch.setattr("sys.stdin", _Stdin(b""))
    line = one_error_line(capsys, ["chat", "-m", tiny, "--device", "cpu", "-p", text])
    assert line == (f"minfer: error: -p/--prompt is empty ({got}): give the first message, or leave -p "
                    "out and type it at the prompt"), line


def test_chat_help_says_an_empty_first_message_is_an_error(capsys):
    with pytest.raises(SystemExit):
        cli.main(["chat", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "an empty TEXT is an error" in out, out


def test_synth_plans_its_tensors_once(capsys, monkeypatch, tmp_path):
    # the free-space check planned the tensors, then write_synth planned them again
    import minfer.bench.synth as synth

    calls = []
    real = synth.plan_tensors
    monkeypatch.setattr(synth, "plan_tensors", lambda *a, **k: calls.append(a) or real(*a, **k))
    out = tmp_path / "t.gguf"
    assert cli.main(["synth", str(out), "--preset", "tiny", "--no-progress"]) == 0
    assert len(calls) == 1, calls
    assert capsys.readouterr().out.startswith(f"wrote {out}: tiny (qwen2, 4 layers, recipe q4_k_m), 51 tensors")
    from minfer.gguf_file import GGUFFile

    assert len(GGUFFile(str(out)).tensors) == 51


def test_synth_empty_out_is_named(capsys):
    # was "minfer: error: : a directory; OUT.gguf is the file to write, e.g. model.gguf"
    line = one_error_line(capsys, ["synth", "", "--preset", "tiny", "--no-progress"])
    assert line == "minfer: error: OUT.gguf is empty: give the path of the file to write, e.g. /tmp/model.gguf"


def test_synth_out_under_a_file_names_the_file(capsys, tmp_path):
    # was "cannot write the model file: File exists (x.gguf)"
    (tmp_path / "x.gguf").write_text("a file")
    out = tmp_path / "x.gguf" / "sub" / "m.gguf"
    line = one_error_line(capsys, ["synth", str(out), "--preset", "tiny", "--no-progress"])
    assert line == f"minfer: error: {out}: cannot write the model file: {tmp_path / 'x.gguf'} is a file, not a folder"


@pytest.mark.parametrize("fail", ["disk full", "ctrl-c"])
def test_synth_failing_part_way_leaves_no_partial_file(capsys, monkeypatch, tmp_path, fail):
    # the part written was left there (a file that looked like a model and failed to load), and the
    # folders made for it
    import errno

    import minfer.bench.synth as synth

    real, n = synth.BlockPool.fill, []

    def fill(self, t):
        n.append(t)
        if len(n) == 5:
            if fail == "ctrl-c":
                raise KeyboardInterrupt
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, t)

    monkeypatch.setattr(synth.BlockPool, "fill", fill)
    out = tmp_path / "new" / "deeper" / "m.gguf"
    argv = ["synth", str(out), "--preset", "tiny", "--no-progress"]
    if fail == "ctrl-c":
        assert one_error_line(capsys, argv, rc=130) == "minfer: interrupted"
    else:
        line = one_error_line(capsys, argv)
        assert line == f"minfer: error: {out}: cannot write the model file: No space left on device", line
    assert len(n) == 5 and not out.exists() and not (tmp_path / "new").exists()


def test_synth_failing_before_writing_keeps_the_file_there(capsys, monkeypatch, tmp_path):
    # the file being overwritten goes only when the write has reached it
    import minfer.bench.synth as synth

    out = tmp_path / "m.gguf"
    out.write_bytes(b"the old file")

    def arch_metadata(p):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(synth, "arch_metadata", arch_metadata)
    one_error_line(capsys, ["synth", str(out), "--preset", "tiny", "--no-progress"])
    assert out.read_bytes() == b"the old file"


@pytest.mark.parametrize("out,expect", [
    ("", "--out is empty: give the JSON file to write, e.g. bench/results/run.json"),
    ("{d}/run.md", "--out {d}/run.md: --out names the JSON file, and its .md summary is written beside it; "
                   "give {d}/run.json"),
    ("{d}/f.txt/run.json", "--out {d}/f.txt/run.json: cannot create its folder: {d}/f.txt is a file, not a folder"),
])
def test_bench_out_refused_before_measuring(capsys, tmp_path, tiny, out, expect):
    # "" was ": a directory"; FILE.md got the JSON, then the summary over it; under a file it was
    # "cannot create its folder: File exists"
    (tmp_path / "f.txt").write_text("a file")
    d = str(tmp_path)
    line = one_error_line(capsys, ["bench", "-m", tiny, "--device", "cpu", "-p", "4", "-n", "0", "-r", "1",
                                   "--no-progress", "--out", out.replace("{d}", d)])
    assert line == "minfer: error: " + expect.replace("{d}", d), line


def test_bench_out_failing_part_way_leaves_no_partial_record(capsys, monkeypatch, tmp_path, tiny):
    # a full disk while writing FILE.md left FILE.json and part of FILE.md
    import builtins
    import errno

    real_open = builtins.open

    class Full:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.f.close()

        def write(self, text):
            self.f.write(text[:10])
            raise OSError(errno.ENOSPC, "No space left on device")

    def fake_open(path, mode="r", *a, **k):
        f = real_open(path, mode, *a, **k)
        return Full(f) if str(path).endswith(".md") and "w" in mode else f

    monkeypatch.setattr(builtins, "open", fake_open)
    out = tmp_path / "run.json"
    line = one_error_line(capsys, ["bench", "-m", tiny, "--device", "cpu", "-p", "4", "-n", "0", "-r", "1",
                                   "--no-progress", "--out", str(out)])
    assert "No space left on device" in line, line
    assert not out.exists() and not out.with_suffix(".md").exists()


def test_every_option_is_explained_with_a_short_metavar():
    # the usage lines read [--repeat-penalty REPEAT_PENALTY] [--frequency-penalty FREQUENCY_PENALTY]
    # [-r REPETITIONS] [--api-key API_KEY] ...: the flag's name again, shouted
    import argparse

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, p in sub.choices.items():
        for a in p._actions:
            assert a.help, (name, a.option_strings or a.dest)
            shouted = a.option_strings and a.metavar is None and a.choices is None and a.nargs != 0 \
                and "_" in a.dest
            assert not shouted, (name, a.option_strings, a.dest.upper())


@pytest.mark.parametrize("argv,expect", [
    (["run", "--device", "cpu", "-f", ""], "-f/--file is empty: give the prompt's file, or - for standard input"),
    (["run", "--device", "cpu", "-j", "", "hi"], "-j/--json-schema is empty: give a JSON schema file, or the "
                                                 "schema itself ('{}': any JSON)"),
    (["tokenize", "-f", ""], "-f/--file is empty: give the text's file, or - for standard input"),
    (["perplexity", "--device", "cpu", "-f", ""], "-f/--file is empty: give the text file to score, or - for "
                                                  "standard input"),
    (["perplexity", "--device", "cpu", "-f", "x.txt", "-c", "0"], "-c/--ctx-size 0: expected at least 4 tokens "
                                                                  "a chunk"),
])
def test_an_empty_file_flag_is_named(capsys, tiny, argv, expect):
    # an unset shell variable: "-f ''" was ": cannot read the prompt file: No such file or directory",
    # perplexity's ".: a directory, not a text file"; -c 0 was "-c must be at least 4, got 0"
    line = one_error_line(capsys, [*argv, "-m", tiny])
    assert line == "minfer: error: " + expect, line


@pytest.mark.parametrize("argv,expect", [
    (["tokenize", "-m", "{tiny}", "--device", "cpu", "hi"],
     "unrecognized arguments: --device hi (--device is a flag of `minfer run`, `minfer chat`, `minfer serve`, "
     "`minfer bench`, `minfer perplexity`, `minfer embed`, `minfer rerank`, not of `minfer tokenize`, which loads no "
     "model onto a device)"),
    (["list", "--force"], "unrecognized arguments: --force (--force is a flag of `minfer pull`, not of `minfer list`)"),
    (["run", "--bogus", "x"], "unrecognized arguments: --bogus"),
])
def test_a_flag_of_another_command_says_whose_it_is(capsys, tiny, argv, expect):
    # `minfer tokenize --device cpu hi` read "unrecognized arguments: --device hi", as if misspelt
    line = one_error_line(capsys, [a.replace("{tiny}", tiny) for a in argv], rc=2)
    assert line == f"minfer {argv[0]}: error: {expect}", line


@pytest.mark.parametrize("seed", ["-1", str(2**63)])
def test_bench_seed_out_of_range_is_one_line(capsys, tiny, seed):
    # was numpy's "ValueError: expected non-negative integer", a traceback after the model's load
    line = one_error_line(capsys, ["bench", "-m", tiny, "--device", "cpu", "-p", "4", "-n", "0", "-r", "1",
                                   "--no-progress", "--seed", seed])
    assert line == f"minfer: error: --seed {seed}: expected an integer in 0..2**63-1", line


def test_bench_plot_refuses_seed(capsys, tmp_path):
    # --seed with --plot was dropped without a word, as the other measurement flags were (s34)
    line = one_error_line(capsys, ["bench", "--plot", str(tmp_path), "--seed", "3"])
    assert line.startswith("minfer: error: --seed applies to a measurement; --plot only plots"), line
