"""A new user's first hour with the `minfer` command line: the mistakes they make (a typo'd model
name, an impossible flag, a directory where a file goes) each get one line naming what is wrong
and, where it can, what was meant -- never a traceback or a silently different run. The tiny
synthetic model stands in for a real one."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers_cli import one_error_line, write_tiny_model

from minfer import cli


@pytest.mark.parametrize("typed,meant", [
    ("smolm2-135m-instruct", "smollm2-135m-instruct"),   # a letter dropped
    ("smollm2-135m", "smollm2-135m-instruct"),           # the start of a name
    ("qwen", "qwen2.5-coder-0.5b-instruct"),
    ("Qwen2.5-Coder-0.5B-Instruct", "qwen2.5-coder-0.5b-instruct"),
    ("smolm2", "smollm2-135m-instruct"),
])
def test_a_mistyped_model_name_suggests_the_catalog_name(capsys, typed, meant):
    for argv in (["run", "-m", typed, "hi"], ["inspect", typed], ["pull", typed]):
        line = one_error_line(capsys, argv)
        assert line.startswith("minfer: error: ") and f"Did you mean {meant}?" in line, line
    # named first, `ollama run` style: argparse's error carries the same hint
    line = one_error_line(capsys, ["run", typed, "hi"], rc=2)
    assert f"Did you mean {meant}?" in line, line


@pytest.mark.parametrize("typed", ["nope", "llama", "/no/such/dir/model.gguf"])
def test_no_suggestion_when_nothing_is_close(capsys, typed):
    line = one_error_line(capsys, ["run", "-m", typed, "hi"])
    assert "no such file" in line and "Did you mean" not in line, line


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The synthetic tiny model, written once for this module."""
    return write_tiny_model(tmp_path_factory.mktemp("fh"))


def test_perplexity_bad_inputs_are_one_line_before_the_load(capsys, tmp_path, tiny):
    text = tmp_path / "t.txt"
    text.write_text("hello world " * 200)
    # --chunks 0 used to reach a division by zero after scoring nothing; it is checked before the
    # model is even looked for (the model named here does not exist)
    line = one_error_line(capsys, ["perplexity", "-m", "/no/model.gguf", "-f", str(text), "--chunks", "0"])
    assert "--chunks 0" in line, line
    line = one_error_line(capsys, ["perplexity", "-m", tiny, "-f", str(tmp_path)])
    assert "a directory" in line and str(tmp_path) in line, line
    line = one_error_line(capsys, ["perplexity", "-m", tiny, "-f", str(tmp_path / "none.txt")])
    assert "no such file" in line, line
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9 " * 100)
    line = one_error_line(capsys, ["perplexity", "-m", tiny, "-f", str(tmp_path / "latin1.txt")])
    assert "not UTF-8" in line and "byte 3" in line, line


def test_perplexity_negative_chunks_mean_all_as_llama_perplexity(capsys, tmp_path, tiny):
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    assert cli.main(["perplexity", "-m", tiny, "--device", "cpu", "-f", str(text), "-c", "64",
                     "--chunks", "-5"]) == 0
    out, err = capsys.readouterr()
    n = int(err.split(" tokens, ")[1].split(" chunks")[0])
    assert n >= 2 and f"[{n}]" in out and "Final estimate: PPL = " in out, (out, err)


def test_synth_into_a_directory_or_under_a_file_is_one_line(capsys, tmp_path):
    line = one_error_line(capsys, ["synth", str(tmp_path), "--preset", "tiny", "--no-progress"])
    assert "a directory" in line and str(tmp_path / "model.gguf") in line, line
    line = one_error_line(capsys, ["synth", str(tmp_path / "x.gguf"), "--preset", "tiny", "--seed", "-1"])
    assert "--seed -1: expected an integer in 0..2**63-1" in line, line   # was numpy's ValueError
    (tmp_path / "f").write_text("")
    line = one_error_line(capsys, ["synth", str(tmp_path / "f" / "x.gguf"), "--preset", "tiny", "--no-progress"])
    assert line.startswith("minfer: error: ") and "cannot write" in line, line


@pytest.mark.parametrize("name", [name for name, _ in cli.COMMANDS])
def test_every_help_explains_with_examples_and_prints_clean_text(capsys, name):
    with pytest.raises(SystemExit) as e:
        cli.main([name, "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    assert "example" in out.lower(), out[:300]
    assert f"minfer {name} " in out.split("options:")[0].split("\n", 1)[1], "no example of the command itself"
    # a description is printed as is: an escape such as \x1b written unescaped in its source
    # would reach the terminal as a control character (inspect's did)
    assert not [hex(ord(c)) for c in out if ord(c) < 32 and c != "\n"]


@pytest.mark.parametrize("flags,expect", [
    (["--kv-memory", "8G"], "--kv-memory applies to the batched table only"),   # was ignored
    (["--dense-planes", "off"], "--dense-planes applies to the batched table only"),
    (["--ab", "MINFER_GEMV='1", "MINFER_GEMV=0"], "not shell words (No closing quotation)"),   # was shlex's ValueError
])
def test_bench_flags_without_parallel_are_refused_before_the_load(capsys, flags, expect):
    line = one_error_line(capsys, ["bench", "-m", "/no/model.gguf", "-p", "8", "-n", "0", *flags])
    assert expect in line, line


def test_bench_sizes_and_out_are_checked_before_measuring(capsys, tmp_path):
    # a size that is not one: argparse's usage error at once (was read only with --parallel)
    line = one_error_line(capsys, ["bench", "--parallel", "1", "--kv-memory", "lots"], rc=2)
    assert "--kv-memory" in line and "lots" in line, line
    line = one_error_line(capsys, ["bench", "--parallel", "1", "--kv-memory", "0"], rc=2)
    assert "above 0" in line, line
    # --out a directory: refused before the model is looked for, not after the whole run
    line = one_error_line(capsys, ["bench", "-m", "/no/model.gguf", "-p", "8", "--out", str(tmp_path)])
    assert "a directory" in line and str(tmp_path / "run.json") in line, line


@pytest.mark.parametrize("flags,expect", [
    (["-np", "-2"], "-np/--parallel -2"),      # was refused only by the background load, after start
    (["--served-name", ""], "--served-name is empty"),
    (["--alias", "gpt-4", "--alias", " "], "--alias is empty"),
    # browsers send Origin as scheme://host[:port]: these never matched, and nothing said so
    (["--cors", "localhost:3000"], "--cors 'localhost:3000': expected an origin"),
    (["--cors", "http://example.com/"], "--cors 'http://example.com/': expected an origin"),
])
def test_serve_flags_are_checked_before_the_model(capsys, flags, expect):
    line = one_error_line(capsys, ["serve", "-m", "/no/model.gguf", *flags])
    assert expect in line, line


def test_serve_kv_memory_without_parallel_warns(capsys, tiny):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert cli.main(["serve", "-m", tiny, "--device", "cpu", "--port", str(port), "--kv-memory", "1G"]) == 1
    err = capsys.readouterr().err
    assert "warning: --kv-memory" in err and "changes nothing" in err, err
    assert err.strip().splitlines()[-1].startswith("minfer: error: cannot listen"), err


def test_more_threads_than_cpus_are_cut_with_a_warning(capsys, tiny):
    import torch

    from minfer.commands.common import usable_cpus

    before = torch.get_num_threads()
    try:
        # -t 1000 on 2 CPUs used to load for minutes (torch woke 1000 threads per parallel region)
        assert cli.main(["run", "-m", tiny, "--device", "cpu", "-t", "4099", "--raw", "-n", "1",
                         "--temp", "0", "hi"]) == 0
        err = capsys.readouterr().err
        assert torch.get_num_threads() == usable_cpus()
        assert err.count("warning: -t/--threads 4099") == 1 and f"using {usable_cpus()}" in err, err
    finally:
        torch.set_num_threads(before)


class _Stdin:
    """Standard input holding `data`, a terminal or a pipe."""

    def __init__(self, data: bytes, tty: bool):
        import io

        self.buffer, self._tty = io.BytesIO(data), tty

    def isatty(self) -> bool:
        return self._tty


@pytest.mark.parametrize("argv,stdin,src", [
    (["", "--chat"], b"", "PROMPT gave no text"),
    (["-p", ""], b"", "-p gave no text"),
    (["--chat"], b"", "standard input gave no text"),      # `minfer run < /dev/null`
    (["-"], b" \n\t\n", "standard input gave only white space"),
    (["--raw"], b"", "standard input gave no text"),
])
def test_an_empty_prompt_is_an_error_not_an_answer_to_nothing(capsys, monkeypatch, tiny, argv, stdin, src):
    # the tiny model has no chat template; --chat gives it ChatML, as a chat model would get its own.
    # Before, an empty chat message was answered (the model made something up).
    monkeypatch.setattr("sys.stdin", _Stdin(stdin, tty=False))
    line = one_error_line(capsys, ["run", "-m", tiny, "--device", "cpu", "-n", "1", *argv])
    assert "the prompt is empty" in line and src in line, line


def test_raw_white_space_is_a_prompt(capsys, tiny):
    assert cli.main(["run", "-m", tiny, "--device", "cpu", "--raw", "-n", "1", "--temp", "0", " "]) == 0
    assert "prompt: 1 tokens" in capsys.readouterr().err


def test_reading_the_prompt_from_a_terminal_says_so(capsys, monkeypatch, tiny):
    # `minfer run -m MODEL` typed alone used to wait for stdin in silence
    monkeypatch.setattr("sys.stdin", _Stdin(b"hello", tty=True))
    assert cli.main(["run", "-m", tiny, "--device", "cpu", "--raw", "-n", "1", "--temp", "0"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("minfer: reading the prompt from standard input; end it with Ctrl-D"), err
    monkeypatch.setattr("sys.stdin", _Stdin(b"hello", tty=False))   # piped: nothing to say
    assert cli.main(["run", "-m", tiny, "--device", "cpu", "--raw", "-n", "1", "--temp", "0"]) == 0
    assert "reading the prompt" not in capsys.readouterr().err


def test_seed_minus_one_is_a_fresh_seed_as_in_llama_cpp(capsys, tiny):
    from minfer.commands.run import sampling_from_args

    args = cli.build_parser().parse_args(["run", "-s", "-1", "x"])
    assert sampling_from_args(args).seed is None
    argv = ["run", "-m", tiny, "--device", "cpu", "--raw", "-n", "12", "--temp", "1.5", "--top-k", "0",
            "--top-p", "1", "--min-p", "0", "hi"]
    outs = []
    for seed in ("5", "5", "-1", "-1", "-1"):
        assert cli.main(argv + ["-s", seed]) == 0
        outs.append(capsys.readouterr().out.encode("utf-8", "surrogateescape"))
    assert outs[0] == outs[1]
    assert len(set(outs[2:])) > 1, outs   # was the same text each run (the literal seed -1)


@pytest.mark.parametrize("schema,expect", [
    ("[1]", "--json-schema: a JSON schema is an object, got list"),   # was "[1]: cannot read the file"
    ('"x"', "--json-schema: a JSON schema is an object, got str"),
    ("no-such-schema.json", "no-such-schema.json: cannot read the JSON schema file"),
    ("{bad", "--json-schema: not valid JSON"),
])
def test_json_schema_mistakes_name_what_is_wrong(capsys, schema, expect):
    # checked before the model is looked for (the model named here does not exist)
    line = one_error_line(capsys, ["run", "-m", "/no/model.gguf", "-j", schema, "hi"])
    assert expect in line, line


def test_an_unusable_minfer_home_is_one_line_before_any_download(capsys, monkeypatch, tmp_path):
    home = tmp_path / "home"
    home.write_text("a file, not a folder")
    monkeypatch.setenv("MINFER_HOME", str(home))
    # pull refuses before it runs pip (was a NotADirectoryError traceback from mkdir)
    line = one_error_line(capsys, ["pull", "smollm2-135m-instruct"])
    assert "the models folder cannot be created" in line and f"MINFER_HOME={home}" in line, line


def _gguf(path, arch):
    """A GGUF with one tensor and too little metadata to run (gguf's own writer)."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(2)
    w.add_context_length(128)
    w.add_embedding_length(8)
    w.add_tensor("token_embd.weight", np.zeros((16, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


@pytest.mark.parametrize("arch,expect", [("t5", "architecture 't5' is not supported"),
                                         ("llama", "'llama.attention.head_count' is missing")])
def test_bench_on_a_model_it_cannot_run_is_one_line(capsys, tmp_path, arch, expect):
    # was a TypeError traceback from the bench's parameter count (int(None))
    path = _gguf(tmp_path / f"{arch}.gguf", arch)
    line = one_error_line(capsys, ["bench", "-m", path, "--device", "cpu", "-p", "8", "-n", "0", "-r", "1"])
    assert line.startswith(f"minfer: error: {path}: ") and expect in line, line


@pytest.mark.parametrize("argv,expect", [
    (["tokenize", "-m", "{tiny}", "\udcffx"], "TEXT has byte 0xff"),
    (["run", "-m", "{tiny}", "--device", "cpu", "-sys", "a\udcff", "hi"], "-sys/--system-prompt has byte 0xff"),
    (["chat", "-m", "{tiny}", "--device", "cpu", "-sys", "\udcff"], "-sys/--system-prompt has byte 0xff"),
])
def test_invalid_utf8_arguments_are_one_line(capsys, monkeypatch, tiny, argv, expect):
    # bytes of argv that are not UTF-8 reach Python as lone surrogates; the tokenizer raised a
    # TypeError on them ("TextEncodeInput must be Union[...]")
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    line = one_error_line(capsys, [a.replace("{tiny}", tiny) for a in argv])
    assert expect in line, line


def test_tokenize_stdin_is_checked_utf8_and_taken_as_is(capsys, monkeypatch, tiny):
    monkeypatch.setattr("sys.stdin", _Stdin(b"caf\xe9", tty=False))
    line = one_error_line(capsys, ["tokenize", "-m", tiny, "-f", "-"])
    assert "not UTF-8" in line and "byte 3" in line, line
    monkeypatch.setattr("sys.stdin", _Stdin(b"a\r\nb", tty=False))
    assert cli.main(["tokenize", "-m", tiny, "-f", "-", "--no-bos"]) == 0
    out = capsys.readouterr().out
    # "taken as is", as for a file: the \r survives (text-mode stdin turned \r\n into \n)
    assert "\\r" in out, out


def test_chat_n0_is_refused_as_its_message_says(capsys, tiny):
    line = one_error_line(capsys, ["chat", "-m", tiny, "--device", "cpu", "-n", "0"])
    assert "-n/--n-predict 0: expected a number of tokens >= 1, or -1" in line, line


@pytest.mark.parametrize("word,expect", [
    ("serv", "Did you mean `minfer serve`?"),
    ("inpsect", "Did you mean `minfer inspect`?"),
    ("smollm2-135m-instruct", "`minfer run smollm2-135m-instruct PROMPT` or `minfer chat smollm2-135m-instruct`"),
    ("xyz", "invalid choice: 'xyz'"),      # nothing close: argparse's own list of commands
])
def test_an_unknown_command_says_what_was_meant(capsys, word, expect):
    line = one_error_line(capsys, [word, "hi"], rc=2)
    assert line.startswith("minfer: error: ") and expect in line, line


def test_bench_refuses_a_test_whose_kv_cache_cannot_fit_before_the_load(capsys, monkeypatch, tiny):
    from minfer.commands import preflight

    # 1 MiB "available": the tiny model's KV cache (4 layers) holds a few hundred positions in it
    monkeypatch.setattr(preflight, "available_bytes", lambda device: 1 << 20)
    line = one_error_line(capsys, ["bench", "-m", tiny, "--device", "cpu", "-p", "100000", "-n", "0", "-r", "1"])
    assert "-p/-n/-d: the longest test needs a context of 100001 tokens" in line and "fit" in line, line
    line = one_error_line(capsys, ["bench", "-m", tiny, "--device", "cpu", "-p", "8", "-n", "4",
                                   "-d", "0,50000", "-r", "1"])
    assert "a context of 50009 tokens" in line, line


def test_an_empty_model_name_or_a_directory_is_named_as_such(capsys, tmp_path, tiny):
    import shutil

    line = one_error_line(capsys, ["run", "-m", "", "hi"])   # was ".: not a regular file"
    assert "the model name is empty" in line, line
    line = one_error_line(capsys, ["inspect", str(tmp_path)])
    assert f"{tmp_path}: a directory" in line and "holds no .gguf file" in line, line
    shutil.copy(tiny, tmp_path / "mine.gguf")
    line = one_error_line(capsys, ["run", "-m", str(tmp_path), "hi"])   # the models folder, say
    assert "a directory; a model is one .gguf file (in it: mine.gguf)" in line, line


def test_run_model_alone_is_the_model_not_a_prompt_for_the_default(capsys, monkeypatch, tiny):
    # `minfer run MODEL` (ollama's habit) sent the model's name as a prompt to the default model
    flags = ["--device", "cpu", "--raw", "-n", "1", "--temp", "0"]
    assert cli.main(["run", "-m", tiny, *flags, "hello"]) == 0
    out, err = capsys.readouterr()
    expected = err.strip().splitlines()[-1].split(" in ")[0]   # "prompt: N tokens" of -m tiny hello
    monkeypatch.setattr("sys.stdin", _Stdin(b"hello", tty=True))
    assert cli.main(["run", tiny, *flags]) == 0
    out2, err = capsys.readouterr()
    assert "reading the prompt from standard input" in err and expected in err and out2 == out, err
    args = cli.build_parser().parse_args(["tokenize", tiny])
    assert cli._model_first(args, [], ["tokenize", tiny]) == [] and (args.model, args.text) == (tiny, None)
    args = cli.build_parser().parse_args(["run", "-p", "hi", tiny])   # -p with the model by position
    assert cli._model_first(args, [], ["run", "-p", "hi", tiny]) == [] and (args.model, args.prompt) == (tiny, None)
    # an ordinary one-word prompt stays a prompt
    args = cli.build_parser().parse_args(["run", "hello"])
    cli._model_first(args, [], ["run", "hello"])
    assert args.prompt == "hello" and args.model != "hello"


def test_chat_piped_invalid_utf8_with_a_strict_stdin_is_one_line(tiny):
    import os
    import subprocess
    import sys

    # a UTF-8 locale other than C.UTF-8 gives Python a strict stdin: readline() raised
    # UnicodeDecodeError, a traceback; PYTHONIOENCODING makes this machine's stdin strict too
    env = dict(os.environ, PYTHONIOENCODING="utf-8:strict")
    r = subprocess.run([sys.executable, "-m", "minfer", "chat", "-m", tiny, "--device", "cpu", "-n", "1"],
                       input=b"caf\xe9\n", capture_output=True, env=env, timeout=300)
    err = r.stderr.decode()
    assert r.returncode == 1 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == "minfer: error: the message has byte 0xe9 that is not valid UTF-8 at character 3"



def test_dash_file_reads_stdin_in_run_and_perplexity(capsys, monkeypatch, tmp_path, tiny):
    # `-f -` was opened as a file named '-' ("-: no such file"); tokenize already took it
    text = "the quick brown fox jumps over the lazy dog. " * 40
    (tmp_path / "t.txt").write_text(text)
    ppl = ["perplexity", "-m", tiny, "--device", "cpu", "-c", "64", "--chunks", "2", "-f"]
    assert cli.main(ppl + [str(tmp_path / "t.txt")]) == 0
    from_file = capsys.readouterr().out
    monkeypatch.setattr("sys.stdin", _Stdin(text.encode(), tty=False))
    assert cli.main(ppl + ["-"]) == 0
    assert capsys.readouterr().out == from_file and "Final estimate" in from_file
    run = ["run", "-m", tiny, "--device", "cpu", "--raw", "-n", "2", "--temp", "0"]
    assert cli.main(run + ["hello there"]) == 0
    direct = capsys.readouterr()
    monkeypatch.setattr("sys.stdin", _Stdin(b"hello there", tty=False))
    assert cli.main(run + ["-f", "-"]) == 0
    piped = capsys.readouterr()
    assert piped.out == direct.out and piped.err.split(" in ")[0] == direct.err.split(" in ")[0]


def test_synth_help_names_every_preset(capsys):
    from minfer.bench.presets import PRESETS

    with pytest.raises(SystemExit):
        cli.main(["synth", "--help"])
    described = capsys.readouterr().out.split("Presets:")[1].split("Recipes:")[0]
    assert [p for p in PRESETS if p not in described] == []


@pytest.fixture(scope="module")
def base(tmp_path_factory, tiny) -> Path:
    """The tiny model without its chat template: a base model, like the catalog's gemma-3-270m."""
    from test_fuzz_gguf import serialize, take_apart

    kvs, tensors, data = take_apart(Path(tiny))
    path = tmp_path_factory.mktemp("base") / "base.gguf"
    path.write_bytes(serialize([kv for kv in kvs if kv[0] != "tokenizer.chat_template"], tensors, data))
    return path


def test_a_base_model_says_the_prompt_is_continued_not_answered(capsys, monkeypatch, base, tiny):
    # a question to a base model is continued as text, which looked like a broken answer with
    # nothing said
    flags = ["--device", "cpu", "-n", "1", "--temp", "0", "What is 2+2?"]
    assert cli.main(["run", "-m", str(base), *flags]) == 0
    err = capsys.readouterr().err
    assert err.count("minfer: note: base.gguf has no chat template") == 1, err
    for mode in ("--raw", "--chat"):
        assert cli.main(["run", "-m", str(base), mode, *flags]) == 0
        assert "note:" not in capsys.readouterr().err
    assert cli.main(["run", "-m", tiny, *flags]) == 0   # the tiny model itself has a template
    assert "note:" not in capsys.readouterr().err
    import io

    for model, notes in ((str(base), 1), (tiny, 0)):   # chat says it once, at the start
        monkeypatch.setattr("sys.stdin", io.StringIO("hi\nhello\n"))
        assert cli.main(["chat", "-m", model, "--device", "cpu", "-n", "1"]) == 0
        assert capsys.readouterr().err.count("has no chat template (a base model)") == notes


def test_serve_warns_that_a_base_model_has_no_chat_template(capsys, base, tiny):
    import socket

    for model, warned in ((str(base), True), (tiny, False)):
        with socket.socket() as busy:   # a port in use: serve stops right after its checks
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            rc = cli.main(["serve", "-m", model, "--device", "cpu", "--port", str(busy.getsockname()[1])])
        err = capsys.readouterr().err
        assert rc == 1 and "cannot listen" in err
        assert ("has no chat template (a base model)" in err) == warned, err


def test_an_unsplittable_minfer_pip_args_is_one_line(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("MINFER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MINFER_PIP_ARGS", "--find-links '/my wheels")
    line = one_error_line(capsys, ["pull", "smollm2-135m-instruct"])   # was shlex's ValueError
    assert line.startswith("minfer: error: MINFER_PIP_ARGS=") and "No closing quotation" in line, line
    assert not (tmp_path / "home").exists()   # refused before anything was made


def test_serve_says_when_the_model_is_ready(tiny):
    import socket
    import subprocess
    import sys
    import threading

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([sys.executable, "-m", "minfer", "serve", "-m", tiny, "--device", "cpu",
                          "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    ready = threading.Event()

    def read():
        for line in p.stderr:
            lines.append(line)
            if "model ready" in line:
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        # the startup message says to wait for the load; the "model ready" line used to be dropped
        # (the server's logger had no handler at INFO)
        assert ready.wait(300), "".join(lines)   # hang guard, not a timing assertion
        assert any(line.startswith("minfer: model ready: tiny (context ") for line in lines), lines
    finally:
        p.terminate()
        p.wait(30)


def test_help_as_a_command(capsys):
    # `minfer help` and `minfer help run` (git's and pip's habit) were "invalid choice: 'help'"
    for argv, usage in ((["help"], "usage: minfer [-h]"), (["help", "run"], "usage: minfer run ")):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 0 and capsys.readouterr().out.startswith(usage)


def test_minfer_threads_above_the_cpus_is_cut_for_library_loads(capsys, tiny):
    """Engine.load (the library, not the CLI) cuts MINFER_THREADS to the CPUs it may run on, with
    one warning, as -t is cut (MINFER_THREADS=64 on 2 CPUs took 15.4 s against 3.7 s)."""
    import torch

    from minfer.device import usable_cpus
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    n = torch.get_num_threads()
    try:
        Engine.load(str(tiny), device="cpu", ctx=64, progress=False, switches=Switches(threads=4099))
        assert torch.get_num_threads() == usable_cpus()
        err = capsys.readouterr().err
        assert f"MINFER_THREADS=4099: this process may run on {usable_cpus()} CPUs" in err, err
    finally:
        torch.set_num_threads(n)
